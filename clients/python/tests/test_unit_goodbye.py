"""Which epochs' WebSockets a worker closes, and how (`goodbye.py`), as the Rust twin tests it
(protocol/src/worker/goodbye.rs): wind-downs at their deadline (revoked, replaced), moves,
evictions, releases, newer epochs, everything at a stop; reasons that fit a close frame."""

from __future__ import annotations

import asyncio

from pinboard_worker.goodbye import MAX_REASON, Close, Goodbye, Goodbyes
from pinboard_worker.held import Gate, HeldMap
from pinboard_worker.types import Evicted, Message, Superseded, WindDown

OPEN = Gate(superseded=False, lease=True, activations=True)


def _held(*instances: tuple[str, str]) -> HeldMap:
    held = HeldMap()
    for id, epoch in instances:
        held.admit("/t", id, epoch, 0.0, OPEN)
    return held


def _wind_down(id: str, deadline: float | None, moved: bool = False) -> WindDown:
    return WindDown(Message(msg_id=1, ns="/t", id=id, deadline=deadline, moved=moved))


def _reasons(*goodbyes: Goodbye) -> list[str | None]:
    return [g.said.reason if g.said else None for g in goodbyes]


def test_a_wind_down_ends_the_held_epoch_at_its_deadline() -> None:
    goodbyes = Goodbyes()
    held = _held(("a", "7"))
    old, current = goodbyes.open("/t", "a", "6"), goodbyes.open("/t", "a", "7")
    other = goodbyes.open("/t", "b", "7")
    deadline = goodbyes.on_event(_wind_down("a", 30.0), held)
    assert deadline is not None and deadline.after == 30.0
    assert current.said is None, "not before the deadline"
    late = goodbyes.open("/t", "a", "7")
    goodbyes.deadline_reached(deadline)
    assert current.said == Close(1012, "epoch 7 ended")
    assert _reasons(old, late, other) == ["epoch 6 ended", "epoch 7 ended", None]
    assert len(goodbyes) == 1
    other.leave()
    assert len(goodbyes) == 0


def test_a_move_says_moved_and_later_messages_revoke_or_replace() -> None:
    goodbyes = Goodbyes()
    held = _held(("a", "7"))
    socket = goodbyes.open("/t", "a", "7")
    first = goodbyes.on_event(_wind_down("a", 30.0), held)
    assert goodbyes.on_event(_wind_down("a", None), held) is None
    assert first is not None
    goodbyes.deadline_reached(first)
    assert socket.said is None, "revoked"
    second = goodbyes.on_event(_wind_down("a", 30.0), held)
    third = goodbyes.on_event(_wind_down("a", 0.0, moved=True), held)
    assert second is not None and third is not None
    goodbyes.deadline_reached(second)
    assert socket.said is None, "replaced"
    goodbyes.deadline_reached(third)
    assert socket.said == Close(1012, "moved")
    again = goodbyes.open("/t", "a", "7")
    goodbyes.deadline_reached(third)
    assert again.said is None, "reached once only"
    assert goodbyes.on_event(_wind_down("zz", 1.0), held) is None, "not held: nothing to end"


def test_evictions_releases_and_newer_epochs_end_at_once() -> None:
    goodbyes = Goodbyes()
    held = _held()
    a, b, b_newer, c = (
        goodbyes.open("/t", "a", "3"),
        goodbyes.open("/t", "b", "3"),
        goodbyes.open("/t", "b", "4"),
        goodbyes.open("/t", "c", "10"),
    )
    assert goodbyes.on_event(Evicted(ns="/t", id="a"), held) is None
    goodbyes.newer_epoch("/t", "b", "04")
    assert _reasons(a, b, b_newer, c) == ["epoch 3 ended", "epoch 3 ended", None, None]
    goodbyes.instance_ended("/t", "c")
    assert c.said == Close.epoch_ended("10")
    goodbyes.on_event(Superseded(error="x"), held)
    assert b_newer.said == Close.epoch_ended("4")


def test_a_waiting_socket_is_woken_by_a_stop() -> None:
    async def run() -> Close:
        goodbyes = Goodbyes()
        socket = goodbyes.open("/t", "a", "9")
        waiting = asyncio.ensure_future(socket.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        goodbyes.all_ended()
        return await asyncio.wait_for(waiting, 1)

    assert asyncio.run(run()) == Close(1012, "epoch 9 ended")


def test_a_reason_fits_a_close_frame() -> None:
    assert Close.epoch_ended("9" * 200).reason == "epoch ended"
    longest = "9" * (MAX_REASON - len("epoch  ended"))
    assert len(Close.epoch_ended(longest).reason) == MAX_REASON
