"""What the worker's parts share on its event loop: its identity (secret, advertise URL), the
state the registry protocol moves (session, lease, challenges, flags, the control messages
received), the instances it holds (`HeldMap`) and the goodbyes of their open WebSockets
(`Goodbyes`).

The lease is reckoned on `time.monotonic()` from when the renewing call was *sent*, so it ends
before the registry's view of it does.
"""

from __future__ import annotations

import secrets
import time
from collections import deque

from .config import Config
from .goodbye import Goodbyes
from .held import Admission, Gate, HeldMap
from .types import Message, Status

MESSAGES_KEPT = 1024
"""Control messages kept for `Worker.messages()`."""


class State:
    def __init__(self, config: Config, base: str) -> None:
        self.config = config
        self.base = base
        """The advertise URL's own path: Pinboard puts it before every path it sends."""
        self.secret = secrets.token_hex(32)
        """Random per process; Pinboard signs attestations with it and presents it on the
        probe."""
        self.started = time.monotonic()
        self.held = HeldMap()
        self.session: str | None = None
        self.lease_until: float | None = None
        # (challenge, value): the current one and the one before, since a probe of one call
        # may arrive while the next is already under way.
        self._challenges: deque[tuple[str, str]] = deque(maxlen=2)
        self.headroom = config.headroom
        self.draining = False
        self.registry_draining = False
        self.drain_deadline: float | None = None
        self.degraded = False
        self.superseded = False
        self.stopping = False
        """Set when a graceful stop begins: no new activations from then on."""
        self.messages: deque[Message] = deque(maxlen=MESSAGES_KEPT)
        self.goodbyes = Goodbyes()
        """The goodbyes of the instances' open WebSockets."""

    def next_challenge(self) -> tuple[str, str]:
        """A fresh challenge for the next registry call, which becomes the current one."""
        fresh = (secrets.token_hex(16), secrets.token_hex(32))
        self._challenges.appendleft(fresh)
        return fresh

    def challenge_value(self, challenge: str) -> str | None:
        for known, value in self._challenges:
            if secrets.compare_digest(known.encode(), challenge.encode()):
                return value
        return None

    def lease_healthy(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.lease_until is not None and now < self.lease_until

    def gate(self, now: float) -> Gate:
        lease = self.lease_healthy(now)
        return Gate(
            superseded=self.superseded, lease=lease, activations=lease and not self.stopping
        )

    def admit(self, ns: str, id: str, epoch: str) -> Admission:
        now = time.monotonic()
        admission = self.held.admit(ns, id, epoch, now, self.gate(now))
        if admission is Admission.ACTIVATED:
            # A newer epoch here: the older one's WebSockets are over.
            self.goodbyes.newer_epoch(ns, id, epoch)
        return admission

    def status(self) -> Status:
        return Status(
            session_id=self.session,
            lease_healthy=self.lease_healthy(),
            draining=self.draining,
            registry_draining=self.registry_draining,
            drain_deadline=self.drain_deadline,
            degraded=self.degraded,
            superseded=self.superseded,
            headroom=self.headroom,
        )
