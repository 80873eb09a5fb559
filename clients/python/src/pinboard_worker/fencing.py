"""The placement epoch as a fencing token for the worker's own storage: `Fence` (an epoch's
significant digits, ordered exactly at any size), `StaleEpochError` (a write refused because the
store holds a later epoch's), and fenced writes to an application's own SQLite (`FencedTable`,
on the standard library's `sqlite3`) and Redis (`FencedRedis`, on the `redis` package: the extra
`pinboard-worker[redis]`).

A worker paused past its lease (a GC pause, a stopped VM) may resume believing it still owns an
instance that the node has placed elsewhere at a higher epoch. The library refuses its late
answers, but not what it writes to a store of its own: only the store can, by keeping the
highest epoch that wrote each key and refusing a write from a lower one. The script is the Rust
library's own file (`protocol/src/worker/fencing.lua`), and the table and its statements are
those of `pinboard_protocol::worker::fencing::sqlite`, so both libraries' workers can share a
key or a table.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import total_ordering
from importlib import resources
from typing import TYPE_CHECKING, Any

from .epoch import order, parse

if TYPE_CHECKING:
    import redis

    from .types import Instance

PADDED_WIDTH = 40
"""Digits in `Fence.padded()`, the form SQLite compares: any epoch up to 10^40 - 1 (the node
mints epochs from the clock in milliseconds, 13 digits, plus one per claim at most)."""


@total_ordering
@dataclass(frozen=True, eq=True)
class Fence:
    """A placement epoch as a fencing token: what to hand every store the application writes,
    so that a write from an owner the instance has moved on from is refused. `Fence("007")` is
    `Fence("7")`: kept as its significant digits (`"0"` for zero), ordered by length then
    digits, never converted to a number (exact past 2^53 and 2^64). Raises `ValueError` for
    anything but a non-empty run of ASCII digits."""

    digits: str

    def __post_init__(self) -> None:
        if parse(self.digits) is None:
            raise ValueError(f"not a placement epoch: {self.digits!r}")
        object.__setattr__(self, "digits", self.digits.lstrip("0") or "0")

    @classmethod
    def of(cls, instance: Instance) -> Fence:
        """The epoch the instance's request was admitted at."""
        return cls(instance.epoch)

    def padded(self) -> str:
        """Zero-padded to `PADDED_WIDTH` digits, so that text comparison is numeric order;
        `ValueError` for an epoch of more digits."""
        if len(self.digits) > PADDED_WIDTH:
            raise ValueError(f"epoch {self.digits} has more than {PADDED_WIDTH} digits")
        return self.digits.rjust(PADDED_WIDTH, "0")

    def __lt__(self, other: Fence) -> bool:
        return order(self.digits) < order(other.digits)

    def __str__(self) -> str:
        return self.digits


ZERO = Fence("0")
"""The fence of a key no fenced write reached (a file from before fencing)."""


class StaleEpochError(Exception):
    """A write refused because the store holds a later epoch's: the writer is no longer the
    instance's owner, and what it wrote must not replace what the owner did."""

    def __init__(self, stored: Fence, offered: Fence) -> None:
        super().__init__(f"stale epoch: stored {stored}, offered {offered}")
        self.stored = stored
        """The epoch the store holds (at least the one that refused the write)."""
        self.offered = offered
        """The writer's epoch."""


def _quoted(table: str) -> str:
    """`table` as an SQL identifier, quoted: any name, never more SQL."""
    return '"' + table.replace('"', '""') + '"'


class FencedTable:
    """A SQLite table `key TEXT PRIMARY KEY, value BLOB, epoch TEXT`, each value written with
    the epoch of its writer and replaced only by a writer at that epoch or a higher one.

    An epoch is stored as text, zero-padded to 40 digits (`Fence.padded`): fixed-width digits
    compare as numbers under SQLite's `BINARY` collation at any size, where an `INTEGER` would
    overflow past 2^63. A write is one statement, `INSERT ... ON CONFLICT (key) DO UPDATE ...
    WHERE excluded.epoch >= epoch`, so two connections (threads, processes) cannot interleave a
    check and a write. It commits unless the connection was already in a transaction (then it
    is part of the caller's, committed with it)."""

    def __init__(self, table: str) -> None:
        name = _quoted(table)
        self._create = (
            f"CREATE TABLE IF NOT EXISTS {name} (key TEXT PRIMARY KEY NOT NULL, "
            "value BLOB NOT NULL, epoch TEXT NOT NULL)"
        )
        self._write = (
            f"INSERT INTO {name} (key, value, epoch) VALUES (?1, ?2, ?3) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, epoch = excluded.epoch "
            f"WHERE excluded.epoch >= {name}.epoch"
        )
        self._read = f"SELECT value, epoch FROM {name} WHERE key = ?1"

    def create(self, conn: sqlite3.Connection) -> None:
        """Creates the table when missing."""
        with conn:
            conn.execute(self._create)

    def write(self, conn: sqlite3.Connection, key: str, fence: Fence, value: bytes) -> None:
        """Writes `key`'s value as the owner at `fence`: inserted for a new key, replaced while
        the stored epoch is at most `fence`, else `StaleEpochError` (naming the stored epoch)
        and nothing changes."""
        own = not conn.in_transaction
        written = conn.execute(self._write, (key, value, fence.padded())).rowcount
        if own:
            conn.commit()
        if written == 1:
            return
        # Refused: the row holds a higher epoch (read after, so perhaps a higher one still:
        # epochs only grow).
        stored = self.read(conn, key)
        raise StaleEpochError(stored[1] if stored else ZERO, fence)

    def read(self, conn: sqlite3.Connection, key: str) -> tuple[bytes, Fence] | None:
        """`key`'s value and the epoch that wrote it, `None` for a key never written."""
        row = conn.execute(self._read, (key,)).fetchone()
        if row is None:
            return None
        value, epoch = row
        return bytes(value), Fence(epoch)


REDIS_COMPARE_AND_SET = (resources.files(__package__) / "fencing.lua").read_text("utf-8")
"""The compare-and-set script: the Rust library's own file (`protocol/src/worker/fencing.lua`),
shipped in this package."""


class FencedRedis:
    """Values in Redis, each key a hash of `value` and `epoch` (the writer's, as digits),
    replaced only by a writer at that epoch or a higher one: `REDIS_COMPARE_AND_SET` run by
    `EVALSHA` (loaded with `EVAL` the first time a server lacks it), the key declared in
    `KEYS`, so the check and the write are one atomic script. `client` is a synchronous
    `redis.Redis` (or anything with its `register_script` and `hmget`)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._script = client.register_script(REDIS_COMPARE_AND_SET)

    def write(self, key: str, fence: Fence, value: bytes) -> None:
        """Writes `key`'s value as the owner at `fence`, unless the key holds a higher epoch
        (`StaleEpochError`, naming it; nothing changes)."""
        written, epoch = self._script(keys=[key], args=[fence.digits, value])
        if written != 1:
            raise StaleEpochError(Fence(_text(epoch)), fence)

    def read(self, key: str) -> tuple[bytes, Fence] | None:
        """`key`'s value and the epoch that wrote it, `None` for a key never written."""
        value, epoch = self._client.hmget(key, ["value", "epoch"])
        if value is None or epoch is None:
            return None
        if isinstance(value, str):  # a client that decodes replies decoded it from UTF-8
            value = value.encode("utf-8")
        return value, Fence(_text(epoch))


def _text(reply: Any) -> str:
    """A bulk reply as text, whether the client decodes responses or not."""
    return reply.decode("ascii") if isinstance(reply, bytes) else str(reply)
