"""The registry protocol's pure parts: `Backoff` bounds, reading wind-down messages, what a
heartbeat answer does to the state (messages delivered once and acked, the drain state), and
the register body (a fresh challenge each time, `prevSessionId` and `instances` only when
registering again). No server: the `Control` is given a registry it never calls."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pinboard_worker.config import Config
from pinboard_worker.control import (
    HEARTBEAT_BACKOFF,
    REGISTER_BACKOFF,
    Backoff,
    Control,
    _wind_down,
)
from pinboard_worker.credential import Credential
from pinboard_worker.held import Gate
from pinboard_worker.registry import Registry
from pinboard_worker.state import State
from pinboard_worker.types import Drain, Event, Evicted, Message, Registered, WindDown


@pytest.mark.parametrize(
    ("first_and_ceiling", "windows"),
    [
        ((0.4, 3.0), [0.4, 0.8, 1.6, 3.0, 3.0]),
        (REGISTER_BACKOFF, [0.5, 1, 2, 4, 8, 16, 30, 30, 30]),
        (HEARTBEAT_BACKOFF, [0.5, 1, 2, 4, 5, 5]),
    ],
)
def test_backoff_doubles_to_its_ceiling_with_jitter(
    first_and_ceiling: tuple[float, float], windows: list[float]
) -> None:
    for _ in range(50):
        backoff = Backoff(first_and_ceiling)
        for window in windows:
            pause = backoff.next()
            assert window / 2 <= pause <= window, (pause, window)
    draws = {Backoff((1.0, 1.0)).next() for _ in range(100)}
    assert len(draws) > 50, "jittered"
    assert min(draws) >= 0.5 and max(draws) <= 1.0


def test_wind_down_messages() -> None:
    message = {"msgId": "m-1", "type": "wind_down", "ns": "/t", "id": "a", "deadline": 30}
    assert _wind_down(message) == Message(msg_id="m-1", ns="/t", id="a", deadline=30.0)
    revoked = {"msgId": 7, "type": "wind_down", "ns": "/t", "id": "a", "deadline": None}
    assert _wind_down(revoked) == Message(msg_id=7, ns="/t", id="a", deadline=None)
    no_deadline = {"msgId": 7, "type": "wind_down", "ns": "/t", "id": "a"}
    assert _wind_down(no_deadline) == Message(msg_id=7, ns="/t", id="a", deadline=None)
    past = {"msgId": 8, "type": "wind_down", "ns": "/t", "id": "a", "deadline": -2.5}
    assert _wind_down(past) == Message(msg_id=8, ns="/t", id="a", deadline=0.0)
    moved = {"msgId": 9, "type": "wind_down", "ns": "/t", "id": "a", "deadline": 5, "moved": True}
    assert _wind_down(moved) == Message(msg_id=9, ns="/t", id="a", deadline=5.0, moved=True)
    for unsure in ("yes", 1, None, False):
        message = {**moved, "moved": unsure}
        assert _wind_down(message) == Message(msg_id=9, ns="/t", id="a", deadline=5.0), unsure
    for unreadable in [
        {"msgId": 9, "type": "rebalance", "ns": "/t", "id": "a"},
        {"msgId": 9, "ns": "/t", "id": "a", "deadline": 1},
        {"msgId": 9, "type": "wind_down", "ns": 1, "id": "a", "deadline": 1},
        {"msgId": 9, "type": "wind_down", "ns": "/t", "deadline": 1},
        {"msgId": 9, "type": "wind_down", "ns": "/t", "id": "a", "deadline": "soon"},
        {"msgId": 9, "type": "wind_down", "ns": "/t", "id": "a", "deadline": True},
    ]:
        assert _wind_down(unreadable) is None, unreadable


class Harness:
    def __init__(self) -> None:
        self.config = Config(
            registry="http://127.0.0.1:1",
            token="t",
            client_id="worker-1",
            namespaces=["/t", "/u"],
            advertise_url="http://127.0.0.1:2",
        )
        self.state = State(self.config, self.config.validate())
        self.events: list[Event] = []
        registry = Registry(self.config.registry, Credential("t", None), 1.0, None)
        self.control = Control(
            self.state, registry, self.events.append, asyncio.Event(), "http://127.0.0.1:2"
        )


def _messages(*messages: Any) -> dict[str, Any]:
    return {"expiresInMs": 3000, "draining": False, "messages": list(messages)}


def _wd(msg_id: Any, id: str = "a", deadline: Any = 30) -> dict[str, Any]:
    return {"msgId": msg_id, "type": "wind_down", "ns": "/t", "id": id, "deadline": deadline}


def test_messages_are_delivered_once_and_every_readable_id_acked() -> None:
    h = Harness()
    sent = time.monotonic()
    h.control.renewed(
        _messages(
            _wd("m-1"),
            _wd("m-1"),  # the same message twice in one answer
            {"msgId": 2, "type": "rebalance"},  # unknown: acked, ignored
            _wd(3, deadline="soon"),  # unreadable: acked, ignored
            _wd(True),  # no usable msgId: neither
            _wd(None),
            _wd(1.5),
            "not an object",
            _wd(4, id="b", deadline=None),
        ),
        sent,
        3.0,
    )
    assert h.state.lease_until == sent + 3.0
    assert h.events == [
        WindDown(Message("m-1", "/t", "a", 30.0)),
        WindDown(Message(4, "/t", "b", None)),
    ]
    assert h.control.acks == ["m-1", 2, 3, 4]
    assert [m.msg_id for m in h.state.messages] == ["m-1", 4]

    # Re-delivered before the ack landed: acked again, not handed to the app again.
    h.control.acks = []
    h.control.renewed(_messages(_wd("m-1"), _wd(5, id="c")), sent, 3.0)
    assert h.events[2:] == [WindDown(Message(5, "/t", "c", 30.0))]
    assert h.control.acks == ["m-1", 5]


def test_the_drain_state_is_an_event_when_it_changes() -> None:
    h = Harness()
    now = time.monotonic()
    h.control.renewed({"expiresInMs": 3000, "draining": True, "drainDeadline": 12}, now, 3)
    h.control.renewed({"expiresInMs": 3000, "draining": True, "drainDeadline": 12}, now, 3)
    h.control.renewed({"expiresInMs": 3000, "degraded": True, "draining": False}, now, 3)
    assert h.events == [Drain(True, 12.0), Drain(False, None)]
    assert h.state.degraded
    assert h.state.status().registry_draining is False
    h.control.renewed({"expiresInMs": 3000}, now, 3)
    assert not h.state.degraded


def test_a_register_body_carries_a_fresh_challenge_and_reclaims_only_when_asked() -> None:
    h = Harness()
    h.state.held.admit("/t", "b", "4", 0.0, Gate(False, True, True))
    h.state.held.admit("/t", "a", "5", 0.0, Gate(False, True, True))
    first = h.control.register_body(None)
    assert first == {
        "clientId": "worker-1",
        "secret": h.state.secret,
        "namespaces": ["/t", "/u"],
        "advertiseUrl": "http://127.0.0.1:2",
        "headroom": 100,
        "draining": False,
        "challenge": first["challenge"],
        "challengeValue": first["challengeValue"],
    }
    again = h.control.register_body("old-session")
    assert again["challenge"] != first["challenge"]
    assert h.state.challenge_value(again["challenge"]) == again["challengeValue"]
    assert again["prevSessionId"] == "old-session"
    assert again["instances"] == {"/t": ["a", "b"]}
    h.state.held.forget_all(0.0)
    assert "instances" not in h.control.register_body("old-session")


def test_a_register_answer_sets_the_lease_and_evicts_duplicates() -> None:
    h = Harness()
    gate = Gate(False, True, True)
    h.state.held.admit("/t", "kept", "4", 0.0, gate)
    h.state.held.admit("/t", "lost", "5", 0.0, gate)
    for bad in (
        {"expiresInMs": 3000},
        {"sessionId": "", "expiresInMs": 3000},
        {"sessionId": "s", "expiresInMs": 0},
        {"sessionId": "s", "expiresInMs": True},
        {"sessionId": "s", "expiresInMs": "3000"},
    ):
        assert h.control.registered(bad, 0.0, False) is None, bad
    assert h.state.status().session_id is None and h.events == []
    answer = {
        "sessionId": "s2",
        "expiresInMs": 3000,
        "draining": False,
        "duplicates": [{"ns": "/t", "id": "lost"}, {"ns": "/t", "id": "never-held"}, "junk"],
    }
    assert h.control.registered(answer, 10.0, True) == 3.0
    assert (h.state.session, h.state.lease_until) == ("s2", 13.0)
    assert h.events == [Registered("s2", True), Evicted("/t", "lost")]
    assert h.state.held.held() == [("/t", "kept", "4")]
