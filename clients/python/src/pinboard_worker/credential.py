"""The worker's Passport credential, sent as `Authorization: Bearer` on every registry call:
`Config.token` as given, or `Config.token_file` read again before each call, so that a token
renewed on disk (a Kubernetes projected service-account token, a Vault agent's sink) is sent
from the next call on, without a restart. The file is small and calls come seconds apart, so it
is simply read each time rather than watched."""

from __future__ import annotations

import logging
import re

from .config import ConfigError

log = logging.getLogger("pinboard_worker")

MAX_TOKEN_FILE = 64 * 1024
"""Largest token file read: a JWT of a few claims is well under 4 KiB."""

_BEARER = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750's `b64token`: what may follow `Bearer ` (a JWT is three base64url parts)."""


def checked(token: str, where: str) -> str:
    """`token` when it can be sent as a bearer credential, else `ValueError` saying so."""
    if not _BEARER.fullmatch(token):
        what = "empty" if not token else "not a bearer token (a character a token cannot hold)"
        raise ValueError(f"{where}: {what}")
    return token


def read_token_file(path: str) -> str:
    """The token `path` holds, surrounding whitespace (a trailing newline) removed, or
    `ValueError` saying why there is none."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_TOKEN_FILE + 1)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    if len(raw) > MAX_TOKEN_FILE:
        raise ValueError(f"{path}: larger than {MAX_TOKEN_FILE} bytes")
    return checked(raw.decode("latin-1").strip(), path)


class Credential:
    """The token to send now. Raises `ConfigError` when there is none to start with: a bad
    `token`, or a `token_file` that cannot be read or holds no token."""

    def __init__(self, token: str | None, token_file: str | None) -> None:
        self._file = token_file
        self._unreadable: str | None = None
        """Why the file could not be read last time, so that a lasting fault is logged once."""
        try:
            if token_file is not None:
                self._token = read_token_file(token_file)
            else:
                self._token = checked(token or "", "token")
        except ValueError as e:
            raise ConfigError(f"token_file: {e}" if token_file else str(e)) from None

    def current(self) -> str:
        """The token for the next call: the file's as it is now, or when it cannot be read
        (being rewritten in place, removed by mistake) the last one read."""
        if self._file is None:
            return self._token
        try:
            token = read_token_file(self._file)
        except ValueError as e:
            if str(e) != self._unreadable:
                log.warning("token_file unreadable; sending the last token read: %s", e)
                self._unreadable = str(e)
            return self._token
        self._unreadable = None
        if token != self._token:
            log.info("token_file %s holds a new token; sent from this call on", self._file)
            self._token = token
        return token
