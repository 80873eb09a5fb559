"""The middleware's pure helpers (which paths are instance paths, the challenge's query
parameter) and the settings a worker refuses to start with."""

from __future__ import annotations

import pytest

from pinboard_worker import Config, ConfigError, Worker
from pinboard_worker.asgi import header_values, query_param, split_instance

NAMESPACES = ["/threads", "/docs"]


@pytest.mark.parametrize(
    ("path", "split"),
    [
        ("/threads/a", ("/threads", "a", "")),
        ("/threads/a/", ("/threads", "a", "/")),
        ("/threads/a/b/c", ("/threads", "a", "/b/c")),
        ("/docs/x/_wake", ("/docs", "x", "/_wake")),
        ("/threads/", None),
        ("/threads", None),
        ("/threads//a", None),
        ("/other/a", None),
        ("/thread/a", None),
        ("/_pinned/stats", None),
        ("threads/a", None),
        ("/", None),
        ("", None),
    ],
)
def test_instance_paths(path: str, split: tuple[str, str, str] | None) -> None:
    assert split_instance(path, NAMESPACES) == split


def test_query_param() -> None:
    assert query_param("challenge=abc", "challenge") == "abc"
    assert query_param("x=1&challenge=a%2Fb&challenge=second", "challenge") == "a/b"
    assert query_param("challenge=a+b", "challenge") == "a+b"
    assert query_param("chall%65nge=c", "challenge") == "c"
    assert query_param("challenge", "challenge") == ""
    assert query_param("", "challenge") is None
    assert query_param("other=1", "challenge") is None


def test_header_values_keep_every_copy() -> None:
    scope = {"headers": [(b"pinboard-epoch", b"7"), (b"x", b"y"), (b"Pinboard-Epoch", b"\xb2")]}
    assert header_values(scope, b"pinboard-epoch") == ["7", "\u00b2"]
    assert header_values(scope, b"missing") == []


def _config(**kw: object) -> Config:
    settings: dict[str, object] = {
        "registry": "http://127.0.0.1:8080",
        "token": "t",
        "client_id": "c",
        "namespaces": ["/threads"],
        "advertise_url": "http://127.0.0.1:9000",
    }
    settings.update(kw)
    return Config(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("registry", "ftp://x"),
        ("registry", "127.0.0.1:8080"),
        ("token", ""),
        ("client_id", ""),
        ("namespaces", []),
        ("namespaces", ["threads"]),
        ("namespaces", ["/a/b"]),
        ("namespaces", ["/"]),
        ("advertise_url", "http://"),
        ("advertise_url", "http://u:p@127.0.0.1:9000"),
        ("advertise_url", "http://127.0.0.1:9000/?q=1"),
        ("advertise_url", "http://127.0.0.1:9000/#f"),
        ("headroom", -1),
        ("takeover", "always"),
        ("epoch", -1),
    ],
)
def test_a_bad_setting_is_refused_by_name(setting: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"^{setting}:"):
        Worker(_config(**{setting: value}))


def test_the_advertise_urls_path_is_the_base() -> None:
    assert _config(advertise_url="http://127.0.0.1:9000/edge/").validate() == "/edge"
    assert _config().validate() == ""
