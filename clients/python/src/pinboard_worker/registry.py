"""Calls to the registry's worker routes (`POST {registry}/registry/{route}`): one JSON
request each, the answer turned into its JSON object or a `CallError` that says whether to
register again, give up or try again."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

import httpx

from .credential import Credential

log = logging.getLogger("pinboard_worker")

MAX_ANSWER = 8 * 1024 * 1024
"""Largest registry answer read. Answers are small; register's `duplicates` is the largest."""
RETRY_PAUSE = 0.25
"""Seconds before the second and third try of a call that gives up after three."""


class CallError(Exception):
    """A registry call that did not succeed."""

    @property
    def transient(self) -> bool:
        """Whether sending the same call again may succeed."""
        return False


class NoSession(CallError):
    def __init__(self) -> None:
        super().__init__("the worker holds no session")


class NotHeld(CallError):
    def __init__(self, ns: str, id: str) -> None:
        super().__init__(f"{ns}/{id} is not held by this worker")


class NoStore(CallError):
    def __init__(self) -> None:
        super().__init__("the worker has no durability store")


class Refused(CallError):
    """The registry answered with an error status."""

    def __init__(
        self, status: int, error: str, *, reregister: bool = False, superseded: bool = False
    ) -> None:
        super().__init__(f"registry answered {status}: {error}")
        self.status = status
        self.error = error
        self.reregister = reregister
        """The registry lost the session: register again (from the heartbeat path only)."""
        self.superseded = superseded
        """A higher-epoch registration displaced this one."""

    @property
    def transient(self) -> bool:
        return self.status >= 500


class Unreachable(CallError):
    @property
    def transient(self) -> bool:
        return True


class BadAnswer(CallError):
    def __init__(self, status: int) -> None:
        super().__init__(f"registry answered {status} with a body that is not a JSON object")


class Registry:
    def __init__(
        self, url: str, credential: Credential, timeout: float, ca_file: str | None
    ) -> None:
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            verify = ssl.create_default_context()
            verify.load_verify_locations(cafile=ca_file)
        self._credential = credential
        self._client = httpx.AsyncClient(
            timeout=timeout,
            verify=verify,
            follow_redirects=False,
            trust_env=False,
        )
        self._base = url.rstrip("/")

    async def close(self) -> None:
        await self._client.aclose()

    async def post(self, route: str, body: Any) -> dict[str, Any]:
        """`POST /registry/{route}` with `body`; the answer's object on a 2xx."""
        # The credential as it is now: a token file renewed meanwhile is sent from this call on.
        authorization = {"authorization": f"Bearer {self._credential.current()}"}
        try:
            async with self._client.stream(
                "POST", f"{self._base}/registry/{route}", json=body, headers=authorization
            ) as answer:
                raw = bytearray()
                async for chunk in answer.aiter_bytes():
                    raw += chunk
                    if len(raw) > MAX_ANSWER:
                        raise Unreachable(f"{route}: answer over {MAX_ANSWER} bytes")
                status = answer.status_code
        except httpx.HTTPError as e:
            raise Unreachable(f"{route}: {type(e).__name__}: {e}") from e
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        obj = value if isinstance(value, dict) else None
        if 200 <= status < 300:
            if obj is None:
                raise BadAnswer(status)
            return obj
        obj = obj or {}
        error = obj.get("error")
        raise Refused(
            status,
            error if isinstance(error, str) else bytes(raw).decode("utf-8", "replace"),
            reregister=obj.get("reregister") is True,
            superseded=obj.get("superseded") is True,
        )

    async def post_thrice(self, route: str, body: Any) -> dict[str, Any]:
        """`post`, tried up to three times while the failure is transient (the registry
        unreachable or answering 5xx); then the last failure is raised."""
        tries = 1
        while True:
            try:
                return await self.post(route, body)
            except CallError as e:
                if not e.transient or tries == 3:
                    raise
                log.debug("registry call %s failed (try %d): %s; retrying", route, tries, e)
            tries += 1
            await asyncio.sleep(RETRY_PAUSE)
