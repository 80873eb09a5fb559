"""The placement epoch as a fencing token: `Fence` ordered exactly at any size, and the fenced
writes to an application's own stores against the real databases, a SQLite file (the standard
library's `sqlite3`) and a `redis-server` of the test's (the `redis` package): higher and equal
epochs write, a lower one is refused and changes nothing, epochs past 2^53 and 2^64 and of
different lengths compare right, and two writers at once (processes for SQLite, threads with a
connection each for Redis) end with the highest epoch's value."""

from __future__ import annotations

import multiprocessing
import random
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest
from redis import Redis as RedisClient
from redis.exceptions import ResponseError
from support import Redis

import pinboard_worker
from pinboard_worker import Fence, FencedRedis, FencedTable, StaleEpochError
from pinboard_worker.fencing import PADDED_WIDTH, REDIS_COMPARE_AND_SET, ZERO

# --- Fence -----------------------------------------------------------------------------------


def test_a_fence_is_the_epochs_significant_digits() -> None:
    assert str(Fence("007")) == "7"
    assert Fence("000") == ZERO == Fence("0")
    assert Fence("1700000000123").digits == "1700000000123"
    assert hash(Fence("07")) == hash(Fence("7"))
    for bad in ["", " 1", "1 ", "-1", "+1", "1.0", "1e3", "١٢", "12a", "0x1"]:
        with pytest.raises(ValueError, match="not a placement epoch"):
            Fence(bad)
    instance = pinboard_worker.Instance(ns="/t", id="a", rest="", epoch="0042", activated=True)
    assert Fence.of(instance) == Fence("42")


def test_fences_order_exactly_past_2_53_and_2_64() -> None:
    assert Fence("9") < Fence("10") and Fence("0") < Fence("1")
    # 2^53 + 1 is the first integer a float cannot hold: it still orders after 2^53.
    assert Fence("9007199254740992") < Fence("9007199254740993")
    assert Fence("18446744073709551615") < Fence("18446744073709551616")
    assert Fence("99999999999999999999999") > Fence("18446744073709551616")
    assert Fence("0018446744073709551616") >= Fence("18446744073709551616")
    # Past int()'s default 4300-digit limit: compared, never converted.
    assert Fence("9" * 5000) < Fence("1" + "0" * 5000)
    ordered = sorted(Fence(e) for e in ["100", "99", "0", "1000", "101", "0099"])
    assert [str(f) for f in ordered] == ["0", "99", "99", "100", "101", "1000"]


def test_padded_fences_compare_as_text_in_numeric_order() -> None:
    assert Fence("42").padded() == "0" * (PADDED_WIDTH - 2) + "42"
    epochs = ["0", "9", "10", "9007199254740993", "18446744073709551616", "9" * PADDED_WIDTH]
    padded = [Fence(e).padded() for e in epochs]
    assert padded == sorted(padded) and all(len(p) == PADDED_WIDTH for p in padded)
    with pytest.raises(ValueError, match=f"more than {PADDED_WIDTH} digits"):
        Fence("1" + "0" * PADDED_WIDTH).padded()


# --- the rules every fenced store keeps ------------------------------------------------------


class Fenced(Protocol):
    """A fenced store under test, through a connection of its own."""

    def write(self, key: str, fence: Fence, value: bytes) -> None: ...
    def read(self, key: str) -> tuple[bytes, Fence] | None: ...


class Sqlite:
    """`FencedTable` on a connection of its own to a SQLite file."""

    def __init__(self, file: Path, table: str = "notes") -> None:
        self.conn = sqlite3.connect(file, timeout=30)
        self.table = FencedTable(table)
        self.table.create(self.conn)

    def write(self, key: str, fence: Fence, value: bytes) -> None:
        self.table.write(self.conn, key, fence, value)

    def read(self, key: str) -> tuple[bytes, Fence] | None:
        return self.table.read(self.conn, key)


class RedisKeys:
    """`FencedRedis` on a client of its own."""

    def __init__(self, server: Redis) -> None:
        self.client = RedisClient(port=server.port)
        self.fenced = FencedRedis(self.client)

    def write(self, key: str, fence: Fence, value: bytes) -> None:
        self.fenced.write(key, fence, value)

    def read(self, key: str) -> tuple[bytes, Fence] | None:
        return self.fenced.read(key)


