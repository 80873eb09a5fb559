"""Durability (contract §7): where a durable instance's state and its wish to be woken live
while no worker holds it (the `DurabilityStore` protocol and `FileStore`, one directory with a
file per instance, each fenced by the placement epoch that last wrote it), and what `_wake`
needs to know of wakes under way (`Wakes`).

The store is the worker's own memory; the wake itself is the node's: the worker asks for it with
`POST /registry/schedule` (`Worker.schedule_wake`), and the node's durability sweep sends
`POST {ns}/{id}/_wake` once it is due.

`FileStore` writes the Rust library's format (`pinned-durable/1`) and takes the same lock (an
exclusive `flock` on the directory), so a Rust and a Python worker can share one store
directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import hashlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from .epoch import order
from .fencing import ZERO, Fence, StaleEpochError

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
    implementation must keep any value from naming anything but its own entry.

    Fencing: a store keeps, per `(ns, id)`, the highest placement epoch that wrote it (a
    `Fence`; none yet is epoch 0). `save_fenced` and `claim` pass the writer's epoch
    (`Fence.of(instance)`) and raise `StaleEpochError`, changing nothing, when the store holds a
    higher one: a worker paused past its lease that resumes and saves after the instance moved
    on cannot overwrite the new owner's state. An equal epoch writes (the same owner again).
    `claim` stores the epoch before returning the state (the worker claims before `on_wake`
    hydrates; an app hydrating on `instance.activated` should claim too), so that a former
    owner is refused even if the new one never saves. `save`, `schedule`, `cancel` and
    `remove` write without a fence, keeping the stored epoch (`remove` keeps the fence too)."""

    def load(self, ns: str, id: str) -> bytes | None: ...
    def save(self, ns: str, id: str, state: bytes) -> None: ...
    def save_fenced(self, ns: str, id: str, fence: Fence, state: bytes) -> None: ...
    def claim(self, ns: str, id: str, fence: Fence) -> bytes | None: ...
    def schedule(self, ns: str, id: str, wake_at_ms: int) -> None: ...
    def cancel(self, ns: str, id: str) -> None: ...
    def scheduled(self, ns: str, id: str) -> int | None: ...
    def remove(self, ns: str, id: str) -> None: ...


@dataclasses.dataclass
class _Entry:
    wake_at: int | None = None
    state: bytes | None = None
    epoch: Fence = ZERO
    """The highest epoch that wrote it."""

    def empty(self) -> bool:
        return self.wake_at is None and self.state is None and self.epoch == ZERO


class FileStore:
    """One directory, one file per `(ns, id)`. The name is `ns` and `id` with every byte
    outside `[A-Za-z0-9_-]` as `%XX`, joined by `.` (so `../x`, `a/b` or a NUL can only name
    their own file), or `#` + a SHA-256 past 200 bytes; each file's header names its instance
    and is checked on every read; once a fenced write stored an epoch, the header ends with it
    (` {epoch}`; a file without one is at epoch 0). A write goes to a temporary file, fsynced,
    renamed over the old one, then the directory is fsynced: a crash leaves the old state or the
    new one. Every change reads, checks and writes under an exclusive `flock` on the directory
    (the Rust library's `FileStore` takes the same), so workers in other processes never
    interleave a check and a write: of two fenced writers, the higher epoch's state stands.
    Reads take no lock (a rename is atomic)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def path_of(self, ns: str, id: str) -> Path:
        return self.dir / file_name(ns, id)

    def load(self, ns: str, id: str) -> bytes | None:
        return self._read(ns, id).state

    def save(self, ns: str, id: str, state: bytes) -> None:
        self._update(ns, id, state=state)

    def save_fenced(self, ns: str, id: str, fence: Fence, state: bytes) -> None:
        self._update(ns, id, fence, state=state)

    def claim(self, ns: str, id: str, fence: Fence) -> bytes | None:
        return self._update(ns, id, fence).state

    def schedule(self, ns: str, id: str, wake_at_ms: int) -> None:
        self._update(ns, id, wake_at=wake_at_ms)

    def cancel(self, ns: str, id: str) -> None:
        self._update(ns, id, wake_at=None)

    def scheduled(self, ns: str, id: str) -> int | None:
        return self._read(ns, id).wake_at

    def remove(self, ns: str, id: str) -> None:
        """Forgets the state and the wake; the fence stays, so that a former owner cannot save
        the instance back."""
        self._update(ns, id, wake_at=None, state=None)

    _KEEP = object()

    def _update(
        self,
        ns: str,
        id: str,
        fence: Fence | None = None,
        *,
        wake_at: object = _KEEP,
        state: object = _KEEP,
    ) -> _Entry:
        """Changes `(ns, id)`'s entry under the locks, writing it back atomically (or removing
        the file once it holds nothing) unless nothing changed: the entry as it stands after.
        With a `fence`, first refused (`StaleEpochError`) when the entry holds a higher epoch,
        else raised to it."""
        with self._locked():
            old = self._read(ns, id)
            entry = dataclasses.replace(old)
            if fence is not None:
                if fence < entry.epoch:
                    raise StaleEpochError(entry.epoch, fence)
                entry.epoch = fence
            if wake_at is not FileStore._KEEP:
                assert wake_at is None or isinstance(wake_at, int)
                entry.wake_at = wake_at
            if state is not FileStore._KEEP:
                assert state is None or isinstance(state, bytes)
                entry.state = state
            if entry != old:
                self._write(ns, id, entry)
            return entry

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The directory's exclusive `flock`, on a descriptor of its own: it excludes this
        store's other threads, other stores and other processes alike."""
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, ns: str, id: str, entry: _Entry) -> None:
        path = self.path_of(ns, id)
        if entry.empty():
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
    epoch = "" if entry.epoch == ZERO else f" {entry.epoch}"
    return f"{MAGIC} {key} {wake} {length}{epoch}\n".encode("ascii") + (entry.state or b"")


def _parse(raw: bytes, key: str) -> _Entry | None:
    header, newline, body = raw.partition(b"\n")
    if not newline:
        return None
    fields = header.decode("ascii", "replace").split(" ")
    if len(fields) not in (4, 5) or fields[0] != MAGIC or fields[1] != key:
        return None
    try:
        epoch = Fence(fields[4]) if len(fields) == 5 else ZERO
    except ValueError:
        return None

    wake, length = _number(fields[2]), _number(fields[3])
    if wake is _BAD or length is _BAD:
        return None
    assert not isinstance(wake, _Bad) and not isinstance(length, _Bad)
    if length is None:
        return _Entry(wake_at=wake, epoch=epoch) if not body else None
    if length != len(body):
        return None
    return _Entry(wake_at=wake, state=body, epoch=epoch)


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
