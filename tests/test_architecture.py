"""The three layers import one way, and each package's public surface is pinned (STYLE)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("events", "actors", "journaled")
FORBIDDEN = {
    "events": {"journaled.actors", "journaled.door", "pykka"},
    "actors": {"journaled.door"},
    "journaled": set(),
}
"""What each layer must not import (``journaled.door``: a ``journaled`` module outside a layer)."""


def _layer_of(module: str) -> str:
    """Name what an absolute import points at: a layer, the door, or a third-party package."""
    parts = module.split(".")
    if parts[0] != "journaled":
        return parts[0]
    if len(parts) > 1 and parts[1] in ("events", "actors"):
        return f"journaled.{parts[1]}"
    return "journaled.door"


def _modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _imports(path: Path) -> set[str]:
    return {_layer_of(module) for module in _modules(path)}


def _sources(package: str) -> list[Path]:
    """Return a layer's own files (the links under journaled/ are read as the layers they are)."""
    base = ROOT / package
    return [p for p in base.rglob("*.py") if p.relative_to(base).parts[0] not in LAYERS]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    """Layers: events never imports actors/the door/pykka; actors never imports the door."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & FORBIDDEN[package])
        for path in _sources(package)
        if _imports(path) & FORBIDDEN[package]
    }
    assert offenders == {}


def test_only_the_journal_adapter_imports_eventsourcing() -> None:
    """Layers: eventsourcing is imported by the journal adapter (events/journal/) alone."""
    users = sorted(
        str(p.relative_to(ROOT))
        for pkg in FORBIDDEN
        for p in _sources(pkg)
        if "eventsourcing" in _imports(p)
    )
    assert users
    assert all(u.startswith("events/journal/") for u in users), users


def test_no_module_imports_the_layers_by_their_bare_names() -> None:
    """Packaging (ADR 0016): code imports journaled.events/journaled.actors, never events/actors."""
    tracked = [ROOT / p for p in ("journaled", "actors", "events", "tests", "bench")]
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {module}"
        for base in tracked
        for path in base.rglob("*.py")
        if base.name != "journaled" or path.relative_to(base).parts[0] not in LAYERS
        for module in _modules(path)
        if module.split(".")[0] in ("events", "actors")
    )
    assert offenders == []


@pytest.mark.parametrize("layer", ["events", "actors"])
def test_layers_are_reached_through_the_journaled_package(layer: str) -> None:
    """Packaging (ADR 0016): journaled/<layer> is a link to the top-level <layer> directory."""
    link = ROOT / "journaled" / layer
    assert link.is_symlink()
    assert link.resolve() == (ROOT / layer).resolve()


def test_public_api_is_pinned() -> None:
    """SPEC section 5: the names users import from journaled, sorted, and nothing missing."""
    import journaled

    assert journaled.__all__ == sorted(journaled.__all__)
    for name in journaled.__all__:
        assert hasattr(journaled, name), name
    expected = {
        "open",
        "Runtime",
        "Fact",
        "Event",
        "Deletion",
        "RunState",  # what runs.at returns, named in section 5
        "ExecuteResult",
        "Outcome",
        "InvalidFact",
        "OrganizationNotConfigured",
        "CorruptEvent",
        "ConcurrencyConflict",
        "JournalUrlError",
        # The value types release 2's sections name (F3, P2, P3, T2, R7).
        "RunComparison",
        "StepComparison",
        "Lineage",
        "Use",
        "Stale",
        "RunSummary",
        "VerifyReport",
    }
    assert expected <= set(journaled.__all__)
