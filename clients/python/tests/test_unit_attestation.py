"""`attestation.verify` on its own: tokens minted with PyJWT, or by hand (HMAC + base64url here)
for the shapes no JWT library would produce. A fixed `now`, so the skew edges are exact."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest
from support import shared_inputs, sign

from pinboard_worker.attestation import Attestation, Binding, InvalidAttestation, Key, verify

SECRET = b"0123456789abcdef" * 4
AUD = "sess-1"
NOW = 1_700_000_000


def test_one_key_verifies_token_after_token() -> None:
    """`Key` is keyed once and copied per verification: a verification, good or bad, leaves
    nothing behind in it."""
    key = Key(SECRET)
    good = mint(claims())
    tampered = mint(claims(purpose="forward"), secret=b"x" * 64)
    for _ in range(3):
        assert verify(good, key, AUD, NOW)[0].purpose == "stats"
        with pytest.raises(InvalidAttestation, match="bad signature"):
            verify(tampered, key, AUD, NOW)
    assert key.sign(b"m") == hmac.new(SECRET, b"m", hashlib.sha256).digest()
    assert key.sign(b"m") == key.sign(b"m")


def test_headers_found_good_are_not_trusted_for_more() -> None:
    """Header parts seen good are remembered; many distinct ones, then bad ones, are each
    judged on their own."""
    for n in range(40):
        assert check(mint(claims(), headers={"kid": f"k{n}"}))
    good_part = mint(claims()).split(".")[0]
    payload = b64(json.dumps(claims()).encode())
    assert refused(f"{good_part}.{payload}.{b64(b'x' * 32)}") == "bad signature"
    assert refused(by_hand({**HEADER, "crit": ["kid"]}, claims())).startswith("header is not")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def by_hand(header: Any, payload: Any, secret: bytes = SECRET) -> str:
    """A compact JWS of these parts (JSON values, or raw bytes as they are), signed HS256."""

    def part(value: Any) -> str:
        return b64(value if isinstance(value, bytes) else json.dumps(value).encode())

    signed = f"{part(header)}.{part(payload)}"
    mac = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{b64(mac)}"


HEADER = {"alg": "HS256", "typ": "pinboard+jwt"}


def claims(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"aud": AUD, "iat": NOW, "exp": NOW + 30, "purpose": "stats"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def mint(
    payload: dict[str, Any],
    secret: bytes = SECRET,
    *,
    headers: dict[str, Any] | None = None,
    algorithm: str = "HS256",
) -> str:
    return sign(payload, secret, headers, algorithm)


def check(token: str) -> tuple[Binding, Attestation]:
    return verify(token, Key(SECRET), AUD, NOW)


def refused(token: str) -> str:
    with pytest.raises(InvalidAttestation) as why:
        check(token)
    return str(why.value)


def test_a_good_token_yields_its_binding_and_claims() -> None:
    assert check(mint(claims())) == (Binding("stats", None, None), Attestation())
    acct = {"sub": "alice", "scopes": ["a"], "claims": {"plan": "pro"}}
    token = mint(
        claims(
            purpose="forward",
            inst="/threads/b",
            epoch="17",
            caller="/threads/a",
            depth=2,
            acct=acct,
        )
    )
    assert check(token) == (
        Binding("forward", "/threads/b", "17"),
        Attestation(caller="/threads/a", depth=2, acct=acct),
    )
    # Extra header fields and claims are not refused.
    assert check(mint(claims(jti="x"), headers={"kid": "k1"}))[0].purpose == "stats"


@pytest.mark.parametrize("purpose", ["forward", "wake", "stats", "challenge"])
def test_every_known_purpose(purpose: str) -> None:
    assert check(mint(claims(purpose=purpose)))[0].purpose == purpose


def test_the_audience_is_the_session() -> None:
    assert check(mint(claims(aud=["other", AUD])))
    assert "audience" in refused(mint(claims(aud="sess-0")))
    assert "audience" in refused(mint(claims(aud=["sess-0"])))
    assert "audience" in refused(mint(claims(aud=None)))
    assert "audience" in refused(mint(claims(aud=1)))


def test_thirty_seconds_of_skew_on_both_ends() -> None:
    # exp = iat + 30: issued 60 s ago expired 30 s ago, exactly the skew.
    assert check(mint(claims(iat=NOW - 60, exp=NOW - 30)))
    assert refused(mint(claims(iat=NOW - 61, exp=NOW - 31))) == "expired"
    assert check(mint(claims(iat=NOW + 30, exp=NOW + 60)))
    assert refused(mint(claims(iat=NOW + 31, exp=NOW + 61))) == "issued in the future"
    assert check(mint(claims(nbf=NOW + 30)))
    assert refused(mint(claims(exp=NOW + 90, nbf=NOW + 31))) == "issued in the future"


def _with_time(key: str, json_text: str) -> bytes:
    """The claims with `key` spelled as `json_text` (which Python's `json` would not write)."""
    payload = claims(nbf=NOW)
    payload[key] = "TIME"
    return json.dumps(payload).replace('"TIME"', json_text).encode()


@pytest.mark.parametrize("key", ["iat", "exp", "nbf"])
@pytest.mark.parametrize("json_text", shared_inputs("not-a-numeric-date.json"))
def test_a_time_is_an_integer_from_zero_to_i64_max(key: str, json_text: str) -> None:
    assert check(by_hand(HEADER, _with_time(key, str(NOW))))
    assert refused(by_hand(HEADER, _with_time(key, json_text))) == (
        "claims are not of the expected shape"
    )


def test_the_largest_time_is_i64_max() -> None:
    assert check(by_hand(HEADER, _with_time("exp", str(2**63 - 1))))
    assert check(by_hand(HEADER, _with_time("nbf", "0")))


REMOVE = object()
"""In a case: the claim is left out."""

WRONG_SHAPES: dict[str, dict[str, Any]] = {
    "no iat": {"iat": REMOVE},
    "no exp": {"exp": REMOVE},
    "iat a string": {"iat": "now"},
    "exp a string": {"exp": "later"},
    "iat a bool": {"iat": True},
    "exp an array": {"exp": [1]},
    "nbf a string": {"nbf": "soon"},
    "exp past a float": {"exp": 10**400},
    "no purpose": {"purpose": REMOVE},
    "unknown purpose": {"purpose": "admin"},
    "purpose a number": {"purpose": 1},
    "inst a number": {"inst": 5},
    "epoch a number": {"epoch": 7},
    "caller an array": {"caller": ["/t/a"]},
    "depth negative": {"depth": -1},
    "depth past u64": {"depth": 2**64},
    "depth a bool": {"depth": True},
    "depth a float": {"depth": 1.5},
    "depth a string": {"depth": "2"},
    "acct an array": {"acct": ["alice"]},
    "acct a string": {"acct": "alice"},
}


@pytest.mark.parametrize("case", list(WRONG_SHAPES), ids=list(WRONG_SHAPES))
def test_claims_of_the_wrong_shape(case: str) -> None:
    payload = claims()
    for key, value in WRONG_SHAPES[case].items():
        if value is REMOVE:
            del payload[key]
        else:
            payload[key] = value
    assert refused(by_hand(HEADER, payload)) == "claims are not of the expected shape"


def test_depth_at_its_bounds() -> None:
    assert check(mint(claims(depth=0)))[1].depth == 0
    assert check(mint(claims(depth=2**64 - 1)))[1].depth == 2**64 - 1


def test_the_header_must_be_hs256_pinboard_jwt() -> None:
    payload = claims()
    header = "header is not"
    assert refused(mint(payload, algorithm="HS512")).startswith(header)
    assert refused(mint(payload, headers={"typ": "JWT"})).startswith(header)
    assert refused(by_hand({"alg": "HS256"}, payload)).startswith(header)
    assert refused(
        by_hand({"alg": "HS256", "typ": "pinboard+jwt", "crit": ["x"], "x": 1}, payload)
    ).startswith(header)
    assert refused(by_hand({"alg": "hs256", "typ": "pinboard+jwt"}, payload)).startswith(header)
    # alg none, unsigned, and alg none signed anyway.
    unsigned = mint(payload, algorithm="none")
    assert refused(unsigned).startswith(header)
    assert refused(by_hand({"alg": "none", "typ": "pinboard+jwt"}, payload)).startswith(header)
    # A header that is not a JSON object.
    assert refused(by_hand(["HS256"], payload)) == "not a compact JWS"


def test_the_signature_is_checked_before_the_claims() -> None:
    assert refused(mint(claims(), secret=b"another-secret-another-secret-00")) == "bad signature"
    assert refused(by_hand(HEADER, b"not json", secret=b"x" * 32)) == "bad signature"
    good = mint(claims())
    head, body, sig = good.split(".")
    flipped = sig[:-2] + ("A" if sig[-2] != "A" else "B") + sig[-1]
    assert refused(f"{head}.{body}.{flipped}") == "bad signature"
    other_body = b64(json.dumps(claims(aud="sess-1", purpose="forward")).encode())
    assert refused(f"{head}.{other_body}.{sig}") == "bad signature"


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'"a string"',
        b"\xff\xfe",
        b'{"aud": "sess-1", "iat": NaN, "exp": 1e99, "purpose": "stats"}',
        b'{"aud": "sess-1", "iat": 1, "exp": Infinity, "purpose": "stats"}',
        b"[" * 100_000,
    ],
    ids=["text", "array", "string", "not utf-8", "NaN", "Infinity", "deep nesting"],
)
def test_signed_claims_that_are_not_a_json_object(payload: bytes) -> None:
    assert refused(by_hand(HEADER, payload)) == "claims are not of the expected shape"


