"""The instances a worker holds and at which epoch, and those it released or lost in the last
minute, to refuse forwards still carrying their old epoch. Pure: the caller passes the clock
(`time.monotonic()` seconds) and the `Gate` the worker's state allows at that moment.

Everything here runs on the worker's one event loop, so an admission (read the gate, record
the instance) cannot interleave with a stop or a supersession (close the gate, forget all).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .epoch import order

GONE_FOR = 60.0
"""Seconds a released or evicted instance's epoch is remembered. Pinboard re-resolves a
resolution older than 5 s before forwarding, so a stale forward arrives well within this."""


class Admission(enum.Enum):
    """What admitting a forward to an instance decided."""

    ACTIVATED = "activated"
    """Serve it: a new activation (not held at this epoch before)."""
    SERVE = "serve"
    """Serve it: held at this epoch already."""
    STALE = "stale"
    """An older epoch than the one held or released: resolved to a placement that is gone."""
    REFUSED = "refused"
    """A request the worker must not serve now: past its lease, stopping (new activations
    only) or superseded."""


@dataclass(frozen=True)
class Gate:
    """What the worker's state allows at the moment of an admission."""

    superseded: bool
    """Nothing is served, held or not."""
    lease: bool
    """The lease is live. Past it the registry may have placed any held instance elsewhere, so
    nothing is served: a worker paused past its lease must not serve the forwards that waited
    in its sockets meanwhile."""
    activations: bool
    """New activations may be taken: the lease is live and the worker is not stopping."""


Key = tuple[str, str]


class HeldMap:
    def __init__(self) -> None:
        self._held: dict[Key, str] = {}
        self._gone: dict[Key, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, ns: str, id: str, epoch: str, now: float, gate: Gate) -> Admission:
        """Decides whether a forward to `(ns, id)` at `epoch` is served, and records the
        instance as held at that epoch when it is."""
        if gate.superseded:
            return Admission.REFUSED
        key = (ns, id)
        held = self._held.get(key)
        if held is not None:
            if order(epoch) < order(held):
                return Admission.STALE
            if order(epoch) == order(held):
                return Admission.SERVE if gate.lease else Admission.REFUSED
        gone = self._gone.get(key)
        if gone is not None and now - gone[1] < GONE_FOR and order(epoch) <= order(gone[0]):
            return Admission.STALE
        if not gate.activations:
            return Admission.REFUSED
        self._gone.pop(key, None)
        self._held[key] = epoch
        return Admission.ACTIVATED

    def epoch_of(self, ns: str, id: str) -> str | None:
        return self._held.get((ns, id))

    def forget(self, ns: str, id: str, now: float) -> str | None:
        """Stops holding `(ns, id)`, remembering its epoch for a while to refuse stale
        forwards. The epoch it was held at, if it was."""
        self._prune(now)
        epoch = self._held.pop((ns, id), None)
        if epoch is not None:
            self._remember((ns, id), epoch, now)
        return epoch

    def forget_all(self, now: float) -> list[tuple[str, str, str]]:
        """Forgets every held instance as `forget` does one: what was held, sorted
        `(ns, id, epoch)`."""
        self._prune(now)
        forgotten = self.held()
        for ns, id, epoch in forgotten:
            self._remember((ns, id), epoch, now)
        self._held.clear()
        return forgotten

    def held(self) -> list[tuple[str, str, str]]:
        """Every held instance, sorted: `(ns, id, epoch)`."""
        return sorted((ns, id, epoch) for (ns, id), epoch in self._held.items())

    def instances(self) -> dict[str, list[str]]:
        """Held ids by namespace, the shape of `instances` in register and stats."""
        by_ns: dict[str, list[str]] = {}
        for ns, id, _ in self.held():
            by_ns.setdefault(ns, []).append(id)
        return by_ns

    def _remember(self, key: Key, epoch: str, now: float) -> None:
        # Re-inserted at the end, so `_gone` stays in the order the instances went.
        self._gone.pop(key, None)
        self._gone[key] = (epoch, now)

    def _prune(self, now: float) -> None:
        """Forgets the released epochs old enough to refuse nothing any more: the oldest
        first, so each is dropped once."""
        while self._gone:
            key, (_, at) = next(iter(self._gone.items()))
            if now - at < GONE_FOR:
                return
            del self._gone[key]
