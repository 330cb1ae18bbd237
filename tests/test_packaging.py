"""The distribution users install: one import name, typed, and the demo runs from it (ADR 0016)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EVENTS_FROM_THE_INDEX = "events==0.5"
"""A package of the index that owns the import name ``events``; it must keep working beside us."""

PROBE = """
import importlib.metadata as md, json, sys
import events
from events import Events  # the index package's API, not ours
import journaled, journaled.events.codec, journaled.actors.executor
files = md.distribution("journaled").files or []
tops = sorted({f.parts[0] for f in files if f.parts[0] not in ("..",)})
try:
    import actors
    actors_file = actors.__file__
except ModuleNotFoundError:
    actors_file = None
print(json.dumps({
    "events": events.__file__,
    "events_has_Events": callable(Events),
    "journaled": journaled.__file__,
    "layer": journaled.events.codec.__file__,
    "tops": tops,
    "actors": actors_file,
    "typed": any(f.name == "py.typed" for f in files),
}))
"""


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "JOURNALED_"))}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Build the sdist, then the wheel from that sdist (as a package index user would get it)."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], ROOT)
    (wheel,) = out.glob("journaled-*.whl")
    (sdist,) = out.glob("journaled-*.tar.gz")
    return wheel, sdist


def test_the_wheel_holds_one_top_level_name_and_is_typed(artifacts: tuple[Path, Path]) -> None:
    """Packaging: the wheel's files live under journaled/ (layers included) plus its dist-info."""
    wheel, _ = artifacts
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"journaled", f"{wheel.name.split('-py3')[0]}.dist-info"}
    assert "journaled/py.typed" in names
    assert "journaled/events/codec.py" in names
    assert "journaled/actors/executor.py" in names
    assert "journaled/timeline.html" in names
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/METADATA")
    text = metadata.decode()
    assert "License-Expression: MIT" in text
    assert "Classifier: Typing :: Typed" in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_installed_beside_the_index_events_package(
    artifacts: tuple[Path, Path], tmp_path: Path
) -> None:
    """Packaging: in a fresh venv, `events` stays the index's package and `journaled demo` runs."""
    wheel, _ = artifacts
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, EVENTS_FROM_THE_INDEX], tmp_path)
    before = _run([str(python), "-c", "import events; print(events.__file__)"], tmp_path)
    _run([*pip, str(wheel)], tmp_path)

    probe = json.loads(_run([str(python), "-c", PROBE], tmp_path).stdout)
    assert probe["events"] == before.stdout.strip()  # still the index's `events`, not ours
    assert probe["events_has_Events"]
    assert probe["layer"].startswith(str(venv))
    assert Path(probe["layer"]).parent.parent == Path(probe["journaled"]).parent
    assert probe["tops"] == ["journaled", wheel.name.split("-py3")[0] + ".dist-info"]
    assert probe["actors"] is None  # installing journaled added no `actors`
    assert probe["typed"]

    version = _run([str(venv / "bin" / "journaled"), "--version"], tmp_path).stdout
    assert "0.1.0" in version
    demo = _run([str(venv / "bin" / "journaled"), "demo", "--human-delay", "0.05"], tmp_path)
    assert "superseded" in demo.stdout
    assert (tmp_path / ".journaled" / "journal.sqlite").exists()