def test_garbage_is_not_a_compact_jws() -> None:
    good = mint(claims())
    head, body, sig = good.split(".")
    for bad in [
        *shared_inputs("not-a-token.json"),
        f"{good}.extra",
        f"{good}==",
        f"{head}=.{body}.{sig}",
        f"{head}.{body}.{sig}=",
        f" {good}",
        f"{good}\n",
        f"{head}.{body}.{sig[:-1]}",  # a length no base64 has (4n + 1) or stray bits
        f"{head}.{body}.{sig[:-1]}{'B' if sig[-1] == 'A' else 'A'}x",
        good.replace("-", "+").replace("_", "/") if ("-" in good or "_" in good) else "a+b.c.d",
    ]:
        with pytest.raises(InvalidAttestation):
            check(bad)


def test_non_canonical_base64_is_refused() -> None:
    # A signature whose last character carries bits the decoder would drop: same bytes,
    # another spelling.
    good = mint(claims())
    head, body, sig = good.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    # 32 bytes are 43 characters; the last one holds 4 meaningful bits and 2 spare.
    last = alphabet.index(sig[-1])
    sloppy = sig[:-1] + alphabet[last | 1]
    assert sloppy != sig
    assert base64.urlsafe_b64decode(sloppy + "=") == base64.urlsafe_b64decode(sig + "=")
    assert refused(f"{head}.{body}.{sloppy}") == "not a compact JWS"
