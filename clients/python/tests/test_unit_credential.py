"""The worker's credential: `token` or `token_file` (one of them), checked at start, and the
file read again for every call, keeping the last token read while the file holds none."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pinboard_worker import Config, ConfigError, Worker
from pinboard_worker.credential import MAX_TOKEN_FILE, Credential

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl"


def _config(**credential: str | None) -> Config:
    return Config(
        registry="http://127.0.0.1:8080",
        client_id="c",
        namespaces=["/threads"],
        advertise_url="http://127.0.0.1:9000",
        **credential,  # type: ignore[arg-type]
    )


def test_one_of_token_and_token_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(JWT)
    with pytest.raises(ConfigError, match=r"^token, token_file: one of them, not both$"):
        Worker(_config(token=JWT, token_file=str(path)))
    with pytest.raises(ConfigError, match=r"^token, token_file: one of them is needed$"):
        Worker(_config())
    Worker(_config(token=JWT))
    Worker(_config(token_file=str(path)))


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("", "empty"),
        (f"{JWT}\n", "not a bearer token"),
        (f"Bearer {JWT}", "not a bearer token"),
        ("a\r\nx-injected: 1", "not a bearer token"),
        ("tok\u00e9n", "not a bearer token"),
        ("=abc", "not a bearer token"),
    ],
)
def test_a_token_that_cannot_be_sent_is_refused_at_start(token: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"^token: {why}"):
        Worker(_config(token=token))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "empty"),
        (b" \n\t\n", "empty"),
        (b"two tokens", "not a bearer token"),
        (b"a\x00b", "not a bearer token"),
        (b"\xff\xfe", "not a bearer token"),
        (b"a" * (MAX_TOKEN_FILE + 1), f"larger than {MAX_TOKEN_FILE} bytes"),
    ],
)
def test_a_token_file_without_a_token_is_refused_at_start(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"^token_file: {path}: {why}"):
        Worker(_config(token_file=str(path)))


def test_a_token_file_that_cannot_be_read_is_refused_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match=f"^token_file: {missing}: No such file or directory"):
        Worker(_config(token_file=str(missing)))
    with pytest.raises(ConfigError, match=f"^token_file: {tmp_path}: Is a directory"):
        Worker(_config(token_file=str(tmp_path)))


def test_the_file_is_read_for_every_call(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first.token.x\n")  # as `pinboard token > file` writes it
    credential = Credential(None, str(path))
    assert credential.current() == "first.token.x"

    # Replaced as Kubernetes and Vault agents do (a new file renamed over the old one) ...
    fresh = tmp_path / "token.new"
    fresh.write_text("second.token.y")
    os.replace(fresh, path)
    assert credential.current() == "second.token.y"
    # ... or rewritten in place, same size, within the same clock tick: read, not stat'ed.
    path.write_text("second.token.z")
    assert credential.current() == "second.token.z"


def test_a_kubernetes_projected_token_is_followed_through_its_symlinks(tmp_path: Path) -> None:
    """A projected volume: `token` -> `..data/token`, `..data` -> a timestamped directory,
    swapped atomically for a new directory when the kubelet renews the token."""
    for name, token in (("..2026_01", "first.token"), ("..2026_02", "second.token")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "token").write_text(token)
    (tmp_path / "..data").symlink_to("..2026_01")
    (tmp_path / "token").symlink_to("..data/token")
    credential = Credential(None, str(tmp_path / "token"))
    assert credential.current() == "first.token"

    (tmp_path / "..data_tmp").symlink_to("..2026_02")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert credential.current() == "second.token"


def test_a_file_without_a_token_keeps_the_last_one_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("first.token")
    credential = Credential(None, str(path))
    caplog.set_level(logging.WARNING, "pinboard_worker")

    path.write_text("")  # truncated by a writer that has not written yet
    assert credential.current() == "first.token"
    assert credential.current() == "first.token"
    path.unlink()
    assert credential.current() == "first.token"
    assert credential.current() == "first.token"
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        f"token_file unreadable; sending the last token read: {path}: empty",
        f"token_file unreadable; sending the last token read: {path}: No such file or directory",
    ], "each lasting fault is logged once"

    path.write_text("second.token")
    assert credential.current() == "second.token"


def test_a_token_string_is_sent_as_given() -> None:
    assert Credential(JWT, None).current() == JWT
