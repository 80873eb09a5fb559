"""pinboard_worker: the Python worker library for Pinboard.

A `Worker` registers with Pinboard, proves it owns its advertise URL, keeps its lease alive by
heartbeat and holds the instances Pinboard places on it; `worker.asgi(app)` puts any ASGI app
(Starlette, FastAPI, ...) behind the checks every instance request must pass, and `serve`
runs that app under uvicorn with an exit status saying how the worker ended.
"""

from .asgi import PinnedMiddleware, instance
from .attestation import Attestation
from .config import Config, ConfigError
from .control import CredentialRefused
from .durable import DurabilityStore, FileStore
from .fencing import Fence, FencedRedis, FencedTable, StaleEpochError
from .registry import BadAnswer, CallError, NoSession, NoStore, NotHeld, Refused, Unreachable
from .serve import EXIT_CREDENTIAL_REFUSED, EXIT_NOT_STARTED, EXIT_SUPERSEDED, serve
from .types import (
    Drain,
    Event,
    Evicted,
    Instance,
    Message,
    Registered,
    Status,
    Superseded,
    WindDown,
)
from .worker import Held, Worker

__all__ = [
    "EXIT_CREDENTIAL_REFUSED",
    "EXIT_NOT_STARTED",
    "EXIT_SUPERSEDED",
    "Attestation",
    "BadAnswer",
    "CallError",
    "Config",
    "ConfigError",
    "CredentialRefused",
    "Drain",
    "DurabilityStore",
    "Event",
    "Evicted",
    "Fence",
    "FencedRedis",
    "FencedTable",
    "FileStore",
    "Held",
    "Instance",
    "Message",
    "NoSession",
    "NoStore",
    "NotHeld",
    "PinnedMiddleware",
    "Refused",
    "Registered",
    "StaleEpochError",
    "Status",
    "Superseded",
    "Unreachable",
    "WindDown",
    "Worker",
    "instance",
    "serve",
]
