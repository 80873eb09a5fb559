"""What the tests import is the installed distribution `pinboard-worker`, from the wheel
scripts/test-python builds (`python -m build`) and installs: not the source tree, not an
editable install. So the tests hold for what a user installs, and the wheel is complete."""

from __future__ import annotations

import importlib.metadata
import json
import sysconfig
from pathlib import Path

import pinboard_worker

SOURCE = Path(__file__).resolve().parents[1] / "src" / "pinboard_worker"


def test_the_package_is_the_installed_wheel() -> None:
    imported = Path(pinboard_worker.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    hint = "install the wheel (scripts/test-python builds and installs it)"
    assert imported == site / "pinboard_worker", f"imported from {imported}: {hint}"
    dist = importlib.metadata.distribution("pinboard-worker")
    origin = json.loads(dist.read_text("direct_url.json") or "{}")
    assert "archive_info" in origin, f"not installed from an archive ({origin}): {hint}"
    assert origin["url"].endswith("-py3-none-any.whl"), origin


def test_the_wheel_holds_every_module_and_the_typing_marker() -> None:
    dist = importlib.metadata.distribution("pinboard-worker")
    installed = {str(f) for f in dist.files or [] if str(f).startswith("pinboard_worker/")}
    sources = {f"pinboard_worker/{f.name}" for f in SOURCE.iterdir() if f.suffix == ".py"}
    assert sources, SOURCE
    assert sources | {"pinboard_worker/py.typed"} <= installed
    assert dist.metadata["Name"] == "pinboard-worker"
