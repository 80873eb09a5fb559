"""The values the library hands the application: the `Instance` a request is for, the control
`Message`s and the `Event`s of the worker's life, and the worker's `Status`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .attestation import Attestation


@dataclass(frozen=True)
class Instance:
    """The instance an admitted request is for: `scope["pinned"]`, which
    `pinboard_worker.instance(request)` reads."""

    ns: str
    """The namespace, with its leading `/` (`/threads`)."""
    id: str
    rest: str
    """The path after `/{ns}/{id}`, possibly empty."""
    epoch: str
    """The placement epoch the request carries (`Pinboard-Epoch`), digits as sent."""
    activated: bool
    """The first request at this epoch: any in-memory state of the instance is not current."""
    attestation: Attestation = field(default_factory=Attestation)

    @property
    def caller(self) -> str | None:
        """`{ns}/{id}` of the attested instance that made this call, when one did."""
        return self.attestation.caller

    @property
    def depth(self) -> int | None:
        return self.attestation.depth

    @property
    def acct(self) -> dict[str, Any] | None:
        """`{sub, scopes?, claims}` of the client's data-plane credential, when it had one."""
        return self.attestation.acct


@dataclass(frozen=True)
class Message:
    """A control message from the registry (heartbeat `messages`)."""

    msg_id: Any
    """Acked on the next heartbeat; kept as sent."""
    ns: str
    id: str
    deadline: float | None
    """Seconds left to wind the instance down; `None` revokes an earlier wind-down."""
    moved: bool = False
    """A move (`"moved": true`): the instance goes on on another worker. Its WebSockets are
    closed with the reason `moved`."""


@dataclass(frozen=True)
class Registered:
    session_id: str
    reregistered: bool
    """A registration after the registry lost the previous session (reclaiming instances)."""


@dataclass(frozen=True)
class WindDown:
    message: Message


@dataclass(frozen=True)
class Evicted:
    """An instance the worker held that the registry placed elsewhere meanwhile (not
    reclaimed at re-registration): drop its in-memory state."""

    ns: str
    id: str


@dataclass(frozen=True)
class Drain:
    """The registry's drain state changed (the own flag or an operator's drain)."""

    draining: bool
    deadline: float | None


@dataclass(frozen=True)
class Superseded:
    """A higher-epoch registration displaced this one: nothing is served any more."""

    error: str


Event = Registered | WindDown | Evicted | Drain | Superseded


@dataclass(frozen=True)
class Status:
    """The worker's standing with the registry."""

    session_id: str | None
    lease_healthy: bool
    """The lease is known to be live: renewed less than a lease TTL ago."""
    draining: bool
    """This worker's own draining flag."""
    registry_draining: bool
    """The registry's view: the own flag or an operator's drain."""
    drain_deadline: float | None
    degraded: bool
    superseded: bool
    headroom: int
