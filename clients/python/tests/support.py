"""The real parts the integration tests run against, and the helpers they share.

- `Redis`: a throwaway `redis-server` on a free port, without persistence.
- `Node`: the real `pinboard serve`, configured by environment only, its log in a file.
- `FaultProxy`: a small HTTP proxy in the test process in front of a node's registry routes; it
  forwards every call, records it (request and answer), and can be told to answer a given
  status for a given `/registry/<route>`, or to drop the connection, N times.
- `WorkerProcess`: `tests/apps.py` (a Starlette or FastAPI app behind `worker.asgi(app)`)
  served by uvicorn in a subprocess, on a listening socket made here and passed down.

Attestations are minted with PyJWT, a JWT implementation independent of the library's.

Every process started here is killed when its fixture ends, and at interpreter exit whatever
a fixture could not reach.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import jwt

REPO = Path(__file__).resolve().parents[3]


def shared_inputs(name: str) -> list[str]:
    """One of the hostile-input lists the Rust library's tests read too (pinned/tests/data)."""
    loaded: list[str] = json.loads((REPO / "pinned" / "tests" / "data" / name).read_text())
    return loaded


APPS = Path(__file__).resolve().parent / "apps.py"
SECRET = "pinned-python-tests-hs256-secret-0123456789"
"""The node's Passport HS256 secret (at least 32 bytes)."""
LEASE_MS = 3000
SHARDS = 16
ACCOUNT = "acct-python"
PREFIX = "pinboard:"

T = TypeVar("T")

_live: list[subprocess.Popen[bytes]] = []


def _kill_all() -> None:
    for proc in _live:
        _kill(proc)


atexit.register(_kill_all)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _spawn(
    args: list[str],
    env: Mapping[str, str],
    log: Path,
    pass_fds: Iterable[int] = (),
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=tuple(pass_fds),
        )
    _live.append(proc)
    return proc


def eventually(
    check: Callable[[], T | Literal[False] | None],
    timeout: float = 15.0,
    what: str | Callable[[], str] = "condition",
    interval: float = 0.05,
) -> T:
    """Polls `check` until it returns something truthy (returned), or fails after `timeout`
    seconds saying `what` (a string, or a function for one computed only then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout} s: {said}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"({path} not written)"
    return "\n".join(text.splitlines()[-lines:])


# --- the pinboard binary and credentials ------------------------------------------------------


class MissingBinary(RuntimeError):
    pass


@functools.cache
def pinboard_bin() -> Path:
    """`$PINBOARD_BIN`, else cargo's `target_directory` + `/debug/pinboard`."""
    build = "run `cargo build -p pinboard` first (or set PINBOARD_BIN)"
    given = os.environ.get("PINBOARD_BIN")
    if given:
        if not Path(given).is_file():
            raise MissingBinary(f"PINBOARD_BIN={given} is not a file: {build}")
        return Path(given)
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        target = Path(json.loads(out.stdout)["target_directory"])
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        raise MissingBinary(f"cannot locate the pinboard binary ({e}): {build}") from None
    binary = target / "debug" / "pinboard"
    if not binary.is_file():
        raise MissingBinary(f"no pinboard binary at {binary}: {build}")
    return binary


