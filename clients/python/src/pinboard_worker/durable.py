"""Durability (contract §7): where a durable instance's state and its wish to be woken live
while no worker holds it (the `DurabilityStore` protocol and `FileStore`, one directory with a
file per instance), and what `_wake` needs to know of wakes under way (`Wakes`).

The store is the worker's own memory; the wake itself is the node's: the worker asks for it with
`POST /registry/schedule` (`Worker.schedule_wake`), and the node's durability sweep sends
`POST {ns}/{id}/_wake` once it is due.

`FileStore` writes the Rust library's format (`pinned-durable/1`), so a Rust and a Python
worker can share one store directory.
"""

from __future__ import annotations

import enum
import hashlib
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .epoch import order

MAX_NAME = 200
"""Longest escaped file name kept; a longer one is named by its SHA-256."""
MAGIC = "pinned-durable/1"
DONE_KEPT = 60.0
"""Seconds a finished wake is reported (200) to the sweep's next `_wake`."""


@runtime_checkable
class DurabilityStore(Protocol):
    """Where durable instances keep their state and the wake they asked for, keyed by
    `(ns, id)` (`ns` with its leading `/`). Synchronous: a small file costs little; move big
    saves to a thread of your own. `ns` and `id` come from request paths and are untrusted: an
    implementation must keep any value from naming anything but its own entry."""

    def load(self, ns: str, id: str) -> bytes | None: ...
    def save(self, ns: str, id: str, state: bytes) -> None: ...
    def schedule(self, ns: str, id: str, wake_at_ms: int) -> None: ...
    def cancel(self, ns: str, id: str) -> None: ...
    def scheduled(self, ns: str, id: str) -> int | None: ...
    def remove(self, ns: str, id: str) -> None: ...


@dataclass
class _Entry:
    wake_at: int | None = None
    state: bytes | None = None


