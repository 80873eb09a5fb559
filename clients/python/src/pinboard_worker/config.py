"""The worker's settings, checked once at start."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .durable import DurabilityStore

_NAMESPACE = re.compile(r"/[^/]+")


class ConfigError(ValueError):
    """A setting the worker cannot start with; the message names it."""


@dataclass
class Config:
    registry: str
    """Pinboard's URL, with its `base_path` if it has one (`http://10.0.0.1:8080/edge`)."""
    token: str
    """A Passport credential with the `pinboard:worker` scope."""
    client_id: str
    namespaces: list[str]
    """The namespaces served, each `/` plus one segment (`/threads`)."""
    advertise_url: str
    """Where Pinboard reaches this worker: the ASGI server's address as seen from the node
    (`http://10.0.0.7:9000`, or `https://` when the server speaks TLS)."""
    headroom: int = 100
    hostname: str | None = None
    env: str | None = None
    envs: dict[str, str] = field(default_factory=dict)
    takeover: Literal["wind_down", "deny"] | None = None
    epoch: int | None = None
    registry_ca_file: str | None = None
    """A PEM file trusted for an `https` registry besides the system roots."""
    call_timeout: float = 10.0
    """Seconds a registry call may take."""
    durability: DurabilityStore | None = None
    """A store for durable instances: mounts `POST /{ns}/{id}/_wake`."""
    wake_wait: float = 1.0
    """Seconds a `_wake` waits for the `on_wake` hook before answering 202."""

    def validate(self) -> str:
        """Checks every setting; the advertise URL's own path (Pinboard prefixes it to every
        path it sends), or `ConfigError`."""
        registry = urllib.parse.urlsplit(self.registry)
        if registry.scheme not in ("http", "https") or not registry.hostname:
            raise ConfigError(f"registry: {self.registry!r} is not an http or https URL")
        if not self.token:
            raise ConfigError("token: empty")
        if not self.client_id:
            raise ConfigError("client_id: empty")
        if not self.namespaces:
            raise ConfigError("namespaces: at least one is needed")
        for ns in self.namespaces:
            if not _NAMESPACE.fullmatch(ns):
                raise ConfigError(f"namespaces: {ns!r} is not / plus one path segment")
        advertise = urllib.parse.urlsplit(self.advertise_url)
        if advertise.scheme not in ("http", "https") or not advertise.hostname:
            raise ConfigError(f"advertise_url: {self.advertise_url!r} is not an http(s) URL")
        if advertise.username is not None or advertise.query or advertise.fragment:
            raise ConfigError("advertise_url: no userinfo, query or fragment")
        if self.headroom < 0:
            raise ConfigError("headroom: negative")
        if self.takeover not in (None, "wind_down", "deny"):
            raise ConfigError("takeover: wind_down or deny")
        if self.epoch is not None and self.epoch < 0:
            raise ConfigError("epoch: negative")
        return advertise.path.rstrip("/")