def _refused(store: Fenced, key: str, offered: str, stored: str) -> None:
    """A write at `offered` is refused, naming `stored`, and changes nothing."""
    before = store.read(key)
    with pytest.raises(StaleEpochError) as refusal:
        store.write(key, Fence(offered), b"late")
    assert str(refusal.value) == f"stale epoch: stored {stored}, offered {offered}"
    assert (refusal.value.stored, refusal.value.offered) == (Fence(stored), Fence(offered))
    assert store.read(key) == before, "nothing changed"


def _keeps_the_fencing_rules(store: Fenced) -> None:
    assert store.read("k") is None
    store.write("k", Fence("5"), b"five")
    assert store.read("k") == (b"five", Fence("5"))
    # The same owner writes again; the next owner's higher epoch replaces it.
    store.write("k", Fence("5"), b"five again")
    assert store.read("k") == (b"five again", Fence("5"))
    store.write("k", Fence("6"), b"six")
    assert store.read("k") == (b"six", Fence("6"))
    # A former owner's late write is refused and changes nothing.
    _refused(store, "k", "5", "6")
    _refused(store, "k", "4", "6")

    # Keys are apart; a key's first write is taken at any epoch, 0 included.
    store.write("other", Fence("0"), b"zero")
    assert store.read("other") == (b"zero", ZERO)
    assert store.read("k") == (b"six", Fence("6"))

    # Past 2^53 (2^53 + 1 is no float) and 2^64, and across lengths: as numbers, never as
    # floats or as text.
    store.write("big", Fence("9007199254740994"), b"a")
    _refused(store, "big", "9007199254740993", "9007199254740994")
    store.write("big", Fence("18446744073709551616"), b"c")
    _refused(store, "big", "18446744073709551615", "18446744073709551616")
    assert store.read("big") == (b"c", Fence("18446744073709551616"))
    store.write("len", Fence("9"), b"nine")
    store.write("len", Fence("10"), b"ten")
    _refused(store, "len", "9", "10")
    # "0010" is the epoch 10: equal, so it writes.
    store.write("len", Fence("0010"), b"ten again")
    assert store.read("len") == (b"ten again", Fence("10"))
    # Bytes, not text.
    store.write("bytes", Fence("1"), b"\0\xff\n")
    assert store.read("bytes") == (b"\0\xff\n", Fence("1"))


def _write_shuffled(store: Fenced, writer: int, count: int) -> int:
    """One writer's writes to `race` at epochs `writer + 1`, `writer + 3`, ... shuffled (out
    of order, as late writes are): how many were written. Refusals must name a higher epoch."""
    epochs = [2 * n + writer + 1 for n in range(count)]
    random.Random(writer).shuffle(epochs)
    written = 0
    for epoch in epochs:
        try:
            store.write("race", Fence(str(epoch)), f"{writer}:{epoch}".encode())
            written += 1
        except StaleEpochError as stale:
            assert stale.stored > Fence(str(epoch)), stale
    return written


def _sqlite_writer(file: Path, writer: int) -> int:
    """A process of its own writing to the SQLite file."""
    return _write_shuffled(Sqlite(file), writer, 100)


# --- SQLite ----------------------------------------------------------------------------------


def test_a_sqlite_table_keeps_the_fencing_rules(tmp_path: Path) -> None:
    file = tmp_path / "app.db"
    _keeps_the_fencing_rules(Sqlite(file))
    # What is on disk, read back by a new connection: the epoch zero-padded to 40 digits.
    conn = sqlite3.connect(file)
    [(stored, kind)] = conn.execute("SELECT epoch, typeof(epoch) FROM notes WHERE key = 'big'")
    assert (stored, kind) == ("18446744073709551616".rjust(PADDED_WIDTH, "0"), "text")

    # Two processes, a connection each, write one key at once: the higher epoch stands.
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        written = pool.starmap(_sqlite_writer, [(file, 0), (file, 1)])
    assert sum(written) >= 1, written  # the first write of a key is never refused
    assert Sqlite(file).read("race") == (b"1:200", Fence("200"))


