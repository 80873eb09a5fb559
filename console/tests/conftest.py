"""The real stack the console's browser test drives, started once for the module: a private
redis-server, the real `pinboard serve` (debug build, `console = true`, `metrics_listen` set),
two real workers of different client ids (the Python worker library under uvicorn, the
harness of clients/python/tests, reused as it is), placed instances, and headless Chromium
(Debian's, through Playwright's `executable_path`; nothing is downloaded).

On a failing test, a screenshot of the page and the page's console log are written into
`$CONSOLE_ARTIFACTS/<test>/` (default `target/console-tests/<test>/`), and the test's report
names the folder, followed by the tail of every process's log."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

# The worker library's harness, on the path just above.
import support
from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Headless, and nothing of Chromium's own traffic: this machine's network is closed, and its
# background connections would be refused many at a time.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("CONSOLE_ARTIFACTS", REPO / "target" / "console-tests"))

HOSTILE_TAG = '<img src=x onerror="window.__pwned=1">'
"""A tag (set by a real worker through POST /registry/tag) that would run script if the page
inserted it as HTML."""
HOSTILE_ID = "<img src=x onerror=window.__pwned=2>"
"""A placement row's id written straight into Redis (what an attacker with Redis access, or a
bug, could leave there): no route would place it, the overview lists it all the same."""

INSTANCES = [f"inst-{i}" for i in range(12)]


def mint(scope: str, namespace: str) -> str:
    """`pinboard token` for account `ops` with `scope` on `namespace` (`*` for every one)."""
    out = subprocess.run(
        [
            str(support.pinboard_bin()),
            "token",
            "--secret",
            support.SECRET,
            "--sub",
            "ops",
            "--scope",
            scope,
            "--ns",
            namespace,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


@dataclass
class Stack:
    redis: support.Redis
    node: support.Node
    metrics_url: str
    workers: dict[str, support.WorkerProcess]
    operator: str
    scoped: str
    logs: list[Path] = field(default_factory=list)

    def epoch_of(self, ns: str, id: str) -> str:
        row = self.redis.row(ns, id)
        assert row is not None, f"no row for {ns}/{id}"
        epoch: str = row["epoch"]
        return epoch


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Generator[Stack, None, None]:
    tmp = tmp_path_factory.mktemp("console")
    redis = support.Redis(tmp / "redis")
    redis.end_cold_start()
    metrics_url = f"127.0.0.1:{support.free_port()}"
    node = support.Node(
        redis.url,
        tmp / "node.log",
        {
            "PINBOARD_CONSOLE": "true",
            "PINBOARD_METRICS_LISTEN": metrics_url,
            "PINBOARD_LOG": "info",
        },
    )
    logs = [redis.log, node.log_path]
    workers: dict[str, support.WorkerProcess] = {}
    try:
        for client in ("worker-a", "worker-b"):
            log = tmp / f"{client}.log"
            logs.append(log)
            workers[client] = support.WorkerProcess(
                node.url, log, client_id=client, namespaces=("/threads", "/docs")
            )
        for worker in workers.values():
            worker.wait_registered()
        for id in INSTANCES:
            node.place(f"/threads/{id}/hello")
        node.place("/docs/readme/hello")
        # The hostile tag, through the worker protocol by the instance's owner.
        owner = node.place("/threads/inst-0/who").json()["session"]
        holder = next(w for w in workers.values() if w.session == owner)
        tagged = holder.call("tag", ns="/threads", id="inst-0", tag=HOSTILE_TAG)
        assert tagged == {"result": True}, tagged
        redis.set_row("/threads", HOSTILE_ID, {"sessionId": owner, "epoch": "7"})
        yield Stack(
            redis=redis,
            node=node,
            metrics_url=f"http://{metrics_url}",
            workers=workers,
            operator=mint("pinboard:operator", "*"),
            scoped=mint("pinboard:operator", "/other"),
            logs=logs,
        )
    finally:
        for worker in workers.values():
            worker.kill()
        node.kill()
        redis.stop()


@pytest.fixture(scope="module")
def browser() -> Generator[Browser, None, None]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_FLAGS
        )
        yield launched
        launched.close()


@dataclass
class Console:
    """A fresh browser context (its own sessionStorage) on the console, and what its page
    logged."""

    page: Page
    messages: list[str]
    errors: list[str]


@pytest.fixture
def console(
    request: pytest.FixtureRequest, browser: Browser, stack: Stack
) -> Generator[Console, None, None]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    messages: list[str] = []
    errors: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: errors.append(str(e)))
    failed_before = request.session.testsfailed
    yield Console(page, messages, errors)
    # The test's own report is in by its fixtures' teardown.
    if request.session.testsfailed > failed_before:
        folder = ARTIFACTS / request.node.name
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / "page.png"), full_page=True)
        lines = messages + [f"pageerror: {e}" for e in errors]
        (folder / "console.log").write_text("\n".join(lines) + "\n")
        print(f"\nscreenshot and console log of the failing page: {folder}")
        for log in stack.logs:
            print(f"\n===== {log.name} =====\n{support.tail(log, 60)}")
    context.close()
