"""Odd inputs and races against the group options of the command line (section 11, O7), the
embedder kept in a memory's component config (X1, M7, ADR 0092) and the bounded cache of run
owners (R1, ADR 0093)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from autogen_core import ComponentModel
from click.testing import CliRunner

import journaled
from journaled import Plan, Step
from journaled.aio import AsyncRuntime
from journaled.cli import main
from journaled.embedders import OpenAIEmbeddings
from journaled.errors import ConfigurationError
from journaled.events import tenancy
from journaled.integrations.autogen import JournaledMemory
from journaled.testing import KeywordEmbedder, ManualClock

# --- ADR 0092: what load_component builds from a config ------------------------------------


def _dumped(url: str) -> dict[str, Any]:
    """Return, as JSON gives it back, the config of a memory over a KeywordEmbedder."""

    async def body() -> dict[str, Any]:
        async with journaled.aio.open(url, embedder=KeywordEmbedder(["cat"])) as rt:
            model = JournaledMemory(rt, "session").dump_component()
            loaded: dict[str, Any] = json.loads(model.model_dump_json())
            return loaded

    return asyncio.run(body())


def _with_embedder(tmp_path: Path, embedder: object) -> tuple[dict[str, Any], Path]:
    """Return a config naming ``embedder`` over a journal that does not exist yet, and its file."""
    model = _dumped(f"sqlite:///{tmp_path / 'journal.sqlite'}")
    fresh = tmp_path / "fresh.sqlite"
    model["config"] = {**model["config"], "url": f"sqlite:///{fresh}", "embedder": embedder}
    return model, fresh


@pytest.mark.parametrize(
    "provider",
    [
        "",
        ".",
        ".journaled.testing.KeywordEmbedder",
        "journaled..testing.KeywordEmbedder",
        "journaled.testing.KeywordEmbedder ",
        "journaled.testing.KeywordEmbedder.__class__",
        "builtins.eval",
        "builtins.type",
        "journaled.embedders.config.importlib.import_module",
    ],
    ids=[
        "empty",
        "a-dot",
        "relative",
        "empty-part",
        "trailing-space",
        "metaclass",
        "eval",
        "type",
        "nested-function",
    ],
)
def test_a_provider_of_any_shape_is_refused_naming_it(tmp_path: Path, provider: str) -> None:
    """X1/ADR 0092: a provider that names no embedder class is refused by a ConfigurationError
    naming it, before a journal is opened, whatever its shape (a relative path included)."""
    model, fresh = _with_embedder(tmp_path, {"provider": provider, "config": {}})
    with pytest.raises(ConfigurationError) as caught:
        JournaledMemory.load_component(model)
    assert str(caught.value).startswith("the JournaledMemory config's embedder ")
    assert repr(provider) in str(caught.value) or provider in str(caught.value)
    assert not fresh.exists()


def test_a_provider_whose_module_fails_to_import_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X1/ADR 0092: a provider whose module raises while imported "cannot be imported": a
    ConfigurationError naming it, not the module's own exception."""
    (tmp_path / "attack_boom_at_import.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model, fresh = _with_embedder(
        tmp_path, {"provider": "attack_boom_at_import.Embedder", "config": {}}
    )
    with pytest.raises(ConfigurationError) as caught:
        JournaledMemory.load_component(model)
    assert "'attack_boom_at_import.Embedder' cannot be imported" in str(caught.value)
    assert "boom at import" in str(caught.value)
    assert not fresh.exists()
    sys.modules.pop("attack_boom_at_import", None)


def test_a_class_without_embedder_config_is_never_constructed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0092: the class check comes before the call, so a class that is no embedder never
    runs its constructor (here one that would write a file)."""
    marker = tmp_path / "constructed"
    (tmp_path / "attack_noisy_class.py").write_text(
        "from pathlib import Path\n"
        "class Noisy:\n"
        "    def __init__(self, path):\n"
        "        Path(path).write_text('ran')\n"
        "    def embed(self, texts):\n"
        "        return [[1.0] for _ in texts]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model, fresh = _with_embedder(
        tmp_path, {"provider": "attack_noisy_class.Noisy", "config": {"path": str(marker)}}
    )
    with pytest.raises(ConfigurationError, match="is not an embedder class"):
        JournaledMemory.load_component(model)
    assert not marker.exists()
    assert not fresh.exists()
    sys.modules.pop("attack_noisy_class", None)


@pytest.mark.parametrize(
    "embedder",
    [
        {"provider": 3, "config": {}},
        {"provider": "journaled.testing.KeywordEmbedder", "config": ["cat"]},
        {"provider": "journaled.testing.KeywordEmbedder", "config": "cat"},
        {"provider": "journaled.testing.KeywordEmbedder"},
        {"provider": "journaled.testing.KeywordEmbedder", "config": {}, "extra": 1},
        "journaled.testing.KeywordEmbedder",
    ],
    ids=["int-provider", "list-config", "str-config", "no-config", "extra-key", "a-string"],
)
def test_an_embedder_entry_of_the_wrong_shape_opens_no_journal(
    tmp_path: Path, embedder: object
) -> None:
    """X1: an embedder entry that is not {provider: str, config: object} is refused by the
    config's schema before a journal file is made."""
    model, fresh = _with_embedder(tmp_path, embedder)
    with pytest.raises(ValueError, match="embedder"):
        JournaledMemory.load_component(model)
    assert not fresh.exists()