def test_a_sqlite_write_joins_the_callers_transaction(tmp_path: Path) -> None:
    file = tmp_path / "app.db"
    store, other = Sqlite(file), Sqlite(file)
    store.write("k", Fence("2"), b"two")
    # Outside a transaction each write is committed at once: another connection sees it.
    assert other.read("k") == (b"two", Fence("2"))
    # Inside the caller's, it is committed (or rolled back) with the caller's other writes.
    store.conn.execute("BEGIN")
    store.write("k", Fence("3"), b"three")
    assert store.conn.in_transaction
    store.conn.rollback()
    assert other.read("k") == (b"two", Fence("2")), "rolled back with the caller's"
    with store.conn:
        store.conn.execute("CREATE TABLE IF NOT EXISTS log (line TEXT)")
        store.write("k", Fence("3"), b"three")
        store.conn.execute("INSERT INTO log VALUES ('wrote 3')")
    assert other.read("k") == (b"three", Fence("3"))
    # In autocommit mode (isolation_level None) too.
    auto = sqlite3.connect(file, isolation_level=None)
    FencedTable("notes").write(auto, "k", Fence("4"), b"four")
    assert other.read("k") == (b"four", Fence("4"))


def test_a_sqlite_table_refuses_what_it_cannot_store_exactly_and_quotes_its_name(
    tmp_path: Path,
) -> None:
    store = Sqlite(tmp_path / "app.db", 't"; DROP TABLE x; --')
    store.write("k", Fence("7"), b"seven")
    assert store.read("k") == (b"seven", Fence("7"))
    tables = [row[0] for row in store.conn.execute("SELECT name FROM sqlite_master")]
    assert tables == ['t"; DROP TABLE x; --', 'sqlite_autoindex_t"; DROP TABLE x; --_1']

    # 40 digits fit; 41 cannot be stored so that they compare exactly, and are not written.
    widest = "9" * PADDED_WIDTH
    store.write("k", Fence(widest), b"widest")
    with pytest.raises(ValueError, match=f"more than {PADDED_WIDTH} digits"):
        store.write("k", Fence("1" + "0" * PADDED_WIDTH), b"wider")
    assert store.read("k") == (b"widest", Fence(widest))


# --- Redis -----------------------------------------------------------------------------------


def test_a_redis_key_keeps_the_fencing_rules(redis: Redis) -> None:
    _keeps_the_fencing_rules(RedisKeys(redis))
    # The layout: a hash of the value and the epoch's digits.
    assert redis.cli("HGET", "big", "epoch") == "18446744073709551616"
    assert redis.cli("HGET", "big", "value") == "c"

    # Two writers, a connection each, write one key at once: the higher epoch stands.
    written: list[int] = []

    def writer(n: int) -> Callable[[], None]:
        store = RedisKeys(redis)
        return lambda: written.append(_write_shuffled(store, n, 100))

    threads = [threading.Thread(target=writer(n)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(written) == 2 and sum(written) >= 1, written
    assert RedisKeys(redis).read("race") == (b"1:200", Fence("200"))


def test_the_redis_script_is_the_rust_librarys_run_by_its_digest(redis: Redis) -> None:
    rust = Path(__file__).resolve().parents[3] / "protocol/src/worker/fencing.lua"
    if rust.exists():  # in a clone of the repository: one script for both libraries
        assert rust.read_text("utf-8") == REDIS_COMPARE_AND_SET
    store = RedisKeys(redis)
    store.write("k", Fence("3"), b"three")
    sha = redis.cli("SCRIPT", "LOAD", REDIS_COMPARE_AND_SET)
    # Loaded by the helper's first write (EVAL after EVALSHA missed), then run by digest.
    redis.cli("SCRIPT", "FLUSH")
    store.write("k", Fence("4"), b"four")
    assert redis.cli("SCRIPT", "EXISTS", sha) == "1"
    assert store.read("k") == (b"four", Fence("4"))

    # Straight through EVALSHA as any client would: the answers, and what is not an epoch.
    def evalsha(epoch: str, value: str) -> str:
        return redis.cli("EVALSHA", sha, "1", "k", epoch, value)

    assert evalsha("3", "late") == "0\n4"
    assert evalsha("0005", "five") == "1\n5"
    for bad in ["", "x", "-6", "6.0", "6 ", "+6"]:
        assert evalsha(bad, "bad") == "ERR malformed epoch", repr(bad)
    assert store.read("k") == (b"five", Fence("5"))
    # A key that is not such a hash is the store's error, not a refusal.
    redis.cli("SET", "plain", "x")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        store.write("plain", Fence("1"), b"v")
    # A client that decodes replies reads the same (a value as the UTF-8 it was decoded from).
    decoding = FencedRedis(RedisClient(port=redis.port, decode_responses=True))
    assert decoding.read("k") == (b"five", Fence("5"))
    with pytest.raises(StaleEpochError, match=r"^stale epoch: stored 5, offered 4$"):
        decoding.write("k", Fence("4"), b"late")