class FileStore:
    """One directory, one file per `(ns, id)`. The name is `ns` and `id` with every byte
    outside `[A-Za-z0-9_-]` as `%XX`, joined by `.` (so `../x`, `a/b` or a NUL can only name
    their own file), or `#` + a SHA-256 past 200 bytes; each file's header names its instance
    and is checked on every read. A write goes to a temporary file, fsynced, renamed over the
    old one, then the directory is fsynced: a crash leaves the old state or the new one."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def path_of(self, ns: str, id: str) -> Path:
        return self.dir / file_name(ns, id)

    def load(self, ns: str, id: str) -> bytes | None:
        with self._lock:
            return self._read(ns, id).state

    def save(self, ns: str, id: str, state: bytes) -> None:
        self._update(ns, id, state=state)

    def schedule(self, ns: str, id: str, wake_at_ms: int) -> None:
        self._update(ns, id, wake_at=wake_at_ms)

    def cancel(self, ns: str, id: str) -> None:
        self._update(ns, id, wake_at=None)

    def scheduled(self, ns: str, id: str) -> int | None:
        with self._lock:
            return self._read(ns, id).wake_at

    def remove(self, ns: str, id: str) -> None:
        self._update(ns, id, wake_at=None, state=None)

    _KEEP = object()

    def _update(self, ns: str, id: str, *, wake_at: object = _KEEP, state: object = _KEEP) -> None:
        with self._lock:
            entry = self._read(ns, id)
            if wake_at is not FileStore._KEEP:
                assert wake_at is None or isinstance(wake_at, int)
                entry.wake_at = wake_at
            if state is not FileStore._KEEP:
                assert state is None or isinstance(state, bytes)
                entry.state = state
            path = self.path_of(ns, id)
            if entry.wake_at is None and entry.state is None:
                try:
                    path.unlink()
                except FileNotFoundError:
                    return
                self._sync_dir()
                return
            tmp = self.dir / f".tmp-{secrets.token_hex(8)}"
            try:
                with open(tmp, "xb") as file:
                    file.write(_render(_key(ns, id), entry))
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._sync_dir()

    def _read(self, ns: str, id: str) -> _Entry:
        path = self.path_of(ns, id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return _Entry()
        entry = _parse(raw, _key(ns, id))
        if entry is None:
            raise OSError(f"{path}: not a durable state file of {ns}/{id}")
        return entry

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _escape(text: str) -> str:
    return "".join(
        chr(b) if b in _PLAIN else f"%{b:02X}" for b in text.encode("utf-8", "surrogatepass")
    )


def _key(ns: str, id: str) -> str:
    return f"{_escape(ns)}.{_escape(id)}"


def file_name(ns: str, id: str) -> str:
    key = _key(ns, id)
    if len(key) <= MAX_NAME:
        return key
    return "#" + hashlib.sha256(key.encode("ascii")).hexdigest()


def _render(key: str, entry: _Entry) -> bytes:
    wake = "-" if entry.wake_at is None else str(entry.wake_at)
    length = "-" if entry.state is None else str(len(entry.state))
    return f"{MAGIC} {key} {wake} {length}\n".encode("ascii") + (entry.state or b"")


def _parse(raw: bytes, key: str) -> _Entry | None:
    header, newline, body = raw.partition(b"\n")
    if not newline:
        return None
    fields = header.decode("ascii", "replace").split(" ")
    if len(fields) != 4 or fields[0] != MAGIC or fields[1] != key:
        return None

    wake, length = _number(fields[2]), _number(fields[3])
    if wake is _BAD or length is _BAD:
        return None
    assert not isinstance(wake, _Bad) and not isinstance(length, _Bad)
    if length is None:
        return _Entry(wake_at=wake) if not body else None
    if length != len(body):
        return None
    return _Entry(wake_at=wake, state=body)


class _Bad:
    """A header field that is neither `-` nor digits."""


_BAD = _Bad()


def _number(field: str) -> int | _Bad | None:
    """`-`, or a u64 in digits, as the Rust library reads it (so a file it would refuse is
    refused here too, and a long run of digits is never handed to `int`)."""
    if field == "-":
        return None
    if not (field.isascii() and field.isdigit()):
        return _BAD
    significant = field.lstrip("0") or "0"
    if len(significant) > 20 or int(significant) >= 2**64:
        return _BAD
    return int(significant)


class Begin(enum.Enum):
    """What a `_wake` finds."""

    START = "start"
    """Nothing under way: this request runs the hook."""
    RUNNING = "running"
    """A hook runs (perhaps for an earlier epoch): 202."""
    DONE = "done"
    """The hook of a wake at this epoch finished since the last `_wake` asked: 200."""


class Wakes:
    """The `_wake`s under way: one hook at a time per instance, a finished one reported for
    `DONE_KEPT` seconds."""

    def __init__(self) -> None:
        # (ns, id) -> (epoch, finished at or None while running)
        self._runs: dict[tuple[str, str], tuple[str, float | None]] = {}

    def begin(self, ns: str, id: str, epoch: str, now: float) -> Begin:
        key = (ns, id)
        run = self._runs.get(key)
        if run is not None:
            run_epoch, done = run
            if done is None:
                return Begin.RUNNING
            if order(run_epoch) == order(epoch) and now - done < DONE_KEPT:
                del self._runs[key]
                return Begin.DONE
        self._runs[key] = (epoch, None)
        return Begin.START

    def finish(self, ns: str, id: str, ok: bool, now: float) -> None:
        """The hook `begin` started returned: a success is kept for the next `_wake` to
        collect, a failure forgotten (the next `_wake` tries again)."""
        key = (ns, id)
        run = self._runs.get(key)
        if ok and run is not None:
            self._runs[key] = (run[0], now)
        else:
            self._runs.pop(key, None)

    def collect(self, ns: str, id: str) -> None:
        """The request that started the wake saw it finish: nothing is left to report."""
        self._runs.pop((ns, id), None)