def test_a_key_written_into_a_hand_made_config_stays_out_of_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0092: an OpenAI key a hand-written config holds is named by no error of load (bad
    arguments) nor of dumping the loaded memory again (api_key= refused)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    secret = "sk-attack-secret-0123456789"
    base = {"model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": secret}
    provider = "journaled.embedders.OpenAIEmbeddings"
    model, _ = _with_embedder(tmp_path, {"provider": provider, "config": {**base, "batch_size": 0}})
    with pytest.raises(ConfigurationError) as bad:
        JournaledMemory.load_component(model)
    assert secret not in str(bad.value)
    model, _ = _with_embedder(tmp_path, {"provider": provider, "config": base})

    async def reload() -> None:
        loaded = JournaledMemory.load_component(model)
        try:
            assert secret not in repr(loaded._rt.memory.embedder)
            with pytest.raises(ConfigurationError) as dumped:
                loaded.dump_component()
            assert "api_key=" in str(dumped.value)
            assert secret not in str(dumped.value)
        finally:
            await loaded.close()

    asyncio.run(reload())


class _Unimportable:
    """An embedder class whose module no import can find (as a class made at run time)."""

    vocabulary = ("cat",)

    def embedder_config(self) -> dict[str, object]:
        return {}

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0] for _ in texts]


_Unimportable.__module__ = "attack_no_such_module_anywhere"


def test_an_embedder_whose_module_cannot_be_imported_is_refused_at_dump(sqlite_url: str) -> None:
    """ADR 0092: dump_component raises ConfigurationError naming an embedder whose class cannot
    be imported by its path, also when no module of that path exists (not a bare ImportError)."""

    async def body(rt: AsyncRuntime) -> None:
        with pytest.raises(ConfigurationError) as caught:
            JournaledMemory(rt).dump_component()
        assert "attack_no_such_module_anywhere._Unimportable" in str(caught.value)
        assert "cannot be imported" in str(caught.value)

    async def run() -> None:
        async with journaled.aio.open(sqlite_url, embedder=_Unimportable()) as rt:
            await body(rt)

    asyncio.run(run())


def test_a_dumped_openai_config_round_trips_through_component_model(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M7/ADR 0092: a config parsed back as a ComponentModel (as a team file is) rebuilds the
    embedder without ever holding the key from the environment."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-only")
    embedder = OpenAIEmbeddings("m", "http://127.0.0.1:9/v1", dimensions=8)

    async def body() -> None:
        async with journaled.aio.open(sqlite_url, embedder=embedder) as rt:
            text = JournaledMemory(rt).dump_component().model_dump_json()
            assert "sk-env-only" not in text
            loaded = JournaledMemory.load_component(ComponentModel.model_validate_json(text))
            try:
                rebuilt = loaded._rt.memory.embedder
                assert isinstance(rebuilt, OpenAIEmbeddings)
                assert rebuilt.dimensions == 8
            finally:
                await loaded.close()

    asyncio.run(body())


# --- ADR 0093: the bounded cache of run owners, under threads -------------------------------

KEPT = 3


def _runs_of(url: str, organization: str | None, clock: ManualClock, count: int) -> list[str]:
    with journaled.open(url, organization=organization, clock=clock) as rt:
        rt.register_tool("echo", lambda text, ctx: text)
        ids = []
        for n in range(count):
            done = rt.execute(Plan(goal=f"g{n}", steps=[Step("e", tool="echo", input="x")]))
            assert done.ok, done.observations
            ids.append(done.run_id)
        return ids


