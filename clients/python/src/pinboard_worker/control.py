"""The worker's side of the registry protocol, one task on the worker's event loop: register
(retrying with jittered exponential backoff until it works), heartbeat every lease/3, register
again when a heartbeat learns the registry lost the session (reclaiming held instances), hand
control messages to the application and ack them, and on a graceful stop release what it holds
and deregister.

The spec's three rules for this worker, each where it is decided:
- it registers again only from the heartbeat path (`heartbeats`): a release, tag or schedule
  answered `reregister` returns that error to its caller and changes nothing here;
- it gives up on release and deregister after three tries (`leave`, `Registry.post_thrice`);
- it retries a heartbeat 403 with the same session (`heartbeats`: every failure but
  `reregister` and `superseded` is retried). With `Config.exit_on_refused_credential` a 401 or
  403 stops being retried only once the lease lapsed meanwhile (`CredentialRefused`): the
  session is gone by then, and a worker that cannot renew must not linger unseen.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from .registry import CallError, Refused, Registry
from .state import State
from .types import Drain, Event, Evicted, Message, Registered, Superseded, WindDown

log = logging.getLogger("pinboard_worker")

REGISTER_BACKOFF = (0.5, 30.0)
HEARTBEAT_BACKOFF = (0.5, 5.0)
SEEN_KEPT = 1024
"""Msg ids remembered after delivery, so a message re-delivered before its ack landed is not
handed to the application twice."""
RELEASE_BATCH = 1000
"""Instances per release call at shutdown, well under the registry's 1 MiB body cap."""


class Backoff:
    """Exponential backoff with jitter: each pause is drawn from the upper half of a window
    that doubles up to a ceiling, so many workers restarted together do not retry in
    lockstep."""

    def __init__(self, first_and_ceiling: tuple[float, float]) -> None:
        self._window, self._ceiling = first_and_ceiling

    def next(self) -> float:
        window = self._window
        self._window = min(window * 2, self._ceiling)
        return window / 2 + random.random() * window / 2


class CredentialRefused(Exception):
    """The registry refused the worker's credential (401 or 403) on every heartbeat until its
    lease lapsed, so the worker stopped (`Config.exit_on_refused_credential`)."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(
            f"the registry refused this worker's credential until its lease lapsed: "
            f"{status} {error}"
        )
        self.status = status
        self.error = error
        """The node's error string (`unauthorized`, ...)."""


class Reregister(Exception):
    """A heartbeat learned the registry lost this session: register again, naming it."""

    def __init__(self, session: str) -> None:
        super().__init__(session)
        self.session = session


