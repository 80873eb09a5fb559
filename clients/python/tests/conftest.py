"""Fixtures: a real redis-server, the real `pinboard serve` on it (cold start ended), the fault
proxy in front of it, and workers (uvicorn subprocesses serving `tests/apps.py`). Each is
stopped when its test ends, pass or fail; a failing test prints the tail of every log."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

import pytest
from support import (
    FaultProxy,
    MissingBinary,
    Node,
    Redis,
    StartNode,
    StartWorker,
    WorkerProcess,
    pinboard_bin,
    tail,
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


class Logs:
    """The log files of the test's processes, printed when it failed."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def dump(self) -> None:
        for path in self.paths:
            print(f"\n===== {path.name} =====\n{tail(path, 120)}")


@pytest.fixture
def logs(request: pytest.FixtureRequest) -> Generator[Logs, None, None]:
    found = Logs()
    yield found
    if request.node.stash.get(_FAILED, False):
        found.dump()


@pytest.fixture(scope="session")
def binary() -> Path:
    try:
        return pinboard_bin()
    except MissingBinary as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def redis(tmp_path: Path, logs: Logs) -> Generator[Redis, None, None]:
    server = Redis(tmp_path / "redis")
    logs.paths.append(server.log)
    yield server
    server.stop()


@pytest.fixture
def start_node(
    binary: Path, redis: Redis, tmp_path: Path, logs: Logs
) -> Generator[StartNode, None, None]:
    """Starts a node on the test's Redis: `start_node(env={...}, listen="127.0.0.1:P")`."""
    nodes: list[Node] = []
    redis.end_cold_start()

    def start(env: Mapping[str, str] | None = None, listen: str = "127.0.0.1:0") -> Node:
        log = tmp_path / f"node-{len(nodes) + 1}.log"
        logs.paths.append(log)
        node = Node(redis.url, log, env, listen)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.kill()


@pytest.fixture
def node(start_node: StartNode) -> Node:
    return start_node()


@pytest.fixture
def start_proxy() -> Generator[Callable[[Node], FaultProxy], None, None]:
    """Starts a fault proxy in front of a node: `start_proxy(node)`."""
    proxies: list[FaultProxy] = []

    def start(upstream: Node) -> FaultProxy:
        proxies.append(FaultProxy(upstream.url))
        return proxies[-1]

    yield start
    for fronting in proxies:
        fronting.close()


@pytest.fixture
def proxy(node: Node, start_proxy: Callable[[Node], FaultProxy]) -> FaultProxy:
    """The fault proxy in front of `node`."""
    return start_proxy(node)


@pytest.fixture
def start_worker(tmp_path: Path, logs: Logs) -> Generator[StartWorker, None, None]:
    """Starts a worker registering with `registry`; with `wait=True` (the default) returns
    once it holds a session. Other keywords go to `WorkerProcess`."""
    workers: list[WorkerProcess] = []

    def start(registry: str, *, wait: bool = True, **options: Any) -> WorkerProcess:
        log = tmp_path / f"worker-{len(workers) + 1}.log"
        logs.paths.append(log)
        worker = WorkerProcess(registry, log, **options)
        workers.append(worker)
        if wait:
            worker.wait_registered()
        return worker

    yield start
    for worker in workers:
        worker.kill()