def test_threads_evicting_run_owners_never_see_another_organizations_run(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R1/ADR 0093: four threads checking runs of acme, globex and no organization through one
    boundary that keeps 3 owners always get each run's true owner, one by one and in batches."""
    monkeypatch.setattr(tenancy, "RUN_OWNERS_KEPT", KEPT)
    clock = ManualClock(start=1_767_225_600_000)
    owners = {
        **dict.fromkeys(_runs_of(sqlite_url, "acme", clock, 4), "acme"),
        **dict.fromkeys(_runs_of(sqlite_url, "globex", clock, 4), "globex"),
        **dict.fromkeys(_runs_of(sqlite_url, None, clock, 2), None),
    }
    wrong: list[str] = []
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        boundary = rt.runs.boundary
        assert boundary is not None
        events = list(rt.journal._journal.read())
        later = [e for e in events if e.stream in owners and e.version > 1]
        start = threading.Barrier(4)

        def check(seed: int) -> None:
            pick = random.Random(seed)
            start.wait(timeout=10)
            for _ in range(150):
                run_id = pick.choice(list(owners))
                if boundary.run_elsewhere(run_id) != (owners[run_id] != "acme"):
                    wrong.append(f"run_elsewhere({owners[run_id]})")
                batch = pick.sample(later, 6)
                shown = boundary.visible(batch)
                wrong.extend(
                    f"visible({owners[e.stream]})" for e in shown if owners[e.stream] != "acme"
                )
                assert len(boundary._runs) <= KEPT

        threads = [threading.Thread(target=check, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
    assert wrong == []


def test_exactly_the_bound_of_runs_keeps_them_all_and_one_more_lets_the_oldest_go(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0093: a boundary keeps exactly RUN_OWNERS_KEPT owners: the oldest goes with the next
    run only, and is read again as its owner's (never as nobody's)."""
    monkeypatch.setattr(tenancy, "RUN_OWNERS_KEPT", KEPT)
    clock = ManualClock(start=1_767_225_600_000)
    runs = _runs_of(sqlite_url, "globex", clock, KEPT + 1)
    with journaled.open(sqlite_url, organization="acme", clock=clock) as rt:
        boundary = rt.runs.boundary
        assert boundary is not None
        for run_id in runs[:KEPT]:
            assert boundary.run_elsewhere(run_id)
        assert all(run_id in boundary._runs for run_id in runs[:KEPT])
        assert boundary.run_elsewhere(runs[KEPT])
        assert runs[0] not in boundary._runs
        assert boundary.run_owner(runs[0]) == "globex"
        assert len(boundary._runs) == KEPT


# --- Section 11: options after a group's name -----------------------------------------------


def _cli(url: str, missing: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env={"JOURNALED_URL": missing})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def journal(tmp_path: Path) -> tuple[str, str, str]:
    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        rt.memory.remember("deploys go through staging")
        rt.register_tool("ok", lambda x: x)
        run = rt.execute(Plan(goal="ship", steps=[Step("a", tool="ok")]))
    return url, f"sqlite:///{tmp_path / 'missing.sqlite'}", run.run_id


@pytest.mark.parametrize(
    "args",
    [
        ("memory", "--json", "search", "staging", "--url", "{url}"),
        ("memory", "--url", "{url}", "search", "--json", "staging"),
        ("--url", "{missing}", "memory", "--url", "{url}", "--json", "search", "staging"),
        ("memory", "--url", "{missing}", "--url", "{url}", "--json", "search", "staging"),
        ("--json", "memory", "--url", "{missing}", "search", "staging", "--url", "{url}"),
    ],
    ids=["json-group-url-cmd", "url-group-json-cmd", "group-over-main", "twice", "cmd-over-group"],
)
def test_the_url_nearest_the_end_of_the_line_wins(
    journal: tuple[str, str, str], args: tuple[str, ...]
) -> None:
    """Section 11: wherever --url and --json stand, the last --url names the journal and the
    output is the same JSON."""
    url, missing, _ = journal
    expected = _cli(url, missing, "--json", "memory", "search", "staging", "--url", url)
    assert expected[0] == 0, expected
    got = _cli(url, missing, *(a.format(url=url, missing=missing) for a in args))
    assert got == expected


@pytest.mark.parametrize(
    ("tail", "error"),
    [
        (("-1", "2", "--jsn"), "No such option '--jsn'"),
        (("-1", "-x"), "No such option '-x'"),
        (("1", "2", "--", "--json"), "unexpected extra argument (--json)"),
        (("--", "-3", "2"), "A -3 is negative"),
        (("-0", "-2"), "B -2 is negative"),
    ],
    ids=["typo", "short", "json-after-dashes", "dashes", "minus-zero"],
)
def test_runs_diff_after_group_options_reads_negatives_and_refuses_the_rest(
    journal: tuple[str, str, str], tail: tuple[str, ...], error: str
) -> None:
    """O7: after `runs --url X --json diff RUN`, negative numbers are A and B (refused by
    their own check), and a word after -- is an argument, never an option."""
    url, missing, run_id = journal
    code, out, err = _cli(url, missing, "runs", "--url", url, "--json", "diff", run_id, *tail)
    assert code != 0
    assert out == ""
    assert error in " ".join(err.split())


def test_credentials_in_an_embedders_base_url_never_leave_it(tmp_path: Path) -> None:
    """X1/M9 (ADR 0092): user:password@ in OpenAIEmbeddings' base_url is a secret: its repr and
    its errors show ``***`` instead, and a config refuses to hold it, naming the endpoint
    without it."""
    from journaled.embedders.http import EmbeddingsError, OpenAIEmbeddings

    embedder = OpenAIEmbeddings(
        model="m", base_url="http://bob:s3cret-pw@127.0.0.1:9/v1", timeout=2
    )
    assert "s3cret-pw" not in repr(embedder)
    assert "***@127.0.0.1:9" in repr(embedder)
    with pytest.raises(ValueError, match="holds credentials") as refused:
        embedder.embedder_config()
    assert "s3cret-pw" not in str(refused.value)
    with pytest.raises(EmbeddingsError) as failed:
        embedder.embed(["hello"])
    assert "s3cret-pw" not in str(failed.value)
    plain = OpenAIEmbeddings(model="m", base_url="http://127.0.0.1:9/v1")
    assert plain.embedder_config()["base_url"] == "http://127.0.0.1:9/v1"
