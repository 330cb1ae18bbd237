"""The three layers import one way, and each package's public surface is pinned (STYLE)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "events": {"actors", "journaled", "pykka"},
    "actors": {"journaled"},
    "journaled": set(),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    """Layers: events never imports actors/journaled/pykka; actors never imports journaled."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
        if _imports(path) & FORBIDDEN[package]
    }
    assert offenders == {}


def test_only_the_journal_adapter_imports_eventsourcing() -> None:
    """Layers: eventsourcing is imported by the journal adapter (events/journal/) alone."""
    users = sorted(
        str(p.relative_to(ROOT))
        for pkg in FORBIDDEN
        for p in (ROOT / pkg).rglob("*.py")
        if "eventsourcing" in _imports(p)
    )
    assert users
    assert all(u.startswith("events/journal/") for u in users), users


@pytest.mark.parametrize("package", ["events", "actors"])
def test_generic_package_names_resolve_to_this_distribution(package: str) -> None:
    """Packaging: `events` and `actors` are ours, not a shadowing module of the same name."""
    module = importlib.import_module(package)
    assert module.__file__ is not None
    assert Path(module.__file__).resolve().parent == ROOT / package


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
        "InvalidFact",
        "OrganizationNotConfigured",
        "CorruptEvent",
        "ConcurrencyConflict",
        "JournalUrlError",
    }
    assert expected <= set(journaled.__all__)