@functools.cache
def token(sub: str, scope: str) -> str:
    """A credential for account `sub` with `scope`, on every namespace, for loopback
    backends, minted by `pinboard token`."""
    out = subprocess.run(
        [
            str(pinboard_bin()),
            "token",
            "--secret",
            SECRET,
            "--sub",
            sub,
            "--scope",
            scope,
            "--ns",
            "*",
            "--backend-host",
            "127.0.0.1",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


def worker_token(sub: str = ACCOUNT) -> str:
    return token(sub, "pinboard:worker")


def passport_token(exp: float, sub: str = ACCOUNT, scope: str = "pinboard:worker") -> str:
    """What `token` mints, expiring at `exp` (seconds since the Unix epoch; the node allows 30 s
    past it), signed by PyJWT: a short-lived credential."""
    claims = {
        "sub": sub,
        "scope": scope,
        "iat": int(time.time()),
        "exp": int(exp),
        "pinboard": {"namespaces": ["*"], "allowedBackendHosts": ["127.0.0.1"]},
    }
    return jwt.encode(claims, SECRET.encode(), algorithm="HS256")


def operator_token(sub: str = ACCOUNT) -> str:
    return token(sub, "pinboard:operator")


# --- Redis ---------------------------------------------------------------------------------


class Redis:
    """A `redis-server` of its own in `directory`, no persistence."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.log = directory / "redis.log"
        last = ""
        for _ in range(5):
            self.port = free_port()
            args = [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
            ]
            self.proc = _spawn(args, os.environ, self.log)
            try:
                eventually(self._answers, 10, "redis-server answering PING")
                return
            except AssertionError as e:
                last = f"{e}\n{tail(self.log)}"
                _kill(self.proc)
        raise RuntimeError(f"redis-server did not start: {last}")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError("redis-server exited")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        """`redis-cli` against this server: its trimmed output."""
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        assert out.returncode == 0, f"redis-cli {args}: {out.stdout} {out.stderr}"
        return out.stdout.strip()

    def stop(self) -> None:
        _kill(self.proc)

    # The node's keys, as it names them by default (contract §5, §7).

    def end_cold_start(self) -> None:
        """Ends the registry's cold start in every bucket: a bucket's window runs one lease
        from its `boot_time`, set here to the Unix epoch before any request sets it."""
        for bucket in range(SHARDS):
            self.cli("SET", f"{PREFIX}{{{bucket}}}:boot_time", "0")

    def row(self, ns: str, id: str) -> dict[str, Any] | None:
        raw = self.cli("HGET", placements_key(ns, id), id)
        if not raw:
            return None
        value: dict[str, Any] = json.loads(raw)
        return value

    def set_row(self, ns: str, id: str, row: Mapping[str, Any]) -> None:
        self.cli("HSET", placements_key(ns, id), id, json.dumps(row))

    def session_record(self, session: str) -> str:
        return self.cli("HGET", sessions_key(), session)

    def drop_session(self, session: str) -> None:
        """Deletes the session's master record: the registry no longer knows it."""
        assert self.cli("HDEL", sessions_key(), session) == "1"


def bucket_of(id: str) -> int:
    """The first 8 hex digits of sha256(id), as an integer, mod the shard count."""
    return int(hashlib.sha256(id.encode()).hexdigest()[:8], 16) % SHARDS


def placements_key(ns: str, id: str) -> str:
    return f"{PREFIX}{{{bucket_of(id)}}}:default:{ns}:placements"


def wake_key(ns: str, id: str) -> str:
    return f"{PREFIX}{{{bucket_of(id)}}}:default:{ns}:wake"


def sessions_key() -> str:
    return f"{PREFIX}{{r}}:sessions"


# --- the node --------------------------------------------------------------------------------

_LISTENING = re.compile(r"pinboard listening .*addr=(\S+)")


class Node:
    """`pinboard serve` on `redis_url`, listening on `listen` (`127.0.0.1:0`: a port the
    kernel picks, read from its log), with the lease TTL of these tests and `env` over that.
    Returns once `/readyz` answers 200."""

    def __init__(
        self,
        redis_url: str,
        log: Path,
        env: Mapping[str, str] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> None:
        self.log_path = log
        settings = {k: v for k, v in os.environ.items() if not k.startswith("PINBOARD_")}
        settings.update(
            {
                "PINBOARD_LISTEN": listen,
                "PINBOARD_REDIS_URL": redis_url,
                "PINBOARD_PASSPORT__HS256_SECRET": SECRET,
                "PINBOARD_LEASE_TTL_MS": str(LEASE_MS),
                "NO_COLOR": "1",
            }
        )
        settings.update(env or {})
        self.proc = _spawn([str(pinboard_bin()), "serve"], settings, log)
        self.addr = eventually(self._listening, 20, lambda: f"pinboard listening\n{self.log()}")
        self.url = f"http://{self.addr}"
        self.client = httpx.Client(base_url=self.url, timeout=10, trust_env=False)
        eventually(self._ready, 20, lambda: f"pinboard ready\n{self.log()}")

    def _listening(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"pinboard exited {self.proc.returncode}:\n{self.log()}")
        found = _LISTENING.search(self.log())
        return found.group(1) if found else None

    def _ready(self) -> bool:
        # Each core has its own Redis connection and connections land on cores at random.
        try:
            return all(self.client.get("/readyz").status_code == 200 for _ in range(6))
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.client.get(path, **kw)

    def post(self, path: str, body: Any, bearer: str) -> httpx.Response:
        return self.client.post(path, json=body, headers={"authorization": f"Bearer {bearer}"})

    def place(self, path: str) -> httpx.Response:
        """`GET path` through the node until it is served (a fresh worker may not be a
        candidate for a moment): the 200."""
        last: list[httpx.Response] = []

        def served() -> httpx.Response | None:
            reply = self.get(path)
            last[:] = [reply]
            return reply if reply.status_code == 200 else None

        return eventually(
            served, 15, lambda: f"{path} served: {last and last[0].text}\n{tail(self.log_path)}"
        )

    def heartbeat(self, session: str) -> httpx.Response:
        """A heartbeat for `session`, sent by the test itself."""
        body = {
            "sessionId": session,
            "headroom": 1,
            "draining": False,
            "challenge": "c",
            "challengeValue": "v",
        }
        return self.post("/registry/heartbeat", body, worker_token())

    def kill(self) -> None:
        _kill(self.proc)
        self.client.close()

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)


# --- the fault proxy -------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A registry call the proxy saw: the request body and the bearer token it carried, and
    what it answered (`status` None when it dropped the connection), and whether the answer
    was injected."""

    route: str
    body: Any
    bearer: str | None
    status: int | None
    answer: Any
    injected: bool
    at: float


@dataclass
class _Rule:
    status: int | None
    body: Any
    times: int | None


class FaultProxy:
    """Forwards `/registry/*` (any path) to `upstream`, recording every call; `fail` and
    `drop` make it answer a route itself instead."""

    def __init__(self, upstream: str) -> None:
        target = urllib.parse.urlsplit(upstream)
        assert target.hostname and target.port
        self._upstream = (target.hostname, target.port)
        self._lock = threading.Lock()
        self._rules: dict[str, _Rule] = {}
        self._calls: list[Call] = []
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(
        self, route: str, status: int = 503, body: Any = None, times: int | None = None
    ) -> None:
        """Answers `route` with `status` and `body` (JSON), `times` times (None: until
        cleared)."""
        answer = body if body is not None else {"error": "injected fault"}
        with self._lock:
            self._rules[route] = _Rule(status, answer, times)

    def drop(self, route: str, times: int | None = None) -> None:
        """Closes the connection of a call to `route` without answering."""
        with self._lock:
            self._rules[route] = _Rule(None, None, times)

    def clear(self, route: str | None = None) -> None:
        with self._lock:
            if route is None:
                self._rules.clear()
            else:
                self._rules.pop(route, None)

    def calls(self, route: str | None = None) -> list[Call]:
        with self._lock:
            return [c for c in self._calls if route is None or c.route == route]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, route: str) -> _Rule | None:
        with self._lock:
            rule = self._rules.get(route)
            if rule is None:
                return None
            if rule.times is not None:
                rule.times -= 1
                if rule.times <= 0:
                    del self._rules[route]
            return rule

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        proxy = self.owner
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.split("?", 1)[0]
        route = path.removeprefix("/registry/")
        body = _json_or_none(raw)
        bearer = (self.headers.get("authorization") or "").removeprefix("Bearer ") or None
        rule = proxy._take(route)
        if rule is not None and rule.status is None:
            proxy._record(Call(route, body, bearer, None, None, True, time.monotonic()))
            self.close_connection = True
            return
        if rule is not None:
            assert rule.status is not None
            status, data, injected = rule.status, json.dumps(rule.body).encode(), True
        else:
            try:
                status, data = self._forward(method, raw)
            except OSError:
                proxy._record(Call(route, body, bearer, None, None, False, time.monotonic()))
                self.close_connection = True
                return
            injected = False
        proxy._record(
            Call(route, body, bearer, status, _json_or_none(data), injected, time.monotonic())
        )
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _forward(self, method: str, raw: bytes) -> tuple[int, bytes]:
        host, port = self.owner._upstream
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            headers = {"content-type": "application/json"}
            if self.headers.get("authorization"):
                headers["authorization"] = self.headers["authorization"]
            conn.request(method, self.path, body=raw if method == "POST" else None, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()


StartNode = Callable[..., Node]
"""`start_node(env={...}, listen="127.0.0.1:P")`: a node on the test's Redis."""


# --- the worker under test -----------------------------------------------------------------------


def attest(
    secret: str,
    session: str,
    inst: str | None,
    epoch: str | None,
    purpose: str = "forward",
    *,
    iat: float | None = None,
    headers: Mapping[str, Any] | None = None,
    algorithm: str = "HS256",
    **claims: Any,
) -> str:
    """A `Pinboard-Attestation` as the node signs it: header `{"alg":"HS256",
    "typ":"pinboard+jwt"}` (plus `headers`), HMAC under the worker's secret, `aud` the
    session, `exp` = `iat` + 30; `claims` add to or override these."""
    issued = int(time.time()) if iat is None else int(iat)
    payload: dict[str, Any] = {
        "aud": session,
        "iat": issued,
        "exp": issued + 30,
        "purpose": purpose,
    }
    if inst is not None:
        payload["inst"] = inst
    if epoch is not None:
        payload["epoch"] = epoch
    payload.update(claims)
    return sign(payload, secret.encode(), headers, algorithm)


def sign(
    payload: Mapping[str, Any],
    secret: bytes,
    headers: Mapping[str, Any] | None = None,
    algorithm: str = "HS256",
) -> str:
    """A compact JWS of `payload` with the node's header (`typ` pinboard+jwt, plus `headers`),
    signed by PyJWT (`none`: unsigned)."""
    header = {"typ": "pinboard+jwt", **(headers or {})}
    key = None if algorithm == "none" else secret
    return jwt.encode(dict(payload), key, algorithm=algorithm, headers=header)


INVALID_ATTESTATION = {"detail": "invalid attestation"}
"""The body of the middleware's 403 for a missing, invalid or misbound attestation."""


def lease_unhealthy(reply: httpx.Response) -> bool:
    """The in-band refusal, whole: 503, `Retry-After: 1`, `Pinned-Refusal: lease-unhealthy`."""
    return (
        reply.status_code == 503
        and reply.headers.get("retry-after") == "1"
        and reply.headers.get("pinned-refusal") == "lease-unhealthy"
        and reply.json() == {"detail": "lease unhealthy"}
    )


class WorkerProcess:
    """`tests/apps.py` under uvicorn in a subprocess, listening on a socket bound here (so the
    advertise URL's port is known before it starts), registering with `registry`."""

    def __init__(
        self,
        registry: str,
        log: Path,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        exit_on_refused_credential: bool = True,
        app: str = "starlette",
        server: str = "serve",
        namespaces: Iterable[str] = ("/threads", "/docs"),
        client_id: str = "worker-1",
        store: Path | None = None,
        wake_wait: float = 0.3,
        call_timeout: float = 5.0,
        deployment: tuple[str, str, int] | None = None,
    ) -> None:
        """`server`: `serve` (`pinboard_worker.serve`) or `uvicorn` (plain). `token_file`: the
        credential read from that file instead of `token` (by default
        `worker_token()`). `deployment`: hostname, env and epoch of a hostname-aware
        registration (takeover `wind_down`)."""
        self.log_path = log
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port: int = listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PINBOARD_")}
        env.update(
            {
                "PINNED_TEST_FD": str(listener.fileno()),
                "PINNED_TEST_APP": app,
                "PINNED_TEST_SERVER": server,
                "PINNED_TEST_REGISTRY": registry,
                "PINNED_TEST_ADVERTISE": self.url,
                "PINNED_TEST_NAMESPACES": ",".join(namespaces),
                "PINNED_TEST_CLIENT_ID": client_id,
                "PINNED_TEST_WAKE_WAIT": str(wake_wait),
                "PINNED_TEST_CALL_TIMEOUT": str(call_timeout),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if token_file is not None:
            env["PINNED_TEST_TOKEN_FILE"] = str(token_file)
        else:
            env["PINNED_TEST_TOKEN"] = token or worker_token()
        if not exit_on_refused_credential:
            env["PINNED_TEST_KEEP_ON_REFUSED"] = "1"
        if store is not None:
            env["PINNED_TEST_STORE"] = str(store)
        if deployment is not None:
            hostname, deploy_env, epoch = deployment
            env.update(
                {
                    "PINNED_TEST_HOSTNAME": hostname,
                    "PINNED_TEST_ENV": deploy_env,
                    "PINNED_TEST_EPOCH": str(epoch),
                }
            )
        try:
            self.proc = _spawn([sys.executable, str(APPS)], env, log, [listener.fileno()])
        finally:
            listener.close()
        self.client = httpx.Client(base_url=self.url, timeout=15, trust_env=False)

    def log(self) -> str:
        return tail(self.log_path, 200)

    def info(self) -> dict[str, Any]:
        """What the test app tells of its worker: session, secret, held, status, events,
        messages, wakes."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the worker exited {self.proc.returncode}:\n{self.log()}")
        value: dict[str, Any] = self.client.get("/_test/info").json()
        return value

    def _info_if_up(self) -> dict[str, Any] | None:
        try:
            return self.info()
        except httpx.TransportError:
            return None

    def wait_registered(self, timeout: float = 20) -> str:
        def session() -> str | None:
            info = self._info_if_up()
            return info["session"] if info else None

        return eventually(session, timeout, lambda: f"a registration\n{self.log()}")

    def wait_serving(self, timeout: float = 20) -> None:
        """Until the server answers at all (apps without the `/_test` routes)."""

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited:\n{self.log()}")
            try:
                self.client.get("/")
            except httpx.TransportError:
                return False
            return True

        eventually(up, timeout, lambda: f"the worker serving\n{self.log()}")

    @property
    def session(self) -> str:
        session: str = self.info()["session"]
        return session

    @property
    def secret(self) -> str:
        secret: str = self.info()["secret"]
        return secret

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.info()["events"]
        return [e for e in events if kind is None or e["type"] == kind]

    def held(self) -> list[list[str]]:
        held: list[list[str]] = self.info()["held"]
        return held

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Runs `worker.<op>(...)` in the worker (`release`, `tag`, `schedule`, `cancel`):
        `{"result": ...}` or `{"error": class name, "status", "reregister", ...}`."""
        reply = self.client.post("/_test/call", json={"op": op, **args}, timeout=60)
        assert reply.status_code == 200, reply.text
        value: dict[str, Any] = reply.json()
        return value

    def wake_hook(self, *, hold: bool = False, fail: bool = False) -> None:
        reply = self.client.post("/_test/wake-hook", json={"hold": hold, "fail": fail})
        assert reply.status_code == 200, reply.text

    def request(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str | bytes]] | None = None,
    ) -> httpx.Response:
        """`method path` straight to the worker, with exactly these headers (a `str` value
        sent as Latin-1, `bytes` as they are)."""
        raw = [
            (name.encode(), value if isinstance(value, bytes) else value.encode("latin-1"))
            for name, value in headers or []
        ]
        return self.client.request(method, path, headers=raw)

    def forward(
        self,
        path: str,
        epoch: str,
        *,
        method: str = "GET",
        purpose: str = "forward",
        info: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """`path` sent to the worker as the node forwards it: attested for the worker's
        current session, bound to the path's `{ns}/{id}` at `epoch`."""
        known = info or self.info()
        inst = "/".join(path.split("?")[0].split("/")[:3])
        token = attest(known["secret"], known["session"], inst, epoch, purpose)
        headers: list[tuple[str, str | bytes]] = [
            ("pinboard-attestation", token),
            ("pinboard-epoch", epoch),
        ]
        return self.request(method, path, headers)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def stop_gracefully(self, timeout: float = 30) -> None:
        """SIGTERM, as an orchestrator stops it: the process exits 0 (`pinboard_worker.serve`)
        within `timeout` after uvicorn's whole shutdown (the app's lifespan shutdown
        included)."""
        self.terminate()
        code = self.wait(timeout)
        assert code == 0, f"exit status {code}:\n{self.log()}"
        assert "Application shutdown complete" in self.log(), self.log()

    def kill(self) -> None:
        _kill(self.proc)
        self.client.close()


StartWorker = Callable[..., WorkerProcess]
"""`start_worker(registry, wait=True, **WorkerProcess options)`: a worker of the test."""
