"""`Pinboard-Attestation` verification: the compact JWS Pinboard signs onto every forwarded
request, `_wake` and `_pinned/stats` call. Pure: no IO, no clock (the caller passes `now`).

Written out with the standard library rather than a JWT library because the rules are narrow
and exact: header `{"alg":"HS256","typ":"pinboard+jwt"}` and no `crit`, HMAC-SHA256 under the
worker's own secret compared in constant time, `aud` equal to its current session, `iat` and
`exp` both required, integers from 0 to 2^63 - 1, and judged with 30 s of clock skew (`nbf`
too when present), and a `purpose` (`forward`, `wake`, `stats`, `challenge`). A
general-purpose validator would need each of these switched on and would still not check
`typ` or a future `iat`.

A token is bound to what it is for: `verify` returns its `Binding` (purpose, and for forwards
and wakes the instance `inst` = `{ns}/{id}` and the placement `epoch`); the middleware holds it
against the request, so a token seen once cannot be replayed on another route, instance or
epoch.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any

SKEW_SECS = 30.0
"""Clock skew tolerated on `iat`, `exp` and `nbf`."""

PURPOSES = frozenset({"forward", "wake", "stats", "challenge"})

_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


class InvalidAttestation(Exception):
    """Why a token was refused. Every reason is answered with the same 403; this is for logs."""


@dataclass(frozen=True)
class Attestation:
    """What a valid attestation tells the worker beyond "Pinboard sent this"."""

    caller: str | None = None
    """`{ns}/{id}` of the attested instance that made this call, when one did."""
    depth: int | None = None
    """The subrequest depth Pinboard counted for this call."""
    acct: dict[str, Any] | None = None
    """`{sub, scopes?, claims}` of the client's data-plane credential, when it had one."""


@dataclass(frozen=True)
class Binding:
    """What a valid token is for, checked against the route it arrived on."""

    purpose: str
    inst: str | None
    epoch: str | None


class Key:
    """A worker secret's HMAC-SHA256 state, keyed once: each verification copies it rather than
    hashing the key again."""

    def __init__(self, secret: bytes) -> None:
        self._keyed = hmac.new(secret, digestmod=hashlib.sha256)

    def sign(self, message: bytes) -> bytes:
        mac = self._keyed.copy()
        mac.update(message)
        return mac.digest()


def verify(token: str, key: Key, audience: str, now: float) -> tuple[Binding, Attestation]:
    """Verifies `token` as signed with `key` for session `audience` at `now` (seconds since
    the Unix epoch). Raises `InvalidAttestation`. What the token is bound to is the caller's to
    check."""
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidAttestation("not a compact JWS")
    header_part, payload_part, signature_part = parts
    _check_header(header_part)
    signature = _decode(signature_part)
    if signature is None:
        raise InvalidAttestation("not a compact JWS")
    expected = key.sign(f"{header_part}.{payload_part}".encode("ascii"))
    if not hmac.compare_digest(expected, signature):
        raise InvalidAttestation("bad signature")

    # The claims are read only once the signature holds.
    claims = _decode_object(payload_part)
    if claims is None:
        raise InvalidAttestation("claims are not of the expected shape")
    aud = claims.get("aud")
    if not (aud == audience or (isinstance(aud, list) and audience in aud)):
        raise InvalidAttestation("audience is not this worker's session")
    iat, exp = _time(claims, "iat"), _time(claims, "exp")
    if iat is None or exp is None:
        raise InvalidAttestation("claims are not of the expected shape")
    nbf = _time(claims, "nbf")
    if exp + SKEW_SECS < now:
        raise InvalidAttestation("expired")
    if iat > now + SKEW_SECS or (nbf is not None and nbf > now + SKEW_SECS):
        raise InvalidAttestation("issued in the future")
    purpose = _text(claims, "purpose")
    if purpose is None or purpose not in PURPOSES:
        raise InvalidAttestation("claims are not of the expected shape")
    depth = claims.get("depth")
    if depth is not None and not (_is_int(depth) and 0 <= depth < 2**64):
        raise InvalidAttestation("claims are not of the expected shape")
    acct = claims.get("acct")
    if acct is not None and not isinstance(acct, dict):
        raise InvalidAttestation("claims are not of the expected shape")
    binding = Binding(purpose=purpose, inst=_text(claims, "inst"), epoch=_text(claims, "epoch"))
    return binding, Attestation(caller=_text(claims, "caller"), depth=depth, acct=acct)


_GOOD_HEADERS: set[str] = set()
"""Header parts already found good: Pinboard sends one, so it is decoded once."""
_GOOD_HEADERS_KEPT = 16


def _check_header(part: str) -> None:
    if part in _GOOD_HEADERS:
        return
    header = _decode_object(part)
    if header is None:
        raise InvalidAttestation("not a compact JWS")
    # A `crit` header names extensions the signer requires us to understand (RFC 7515
    # §4.1.11); we understand none.
    if header.get("alg") != "HS256" or header.get("typ") != "pinboard+jwt" or "crit" in header:
        raise InvalidAttestation('header is not {"alg":"HS256","typ":"pinboard+jwt"}')
    if len(_GOOD_HEADERS) < _GOOD_HEADERS_KEPT:
        _GOOD_HEADERS.add(part)


_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
# The bits of the last character that carry no data, by the part's length mod 4: set in a
# non-canonical encoding.
_UNUSED_BITS = {2: 0x0F, 3: 0x03}


def _decode(part: str) -> bytes | None:
    """Unpadded base64url, canonical only (as Rust's `URL_SAFE_NO_PAD`: no padding, no other
    alphabet, no stray trailing bits)."""
    rem = len(part) % 4
    if rem == 1 or not _BASE64URL.fullmatch(part):
        return None
    if rem and _ALPHABET.index(part[-1]) & _UNUSED_BITS[rem]:
        return None
    try:
        return base64.urlsafe_b64decode(part + "=" * (-rem % 4))
    except (binascii.Error, ValueError):
        return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_object(part: str) -> dict[str, Any] | None:
    raw = _decode(part)
    if raw is None:
        return None
    try:
        value = _JSON.decode(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _time(claims: dict[str, Any], key: str) -> int | None:
    """A NumericDate claim: an integer from 0 to 2^63 - 1, as Pinboard mints them and as the
    Rust library takes them. Anything else (`1.5`, `1e400` (which `json` reads as infinity),
    `true`, `null`, a string, a negative or larger number) is a malformed token, not an absent
    one."""
    if key not in claims:
        return None
    value = claims[key]
    if not (_is_int(value) and 0 <= value < 2**63):
        raise InvalidAttestation("claims are not of the expected shape")
    return int(value)


def _text(claims: dict[str, Any], key: str) -> str | None:
    value = claims.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidAttestation("claims are not of the expected shape")
    return value
