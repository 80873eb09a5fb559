"""The admission table (`HeldMap` under a `Gate`) and the worker state's gate, as the Rust twin
tests them (protocol/src/worker/held.rs, state.rs): the clock is passed in, so times are exact."""

from __future__ import annotations

import pytest

from pinboard_worker.config import Config
from pinboard_worker.held import GONE_FOR, Admission, Gate, HeldMap
from pinboard_worker.state import State

OPEN = Gate(superseded=False, lease=True, activations=True)
NOW = 1000.0

ACTIVATED, SERVE, STALE, REFUSED = (
    Admission.ACTIVATED,
    Admission.SERVE,
    Admission.STALE,
    Admission.REFUSED,
)


def test_admission_follows_epochs() -> None:
    held = HeldMap()

    def admit(epoch: str, at: float = NOW) -> Admission:
        return held.admit("/t", "a", epoch, at, OPEN)

    assert admit("5") is ACTIVATED
    assert admit("05") is SERVE, "the same epoch, spelled otherwise"
    assert admit("4") is STALE
    # Re-placed here at a higher epoch: a new activation.
    assert admit("9") is ACTIVATED
    assert held.epoch_of("/t", "a") == "9"

    assert held.forget("/t", "a", NOW) == "9"
    assert held.forget("/t", "a", NOW) is None
    assert held.epoch_of("/t", "a") is None
    assert admit("9") is STALE
    assert admit("8") is STALE
    assert admit("9", NOW + GONE_FOR - 0.001) is STALE
    assert admit("9", NOW + GONE_FOR) is ACTIVATED, "the memory of a released epoch fades"
    assert held.forget("/t", "a", NOW) == "9"
    assert admit("10") is ACTIVATED
    assert len(held) == 1


def test_instances_group_by_namespace() -> None:
    held = HeldMap()
    for ns, id in [("/docs", "z"), ("/threads", "b"), ("/threads", "a")]:
        held.admit(ns, id, "1", NOW, OPEN)
    assert held.instances() == {"/docs": ["z"], "/threads": ["a", "b"]}
    assert held.held() == [("/docs", "z", "1"), ("/threads", "a", "1"), ("/threads", "b", "1")]


def test_forgetting_everything_remembers_every_epoch() -> None:
    held = HeldMap()
    for i in range(1000):
        assert held.admit(f"/n{i % 3}", f"i{i}", "7", NOW, OPEN) is ACTIVATED
    everything = held.held()
    assert len(everything) == 1000
    assert everything == sorted(everything)
    assert len(held.instances()["/n1"]) == 333
    assert held.forget_all(NOW) == everything
    assert held.held() == [] and len(held) == 0
    for ns, id, epoch in everything:
        assert held.admit(ns, id, epoch, NOW, OPEN) is STALE, f"{ns}/{id}"
    # A minute on, the memory is pruned and they may come back.
    assert held.forget("/n0", "nothing", NOW + GONE_FOR) is None
    assert held.admit("/n0", "i0", "7", NOW + GONE_FOR, OPEN) is ACTIVATED


def test_a_closed_gate_records_nothing() -> None:
    held = HeldMap()
    closed = Gate(superseded=False, lease=True, activations=False)
    assert held.admit("/t", "a", "1", NOW, closed) is REFUSED
    assert held.epoch_of("/t", "a") is None
    assert held.admit("/t", "a", "1", NOW, OPEN) is ACTIVATED
    # A higher epoch is a new activation: refused, the held epoch stays as it was.
    assert held.admit("/t", "a", "2", NOW, closed) is REFUSED
    assert held.epoch_of("/t", "a") == "1"
    assert held.admit("/t", "a", "1", NOW, closed) is SERVE, "held: served while stopping"


@pytest.fixture
def state() -> State:
    config = Config(
        registry="http://127.0.0.1:1",
        token="t",
        client_id="c",
        namespaces=["/t"],
        advertise_url="http://127.0.0.1:2",
    )
    return State(config, config.validate())


def test_serving_needs_a_live_lease(state: State) -> None:
    held = HeldMap()

    def admit(id: str, epoch: str, now: float) -> Admission:
        return held.admit("/t", id, epoch, now, state.gate(now))

    assert admit("a", "1", NOW) is REFUSED, "no lease yet"
    state.lease_until = NOW + 1
    assert admit("a", "1", NOW) is ACTIVATED
    # Past the lease nothing is served: another worker may hold "a" by now. A stale epoch is
    # still answered as stale.
    later = NOW + 2
    assert not state.lease_healthy(later)
    assert admit("a", "1", later) is REFUSED
    assert admit("a", "0", later) is STALE
    assert admit("b", "1", later) is REFUSED
    # A renewed lease serves "a" again (still held, at the same epoch).
    state.lease_until = later + 1
    assert admit("a", "1", later) is SERVE
    # Stopping: held instances are served until released, new ones refused.
    state.stopping = True
    assert admit("a", "1", later) is SERVE
    assert admit("b", "1", later) is REFUSED
    state.superseded = True
    assert admit("a", "1", later) is REFUSED
    assert state.status().superseded


def test_secrets_and_challenges_are_fresh_hex(state: State) -> None:
    assert len(state.secret) == 64 and int(state.secret, 16) >= 0
    other = State(state.config, "")
    assert other.secret != state.secret
    c1, v1 = state.next_challenge()
    c2, v2 = state.next_challenge()
    assert len({c1, v1, c2, v2}) == 4
    assert state.challenge_value(c1) == v1
    assert state.challenge_value(c2) == v2
    state.next_challenge()
    assert state.challenge_value(c1) is None, "only the current and the previous one"
    assert state.challenge_value(c2) == v2
    assert state.challenge_value(v2) is None, "a value is not a challenge"
    assert state.challenge_value("") is None