class Control:
    def __init__(
        self,
        state: State,
        registry: Registry,
        emit: Callable[[Event], None],
        stop: asyncio.Event,
        advertise_url: str,
    ) -> None:
        self.state = state
        self.registry = registry
        self.emit = emit
        self.stop = stop
        self.advertise_url = advertise_url
        self.acks: list[Any] = []
        """Msg ids to ack on the next heartbeat."""
        self.seen: deque[Any] = deque(maxlen=SEEN_KEPT)

    async def lifecycle(self) -> None:
        """Registers and heartbeats until stopped or superseded."""
        previous: str | None = None
        while True:
            lease = await self.register(previous)
            if lease is None:
                return
            try:
                if not await self.heartbeats(lease):
                    return
            except Reregister as e:
                previous = e.session

    async def register(self, previous: str | None) -> float | None:
        """Registers until it works: the lease TTL in seconds, or `None` when stopped first.
        `previous`: the session the registry lost, whose instances this reclaims."""
        backoff = Backoff(REGISTER_BACKOFF)
        while not self.stop.is_set():
            body = self.register_body(previous)
            sent = time.monotonic()
            # A registration cut short may still have landed; its session then lapses.
            result = await self.unless_stopped(self.registry.post("register", body))
            if result is None:
                return None
            if isinstance(result, CallError):
                log.warning("registration failed; retrying: %s", result)
            else:
                lease = self.registered(result, sent, previous is not None)
                if lease is not None:
                    return lease
                log.warning("register answer without sessionId or expiresInMs; retrying")
            if not await self.pause(backoff.next()):
                return None
        return None

    def register_body(self, previous: str | None) -> dict[str, Any]:
        config, state = self.state.config, self.state
        challenge, value = state.next_challenge()
        body: dict[str, Any] = {
            "clientId": config.client_id,
            "secret": state.secret,
            "namespaces": config.namespaces,
            "advertiseUrl": self.advertise_url,
            "headroom": state.headroom,
            "draining": state.draining,
            "challenge": challenge,
            "challengeValue": value,
        }
        optional = {
            "hostname": config.hostname,
            "env": config.env,
            "envs": config.envs or None,
            "takeover": config.takeover,
            "epoch": config.epoch,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if previous is not None:
            body["prevSessionId"] = previous
            # While registering again the lease is unset, so no activation lands meanwhile.
            instances = state.held.instances()
            if instances:
                body["instances"] = instances
        return body

    def registered(self, answer: dict[str, Any], sent: float, reregistered: bool) -> float | None:
        """Takes in a register answer: the lease, or `None` when it is not one."""
        session, lease = answer.get("sessionId"), _lease_of(answer)
        if not isinstance(session, str) or not session or lease is None:
            return None
        # Forgotten before the lease is recorded: until then no new activation is taken, so
        # none of these can be activated again here only to be reported evicted.
        evicted = []
        duplicates = answer.get("duplicates")
        for duplicate in duplicates if isinstance(duplicates, list) else []:
            if not isinstance(duplicate, dict):
                continue
            ns, id = duplicate.get("ns"), duplicate.get("id")
            if (
                isinstance(ns, str)
                and isinstance(id, str)
                and self.state.held.forget(ns, id, time.monotonic()) is not None
            ):
                evicted.append((ns, id))
        self.state.session = session
        self.state.lease_until = sent + lease
        log.info(
            "registered session=%s advertise_url=%s lease_ms=%d evicted=%d",
            session,
            self.advertise_url,
            lease * 1000,
            len(evicted),
        )
        self.emit(Registered(session_id=session, reregistered=reregistered))
        for ns, id in evicted:
            log.warning("instance %s/%s not reclaimed at re-registration; evicted", ns, id)
            self.emit(Evicted(ns=ns, id=id))
        self.drain_state(answer)
        return lease

    async def heartbeats(self, lease: float) -> bool:
        """Heartbeats every lease/3. False when stopped or superseded; raises `Reregister`
        when the registry lost the session, `CredentialRefused` when it refused the credential
        until the lease lapsed."""
        wait = lease / 3
        backoff = Backoff(HEARTBEAT_BACKOFF)
        while True:
            if not await self.pause(wait):
                return False
            state = self.state
            challenge, value = state.next_challenge()
            session = state.session or ""
            acks = list(self.acks)
            body: dict[str, Any] = {
                "sessionId": session,
                "headroom": state.headroom,
                "draining": state.draining,
                "challenge": challenge,
                "challengeValue": value,
            }
            if acks:
                body["acks"] = acks
            sent = time.monotonic()
            result = await self.unless_stopped(self.registry.post("heartbeat", body))
            if result is None:
                return False
            if isinstance(result, dict):
                renewed = _lease_of(result)
                if renewed is not None:
                    self.acks = [a for a in self.acks if a not in acks]
                    lease, wait = renewed, renewed / 3
                    backoff = Backoff(HEARTBEAT_BACKOFF)
                    self.renewed(result, sent, lease)
                    continue
                log.warning("heartbeat answer without expiresInMs; retrying")
            elif isinstance(result, Refused) and result.reregister:
                log.warning(
                    "registry lost session %s (%s); registering again", session, result.error
                )
                state.lease_until = None
                raise Reregister(session)
            elif isinstance(result, Refused) and result.superseded:
                log.warning(
                    "registration %s superseded (%s); no longer serving instances",
                    session,
                    result.error,
                )
                state.superseded = True
                state.lease_until = None
                state.held.forget_all(time.monotonic())
                self.emit(Superseded(error=result.error))
                return False
            elif (
                isinstance(result, Refused)
                and result.status in (401, 403)
                and state.config.exit_on_refused_credential
                and not state.lease_healthy()
            ):
                self.refused(session, result)
            else:
                # A 403 included: this worker retries it with the same session.
                log.warning("heartbeat of session %s failed; retrying: %s", session, result)
            wait = min(backoff.next(), lease / 3)

    def refused(self, session: str, refusal: Refused) -> NoReturn:
        """Stops for good on a credential refused past the lease: nothing is served from here
        on (the registry may have placed every instance elsewhere), nothing is called."""
        state = self.state
        state.stopping = True
        state.lease_until = None
        state.held.forget_all(time.monotonic())
        log.error(
            "stopping: heartbeat of session %s refused %d %r until the lease lapsed; the "
            "registry does not accept this worker's credential (token or token_file)",
            session,
            refusal.status,
            refusal.error,
        )
        raise CredentialRefused(refusal.status, refusal.error)

    def renewed(self, answer: dict[str, Any], sent: float, lease: float) -> None:
        """Takes in a successful heartbeat answer."""
        state = self.state
        state.lease_until = sent + lease
        state.degraded = answer.get("degraded") is True
        fresh = []
        messages = answer.get("messages")
        for message in messages if isinstance(messages, list) else []:
            msg_id = message.get("msgId") if isinstance(message, dict) else None
            # Acked by its msgId whatever else it says, so that a message this worker cannot
            # read is not delivered again forever.
            if isinstance(msg_id, bool) or not isinstance(msg_id, (str, int)):
                continue
            if msg_id not in self.acks:
                self.acks.append(msg_id)
            if msg_id in self.seen:
                continue
            self.seen.append(msg_id)
            parsed = _wind_down(message)
            if parsed is None:
                log.warning("unknown control message %r; acked and ignored", message)
                continue
            state.messages.append(parsed)
            fresh.append(parsed)
        for parsed in fresh:
            log.info("wind-down %s/%s deadline=%s", parsed.ns, parsed.id, parsed.deadline)
            self.emit(WindDown(message=parsed))
        self.drain_state(answer)

    def drain_state(self, answer: dict[str, Any]) -> None:
        """Records the registry's drain state from a register or heartbeat answer; an event
        when it changed."""
        draining = answer.get("draining") is True
        deadline = _seconds(answer.get("drainDeadline"))
        state = self.state
        if (state.registry_draining, state.drain_deadline) != (draining, deadline):
            state.registry_draining, state.drain_deadline = draining, deadline
            self.emit(Drain(draining=draining, deadline=deadline))

    async def leave(self) -> None:
        """The graceful part of a stop: no new activations, every held instance released, the
        session deregistered, each call given up after three tries."""
        state = self.state
        state.stopping = True
        state.draining = True
        session = None if state.superseded else state.session
        held = state.held.forget_all(time.monotonic())
        if session is None:
            return
        released = 0
        for start in range(0, len(held), RELEASE_BATCH):
            rows = [
                {"sessionId": session, "namespace": ns, "id": id, "epoch": epoch}
                for ns, id, epoch in held[start : start + RELEASE_BATCH]
            ]
            try:
                answer = await self.registry.post_thrice("release", rows)
            except CallError as e:
                log.warning("release at shutdown failed; giving up: %s", e)
                continue
            count = answer.get("released")
            released += count if isinstance(count, int) else 0
        try:
            await self.registry.post_thrice("deregister", {"sessionId": session})
        except CallError as e:
            log.warning("deregister of session %s failed; giving up: %s", session, e)
            return
        log.info("deregistered session=%s held=%d released=%d", session, len(held), released)

    async def unless_stopped(
        self, call: Awaitable[dict[str, Any]]
    ) -> dict[str, Any] | CallError | None:
        """Awaits `call`: its answer, or its failure; `None` when the stop came first."""
        task = asyncio.ensure_future(call)
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not task.done():
            task.cancel()
            return None
        try:
            return task.result()
        except CallError as e:
            return e

    async def pause(self, seconds: float) -> bool:
        """Sleeps for `seconds`; False when the stop came first."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            return True
        return False


def _lease_of(answer: dict[str, Any]) -> float | None:
    """The lease (seconds) a register or heartbeat answer's `expiresInMs` grants."""
    ms = answer.get("expiresInMs")
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms <= 0:
        return None
    return ms / 1000


def _seconds(value: object) -> float | None:
    """A number of seconds from the registry; a negative one (already past) is zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return max(float(value), 0.0)


def _wind_down(message: dict[str, Any]) -> Message | None:
    """A heartbeat answer's message, if it is a wind-down this worker can read. `moved`
    (added with moves; absent from older nodes) is true only when it is `true`."""
    ns, id, deadline = message.get("ns"), message.get("id"), message.get("deadline")
    if message.get("type") != "wind_down" or not isinstance(ns, str) or not isinstance(id, str):
        return None
    if deadline is not None and _seconds(deadline) is None:
        return None
    return Message(
        msg_id=message["msgId"],
        ns=ns,
        id=id,
        deadline=_seconds(deadline),
        moved=message.get("moved") is True,
    )
