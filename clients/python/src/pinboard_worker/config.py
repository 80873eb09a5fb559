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


@dataclass(kw_only=True)
class Config:
    """Every setting is given by name."""

    registry: str
    """Pinboard's URL, with its `base_path` if it has one (`http://10.0.0.1:8080/edge`)."""
    token: str | None = None
    """A Passport credential with the `pinboard:worker` scope; or `token_file`, not both."""
    token_file: str | None = None
    """A file holding that credential, read again before every registry call (a Kubernetes
    projected service-account token, a Vault agent's sink): a token renewed there is used from
    the next call on. A file that cannot be read or holds no token keeps the last one read."""
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
    exit_on_refused_credential: bool = True
    """A heartbeat refused 401 or 403 is retried with the same session (the token file may be
    fixed meanwhile), but once the lease lapsed while refused the worker stops: it serves no
    instance, logs the refusal, and `Worker.run()`/`wait_stopped()` raise `CredentialRefused`
    (`pinboard_worker.serve` exits non-zero). False: it keeps retrying for as long as it runs."""

    def validate(self) -> str:
        """Checks every setting; the advertise URL's own path (Pinboard prefixes it to every
        path it sends), or `ConfigError`."""
        registry = urllib.parse.urlsplit(self.registry)
        if registry.scheme not in ("http", "https") or not registry.hostname:
            raise ConfigError(f"registry: {self.registry!r} is not an http or https URL")
        if self.token is not None and self.token_file is not None:
            raise ConfigError("token, token_file: one of them, not both")
        if self.token is None and self.token_file is None:
            raise ConfigError("token, token_file: one of them is needed")
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
