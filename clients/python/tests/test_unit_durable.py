"""`FileStore` on real files (naming with hostile ids, the `pinned-durable/1` format the Rust
library writes too, whole-file reads, atomic writes, fenced saves and claims refusing a lower
epoch, two processes saving at once) and `Wakes`, one hook at a time."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from support import shared_inputs

from pinboard_worker import Fence, StaleEpochError
from pinboard_worker.durable import DONE_KEPT, Begin, DurabilityStore, FileStore, Wakes, file_name


def test_the_file_store_round_trips_state_and_wakes(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "a" / "b")
    assert isinstance(store, DurabilityStore)
    assert store.load("/threads", "t1") is None
    assert store.scheduled("/threads", "t1") is None
    store.save("/threads", "t1", b"one")
    store.schedule("/threads", "t1", 1_700_000_000_000)
    store.save("/threads", "t1", b"two\n\0bytes")
    store.save("/threads", "empty", b"")
    assert store.load("/threads", "t1") == b"two\n\0bytes"
    assert store.scheduled("/threads", "t1") == 1_700_000_000_000
    assert store.load("/threads", "empty") == b"", "an empty state is a state"
    assert store.load("/docs", "t1") is None, "namespaces keep instances apart"

    # Another store on the same directory (a restarted worker) reads the same.
    again = FileStore(store.dir)
    assert again.load("/threads", "t1") == b"two\n\0bytes"
    again.cancel("/threads", "t1")
    assert store.scheduled("/threads", "t1") is None
    assert store.load("/threads", "t1") is not None, "cancel keeps the state"
    store.schedule("/threads", "wake-only", 5)
    assert store.load("/threads", "wake-only") is None
    assert store.scheduled("/threads", "wake-only") == 5

    for id in ("t1", "empty", "wake-only"):
        store.remove("/threads", id)
        assert store.load("/threads", id) is None
        assert store.scheduled("/threads", id) is None
    store.remove("/threads", "never-there")
    store.cancel("/threads", "never-there")
    assert list(store.dir.iterdir()) == [], "nothing left behind, temporary files included"


def test_the_format_is_the_rust_librarys(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save("/threads", "a-1_B", b"one\ntwo")
    store.schedule("/threads", "a-1_B", 17)
    path = store.path_of("/threads", "a-1_B")
    assert path.name == "%2Fthreads.a-1_B"
    assert path.read_bytes() == b"pinned-durable/1 %2Fthreads.a-1_B 17 7\none\ntwo"
    store.schedule("/threads", "w", 5)
    assert store.path_of("/threads", "w").read_bytes() == b"pinned-durable/1 %2Fthreads.w 5 -\n"
    store.save("/threads", "s", b"")
    assert store.path_of("/threads", "s").read_bytes() == b"pinned-durable/1 %2Fthreads.s - 0\n"
    # A file the Rust library wrote is read, its numbers as a u64.
    store.path_of("/t", "r").write_bytes(b"pinned-durable/1 %2Ft.r 99 3\nabc")
    assert (store.load("/t", "r"), store.scheduled("/t", "r")) == (b"abc", 99)
    store.path_of("/t", "m").write_bytes(b"pinned-durable/1 %2Ft.m 18446744073709551615 -\n")
    assert store.scheduled("/t", "m") == 2**64 - 1
    store.path_of("/t", "z").write_bytes(b"pinned-durable/1 %2Ft.z " + b"0" * 5000 + b"7 -\n")
    assert store.scheduled("/t", "z") == 7, "leading zeros, as Rust's parse takes them"


def test_names_escape_every_byte_but_the_plain_ones() -> None:
    assert file_name("/threads", "../x") == "%2Fthreads.%2E%2E%2Fx"
    assert file_name("/t", "a/b") == "%2Ft.a%2Fb"
    assert file_name("/t", "a\0b") == "%2Ft.a%00b"
    assert file_name("/t", "é") == "%2Ft.%C3%A9"
    assert file_name("/t", "%2F") == "%2Ft.%252F"
    # The separator is never part of an escaped name, so splitting elsewhere differs.
    assert file_name("/a.b", "c") != file_name("/a", "b.c")
    long = file_name("/t", "x" * 300)
    key = "%2Ft." + "x" * 300
    assert long == "#" + hashlib.sha256(key.encode()).hexdigest()
    assert long != file_name("/t", "x" * 301)
    edge = "x" * (200 - len("%2Ft."))
    assert file_name("/t", edge) == "%2Ft." + edge, "200 bytes still named as is"
    assert file_name("/t", edge + "x").startswith("#")


def test_hostile_ids_stay_inside_the_directory_and_apart(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    hostile = [
        *shared_inputs("hostile-ids.json"),
        "\udcff",  # a lone surrogate, as surrogateescape decodes a stray byte
        "x" * 300,
        "x" * 301,
        "../" * 4000,
    ]
    for n, id in enumerate(hostile):
        store.save("/t", id, str(n).encode())
        store.schedule("/t", id, n)
        assert store.path_of("/t", id).parent == store.dir, repr(id)
    # Hostile namespaces too, and a namespace/id split that would join to the same text.
    store.save("/../t", "x", b"ns")
    store.save("/t.x", "y", b"dot-ns")
    for n, id in enumerate(hostile):
        assert store.load("/t", id) == str(n).encode(), repr(id)
        assert store.scheduled("/t", id) == n, repr(id)
    assert store.load("/../t", "x") == b"ns"
    assert store.load("/t", "x.y") is None
    assert store.load("/t.x", "y") == b"dot-ns"

    assert [p.name for p in tmp_path.iterdir()] == ["store"], "nothing written beside it"
    inside = list(store.dir.iterdir())
    assert len(inside) == len(hostile) + 2
    for entry in inside:
        assert entry.is_file() and not entry.is_symlink()
        assert not entry.name.startswith(".") and len(entry.name) <= 255, entry.name


@pytest.mark.parametrize(
    "content",
    [
        b"pinned-durable/1 %2Ft.a - 5\nabcd",  # torn: shorter than its length
        b"pinned-durable/1 %2Ft.a - 5\nabcdef",  # longer
        b"pinned-durable/1 %2Ft.a - -\nstray",  # no state, yet a body
        b"pinned-durable/1 %2Ft.b - 1\nx",  # another instance's file
        b"pinned-durable/2 %2Ft.a - 1\nx",  # another format
        b"pinned-durable/1 %2Ft.a x 1\nx",  # a wake that is not a number
        b"pinned-durable/1 %2Ft.a - +1\nx",
        b"pinned-durable/1 %2Ft.a 5 1 extra\nx",  # an epoch that is not digits
        b"pinned-durable/1 %2Ft.a 5 1 -1\nx",
        b"pinned-durable/1 %2Ft.a 5 1 \nx",  # an empty epoch
        b"pinned-durable/1 %2Ft.a 5 1 7 8\nx",  # a sixth field
        b"pinned-durable/1 %2Ft.a 5 1",  # no header line end
        b"pinned-durable/1 %2Ft.a 18446744073709551616 -\n",  # past u64, as Rust reads it
        b"pinned-durable/1 %2Ft.a " + b"9" * 5000 + b" -\n",  # past int()'s digit limit
        b"pinned-durable/1 %2Ft.a - " + b"1" * 5000 + b"\nx",
        b"garbage",
        b"",
    ],
)
def test_a_file_is_read_only_whole_and_as_its_own(tmp_path: Path, content: bytes) -> None:
    store = FileStore(tmp_path)
    store.path_of("/t", "a").write_bytes(content)
    with pytest.raises(OSError):
        store.load("/t", "a")
    with pytest.raises(OSError):
        store.save("/t", "a", b"new")  # an update reads the old entry first
    assert store.path_of("/t", "a").read_bytes() == content, "left as it was"


def test_a_write_goes_to_a_temporary_file_renamed_over_the_old(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.save("/t", "a", b"old")
    path = store.path_of("/t", "a")
    inode = path.stat().st_ino
    store.save("/t", "a", b"new")
    assert path.read_bytes().endswith(b"\nnew")
    assert path.stat().st_ino != inode, "replaced by rename, not written in place"
    # A leftover temporary file of a crashed write is not an entry.
    (tmp_path / ".tmp-0123456789abcdef").write_bytes(b"half a write")
    assert store.load("/t", "a") == b"new"
    # A write that cannot be renamed into place leaves no temporary file behind.
    blocked = store.path_of("/t", "dir")
    blocked.mkdir()
    with pytest.raises(OSError):
        store.save("/t", "dir", b"x")
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-"))
    assert leftovers == [".tmp-0123456789abcdef"]
    assert os.listdir(blocked) == []


def _refused(stored: str, offered: str, write: Callable[[], object]) -> None:
    """Runs `write`, which must be refused as from `offered` where `stored` is."""
    with pytest.raises(StaleEpochError) as refusal:
        write()
    assert str(refusal.value) == f"stale epoch: stored {stored}, offered {offered}"
    assert (refusal.value.stored, refusal.value.offered) == (Fence(stored), Fence(offered))


def test_the_file_store_refuses_a_save_from_a_lower_epoch_and_changes_nothing(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    ns, id = "/threads", "f"
    store.save_fenced(ns, id, Fence("5"), b"five")
    store.schedule(ns, id, 99)
    # The same owner saves again; a higher epoch (the next owner) replaces it.
    store.save_fenced(ns, id, Fence("5"), b"five again")
    store.save_fenced(ns, id, Fence("6"), b"six")
    path = store.path_of(ns, id)
    before = path.read_bytes()
    assert before == b"pinned-durable/1 %2Fthreads.f 99 3 6\nsix", "the Rust library's header"

    _refused("6", "5", lambda: store.save_fenced(ns, id, Fence("5"), b"late"))
    assert path.read_bytes() == before, "nothing written"
    assert (store.load(ns, id), store.scheduled(ns, id)) == (b"six", 99)
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file left"

    # Past 2^53 and 2^64, and across lengths, epochs compare as numbers, never as floats or as
    # text: 2^53 + 1 is refused after 2^53 + 2; "10" beats "9".
    store.save_fenced(ns, "big", Fence("9007199254740994"), b"a")
    _refused(
        "9007199254740994",
        "9007199254740993",
        lambda: store.save_fenced(ns, "big", Fence("9007199254740993"), b"b"),
    )
    store.save_fenced(ns, "big", Fence("18446744073709551616"), b"c")
    _refused(
        "18446744073709551616",
        "18446744073709551615",
        lambda: store.save_fenced(ns, "big", Fence("18446744073709551615"), b"d"),
    )
    assert store.load(ns, "big") == b"c"
    store.save_fenced(ns, "lengths", Fence("9"), b"nine")
    store.save_fenced(ns, "lengths", Fence("10"), b"ten")
    _refused("10", "9", lambda: store.save_fenced(ns, "lengths", Fence("9"), b"nine"))
    # Leading zeros are the same epoch (stored without them).
    store.save_fenced(ns, "lengths", Fence("0010"), b"ten again")
    assert store.path_of(ns, "lengths").read_bytes() == (
        b"pinned-durable/1 %2Fthreads.lengths - 9 10\nten again"
    )
    # An epoch of a thousand digits still compares (no int(), no float).
    huge = "9" * 1000
    store.save_fenced(ns, "huge", Fence(huge), b"h")
    _refused(
        huge, "1" + "0" * 998, lambda: store.save_fenced(ns, "huge", Fence("1" + "0" * 998), b"x")
    )
    assert FileStore(tmp_path).load(ns, "huge") == b"h", "read back by another store"


def test_a_file_from_before_fencing_is_epoch_0_and_unfenced_calls_keep_the_epoch(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    ns, id = "/threads", "old"
    # Written as the store wrote it before fencing (no epoch in the header).
    path = store.path_of(ns, id)
    path.write_bytes(b"pinned-durable/1 %2Fthreads.old 7 3\nold")
    store.save_fenced(ns, id, Fence("0"), b"zero")
    assert path.read_bytes() == b"pinned-durable/1 %2Fthreads.old 7 4\nzero", "0: no field"
    store.save_fenced(ns, id, Fence("1"), b"one")
    _refused("1", "0", lambda: store.save_fenced(ns, id, Fence("0"), b"zero"))
    # The calls without a fence write, and keep the stored epoch.
    store.save(ns, id, b"unfenced")
    store.schedule(ns, id, 8)
    store.cancel(ns, id)
    assert path.read_bytes() == b"pinned-durable/1 %2Fthreads.old - 8 1\nunfenced"
    # Removed, the state and the wake go, the fence stays: a former owner cannot save the
    # instance back.
    store.remove(ns, id)
    assert store.load(ns, id) is None
    assert path.read_bytes() == b"pinned-durable/1 %2Fthreads.old - - 1\n"
    _refused("1", "0", lambda: store.save_fenced(ns, id, Fence("0"), b"back"))
    assert store.load(ns, id) is None


def test_a_claim_fences_off_earlier_owners_before_the_new_one_saves(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    ns, id = "/threads", "c"
    assert store.claim(ns, id, Fence("3")) is None
    path = store.path_of(ns, id)
    assert path.read_bytes() == b"pinned-durable/1 %2Fthreads.c - - 3\n", "kept, nothing saved"
    store.save_fenced(ns, id, Fence("3"), b"three")
    # The next owner hydrates at 4: the state, and from now on 3 is refused.
    assert store.claim(ns, id, Fence("4")) == b"three"
    _refused("4", "3", lambda: store.save_fenced(ns, id, Fence("3"), b"late"))
    _refused("4", "3", lambda: store.claim(ns, id, Fence("3")))
    # Claiming again at the same epoch writes nothing.
    inode = path.stat().st_ino
    assert store.claim(ns, id, Fence("04")) == b"three"
    assert path.stat().st_ino == inode, "not rewritten"


def _save_shuffled(directory: Path, writer: int, count: int) -> int:
    """One process's saves to `/t/x` at epochs `writer + 1`, `writer + 3`, ... shuffled (out
    of order, as late writes are): how many were written. Refusals must name a higher epoch."""
    store = FileStore(directory)
    epochs = [2 * n + writer + 1 for n in range(count)]
    random.Random(writer).shuffle(epochs)
    written = 0
    for epoch in epochs:
        try:
            store.save_fenced("/t", "x", Fence(str(epoch)), f"{writer}:{epoch}".encode())
            written += 1
        except StaleEpochError as stale:
            assert stale.stored > Fence(str(epoch)), stale
    return written


def test_two_processes_saving_at_once_end_with_the_highest_epochs_state(tmp_path: Path) -> None:
    # Two processes, a store each on one directory, as two workers have: only the directory's
    # flock keeps one's check and write from interleaving with the other's.
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        written = pool.starmap(_save_shuffled, [(tmp_path, 0, 150), (tmp_path, 1, 150)])
    assert sum(written) >= 1, written  # the first write of a key is never refused
    store = FileStore(tmp_path)
    assert store.load("/t", "x") == b"1:300", "the highest epoch's state stands"
    _refused("300", "299", lambda: store.save_fenced("/t", "x", Fence("299"), b"late"))


def test_one_wake_at_a_time_and_its_outcome_once() -> None:
    wakes = Wakes()
    now = 100.0
    assert wakes.begin("/t", "a", "5", now) is Begin.START
    assert wakes.begin("/t", "a", "5", now) is Begin.RUNNING
    assert wakes.begin("/t", "a", "6", now) is Begin.RUNNING
    assert wakes.begin("/t", "b", "5", now) is Begin.START
    wakes.finish("/t", "a", True, now)
    assert wakes.begin("/t", "a", "05", now) is Begin.DONE, "the same epoch, numerically"
    # Reported once: the next wake runs the hook again.
    assert wakes.begin("/t", "a", "5", now) is Begin.START
    wakes.finish("/t", "a", True, now)
    # A success at another epoch, or one too old, is not this wake's.
    assert wakes.begin("/t", "a", "6", now) is Begin.START
    wakes.finish("/t", "a", True, now)
    later = now + DONE_KEPT
    assert wakes.begin("/t", "a", "6", later) is Begin.START
    # A failure is forgotten.
    wakes.finish("/t", "a", False, later)
    assert wakes.begin("/t", "a", "6", later) is Begin.START
    # The request that started it saw it finish: nothing left to report.
    wakes.finish("/t", "a", True, later)
    wakes.collect("/t", "a")
    assert wakes.begin("/t", "a", "6", later) is Begin.START
