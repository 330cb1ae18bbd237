"""The timeline page (O7): self-contained HTML whose every position is ``rt.runs.at`` there."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import browser
import pytest
from required import unavailable
from rich.console import Console

import journaled
from journaled import demo, timeline
from journaled.events.orchestration import PassStarted

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
NASTY = "</script><script>alert(1)</script>"


@dataclass(frozen=True)
class Story:
    """A SQLite journal holding every kind of run the page must show."""

    url: str
    orchestration: str
    """The demo's orchestration: a budget stop, a waiting agent, a child run."""
    pass_run: str
    failed: str
    """A plain run: a failed step, its skipped dependent, and a parallel wave."""
    approval: str
    """An orchestration that waited for approval before its pass started."""
    fork: str
    """``failed`` forked with its failing step replaced, then run: every step succeeded."""
    refork: str
    """``fork`` forked at its first position with no change, then run: a fork of a fork."""

    def run(self, name: str) -> str:
        """Return the run id the test parameter ``name`` stands for."""
        return str(getattr(self, name))


RUNS = ["orchestration", "pass_run", "failed", "approval", "fork", "refork"]


def _boom(_: Any) -> str:
    raise RuntimeError(f"disk full {NASTY}")


def _planner(goal: str, observations: list[Any], clarifications: list[Any]) -> journaled.Plan:
    return journaled.Plan(goal=goal, steps=[journaled.Step("only", tool="ok")])


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Story:
    """Write the demo story, a failed run and an approved orchestration to one journal."""
    url = f"sqlite:///{tmp_path_factory.mktemp('timeline') / 'journal.sqlite'}"
    orchestration = demo.run(url, Console(file=io.StringIO()), human_delay=0)
    with journaled.open(url) as rt:
        rt.register_tool("ok", lambda data: f"fine: {data}")
        rt.register_tool("boom", _boom)
        rt.register_skill("summarize", lambda data: "short")
        failed = rt.execute(
            journaled.Plan(
                goal="check the mirrors",
                steps=[
                    journaled.Step("fetch", tool="ok", input="a"),
                    journaled.Step("mirror", tool="boom", depends_on=["fetch"]),
                    journaled.Step("sum", skill="summarize", depends_on=["fetch"]),
                    journaled.Step("publish", tool="ok", depends_on=["mirror", "sum"]),
                ],
            )
        )
        assert [s.status for s in failed.plan.steps] == [
            "succeeded",
            "failed",
            "succeeded",
            "skipped",
        ]
        waiting = rt.orchestrate("ship it", _planner, require_approval=True)
        assert waiting.status == "waiting_for_approval"
        rt.resume(waiting.run_id, approve=True, planner=_planner)
        pass_run = next(
            e.data.run for e in rt.runs.history(orchestration) if isinstance(e.data, PassStarted)
        )
        mirror = journaled.Step("mirror", tool="ok", input="b", depends_on=["fetch"])
        fork = rt.runs.fork(failed.run_id, replace={"mirror": mirror})
        done = rt.resume(fork)
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
        refork = rt.runs.fork(fork, at=rt.runs.history(fork)[0].position)
        done = rt.resume(refork)
        assert isinstance(done, journaled.ExecuteResult)
        assert done.ok
    return Story(url, orchestration, pass_run, failed.run_id, waiting.run_id, fork, refork)


@pytest.fixture
def rt(story: Story) -> Iterator[journaled.Runtime]:
    """Open the story's journal for reading."""
    with journaled.open(story.url) as runtime:
        yield runtime


def _replay(frames: list[dict[str, Any]]) -> None:
    """Expand each frame's changes into its whole state and why, as the page's script does."""
    full: dict[str, Any] | None = None
    why: list[int] = []
    for frame in frames:
        st = frame["state"]
        if st is None:
            full = None
        elif st["fresh"] or full is None or full["run"] != st["run"]:
            full = {**st, **{k: dict(st[k]) for k in ("statuses", "notes", "children")}}
        else:
            tables = {k: {**full[k], **st[k]} for k in ("statuses", "notes", "children")}
            full = {
                **st,
                **{k: {a: b for a, b in t.items() if b is not None} for k, t in tables.items()},
            }
        why = why[: frame["keep"]] + frame["why"]
        frame["state"], frame["why"] = full, why


def _data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page)
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    _replay(data["frames"])
    return data


def _positions(rt: journaled.Runtime, run_id: str) -> list[int]:
    own = rt.runs.history(run_id)
    passes = [e.data.run for e in own if isinstance(e.data, PassStarted)]
    return sorted({e.position for s in [run_id, *passes] for e in rt.runs.history(s)})


def _expected(rt: journaled.Runtime, run_id: str, position: int) -> dict[str, Any] | None:
    """What ``rt.runs.at`` says, or None where its pass has no run yet (an orchestration
    planning or waiting before a pass: its plan, every step pending, nothing run, O7)."""
    result = rt.runs.at(run_id, position)
    orchestration = rt.runs.history(run_id)[0].kind.startswith("orchestration.")
    not_yet_run = (
        result.run_id == run_id
        and not result.observations
        and all(s.status == "pending" for s in result.plan.steps)
    )
    if orchestration and not_yet_run:
        return None
    return {
        "statuses": {s.id: s.status for s in result.plan.steps},
        "calls_used": result.calls_used,
        "waiting": list(result.waiting),
        "stopped_for_budget": result.stopped_for_budget,
        "ok": result.ok,
    }


@pytest.mark.parametrize("name", RUNS)
def test_page_loads_nothing_from_anywhere(story: Story, rt: journaled.Runtime, name: str) -> None:
    """O7: scripts, styles and data are inline: no link, src, href or URL; CSP forbids fetches."""
    page = timeline.render(rt, story.run(name))
    markup = re.sub(r'(id="timeline-data">).*?(</script>)', r"\1\2", page, flags=re.S)
    assert page.startswith("<!doctype html>")
    assert "<link" not in markup.lower()
    assert re.search(r"<script[^>]*\ssrc", markup, re.I) is None
    remote = r"""\b(src|href|srcset|action)\s*=\s*["']?\s*(https?:)?//"""
    assert re.search(remote, page, re.I) is None
    assert re.search(r"\b(src|href)\s*=", markup, re.I) is None
    for needle in ("http://", "https://", "@import", "url(", "fetch(", "XMLHttpRequest"):
        assert needle not in markup
    assert "default-src 'none'" in markup


@pytest.mark.parametrize("name", RUNS)
def test_every_position_is_on_the_scrubber(story: Story, rt: journaled.Runtime, name: str) -> None:
    """O7: the run's positions (an orchestration's merged with its passes') are all embedded."""
    run_id = story.run(name)
    page = timeline.render(rt, run_id)
    frames = _data(page)["frames"]
    assert [f["position"] for f in frames] == _positions(rt, run_id)
    assert '<input type="range" id="scrubber"' in page
    for frame in frames:
        assert frame["text"]
        assert frame["kind"] == next(
            e.kind for e in rt.journal.read(frame["position"] - 1, frame["position"])
        )


@pytest.mark.parametrize("name", RUNS)
def test_every_position_shows_runs_at(story: Story, rt: journaled.Runtime, name: str) -> None:
    """O7: each embedded state equals rt.runs.at at that position (None where it has no run)."""
    run_id = story.run(name)
    data = _data(timeline.render(rt, run_id))
    for frame in data["frames"]:
        expected = _expected(rt, run_id, frame["position"])
        state = frame["state"]
        if expected is None:
            assert state is None
            continue
        assert {k: state[k] for k in expected} == expected, frame["position"]
    assert "\n".join(data["lines"][k] for k in data["frames"][-1]["why"]) == rt.runs.why(run_id)


def test_budget_stop_wait_and_child_run_are_marked(story: Story, rt: journaled.Runtime) -> None:
    """O7/E7/E9/E10: the budget stop and the wait are flagged; the agent's child run is linked."""
    data = _data(timeline.render(rt, story.orchestration))
    flags = {f["kind"]: f["flag"] for f in data["frames"] if f["flag"]}
    assert flags["run.budget-stopped"] == "budget"
    assert flags["orchestration.budget-awaited"] == "budget"
    assert flags["orchestration.resumed"] == "answer"
    assert flags["run.step-waiting"] == "wait"
    waiting = next(f for f in data["frames"] if f["kind"] == "run.step-waiting")
    assert waiting["state"]["waiting"] == ["deploy"]
    assert "Which region" in waiting["state"]["notes"]["deploy"]
    final = rt.runs.at(story.orchestration, data["frames"][-1]["position"])
    child = next(o.agent_task_id for o in final.observations if o.agent_task_id)
    linked = data["frames"][-1]["state"]["children"]["deploy"]
    assert linked["run"] == child
    assert linked["summary"].startswith("completed")
    assert data["orchestration"] is True
    assert data["title"].endswith("completed")


def test_approval_is_marked_before_any_pass(story: Story, rt: journaled.Runtime) -> None:
    """O4/O7/R5: waiting for approval and the approving resume are flagged; no run state before."""
    frames = _data(timeline.render(rt, story.approval))["frames"]
    asked = next(f for f in frames if f["kind"] == "orchestration.approval-requested")
    assert asked["flag"] == "approval"
    assert asked["state"] is None
    assert asked["plan"] == 0
    approved = next(f for f in frames if f["kind"] == "orchestration.resumed")
    assert approved["flag"] == "approval"
    assert "the plan of pass 1 approved" in approved["text"]


def test_failure_skip_and_waves(story: Story, rt: journaled.Runtime) -> None:
    """O7/E2/E4: the DAG is drawn by wave; the failure is flagged with its error, escaped."""
    page = timeline.render(rt, story.failed)
    data = _data(page)
    assert [[b["id"] for b in w] for w in data["plans"][0]["waves"]] == [
        ["fetch"],
        ["mirror", "sum"],
        ["publish"],
    ]
    failed = next(f for f in data["frames"] if f["flag"] == "failed")
    assert failed["kind"] == "run.step-failed"
    assert NASTY in failed["state"]["notes"]["mirror"]
    assert page.count("</script>") == 2  # the data block and the script; the error cannot add one


def test_write_creates_the_file(story: Story, rt: journaled.Runtime, tmp_path: Path) -> None:
    """O7: write() puts render()'s page at the path, creating its folder."""
    out = timeline.write(rt, story.failed, tmp_path / "pages" / "run.html")
    assert out == tmp_path / "pages" / "run.html"
    assert out.read_text(encoding="utf-8") == timeline.render(rt, story.failed)


def test_unknown_run_is_an_error(rt: journaled.Runtime) -> None:
    """O7: rendering a run the journal does not hold raises RunNotFound."""
    with pytest.raises(journaled.RunNotFound):
        timeline.render(rt, "run_nope")


# -- in a real browser --------------------------------------------------------------------------

READ_STEPS = """
return Array.from(document.querySelectorAll('[data-step]')).map(
  (n) => [n.dataset.step, n.dataset.status, n.dataset.waiting === 'true']);
"""


def _check_dom(driver: Any, rt: journaled.Runtime, run_id: str, position: int) -> None:
    shown = driver.execute_script(READ_STEPS)
    expected = _expected(rt, run_id, position)
    if expected is None:  # only a proposed plan: drawn, every step still pending
        assert {status for _, status, _ in shown} <= {"pending"}
        return
    assert {step: status for step, status, _ in shown} == expected["statuses"], position
    assert [step for step, _, waiting in shown if waiting] == expected["waiting"], position


@pytest.mark.parametrize(("name", "shot"), [("orchestration", "run.step-waiting"), ("failed", "")])
def test_scrubbing_in_chromium(
    story: Story, rt: journaled.Runtime, tmp_path: Path, name: str, shot: str
) -> None:
    """O7: in headless Chromium every box's data-status follows rt.runs.at as the scrubber moves."""
    reason = browser.missing()
    if reason is not None:
        unavailable("BROWSER", f"no browser test: {reason}")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    run_id = story.run(name)
    page = timeline.write(rt, run_id, tmp_path / f"{name}.html")
    positions = _positions(rt, run_id)
    frames = _data(page.read_text(encoding="utf-8"))["frames"]
    with browser.chromium() as driver:
        driver.get(page.as_uri())
        assert driver.execute_script("return document.body.dataset.position") == str(positions[-1])
        for position in positions:
            assert driver.execute_script("return window.setPosition(arguments[0])", position) == (
                position
            )
            _check_dom(driver, rt, run_id, position)

        scrubber = driver.find_element(By.ID, "scrubber")
        scrubber.send_keys(Keys.HOME)
        for position in positions[1:4]:
            scrubber.send_keys(Keys.ARROW_RIGHT)  # the slider's own keyboard handling
            assert scrubber.get_attribute("value") == str(positions.index(position))
            assert driver.find_element(By.ID, "pos").text == f"#{position}"
            _check_dom(driver, rt, run_id, position)
        scrubber.send_keys(Keys.SHIFT, Keys.ARROW_RIGHT)  # jump to the next highlighted event
        flagged = next(f["position"] for f in frames[4:] if f["flag"])
        assert driver.find_element(By.ID, "pos").text == f"#{flagged}"
        _check_dom(driver, rt, run_id, flagged)

        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # selenium leaves it untyped
        assert [e for e in log("browser") if e["level"] == "SEVERE"] == []  # CSP or script errors

        target = next((f["position"] for f in frames if f["kind"] == shot), positions[-1])
        driver.execute_script("window.setPosition(arguments[0])", target)
        driver.execute_script("document.getAnimations().forEach((a) => a.finish())")
        for _ in range(2):  # the page reflows once the window is taller
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1440, max(900, int(height) + 140))
        ARTIFACTS.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / f"timeline-{name}.png"))


def test_cli_writes_the_timeline(tmp_path: Path) -> None:
    """O7: `journaled timeline RUN -o file` writes the page; an unknown run fails clearly."""
    from click.testing import CliRunner

    from journaled.cli import main

    url = f"sqlite:///{tmp_path / 'journal.sqlite'}"
    with journaled.open(url) as rt:
        rt.register_tool("t", lambda x: x)
        run_id = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="t")])).run_id
    out = tmp_path / "page" / "run.html"
    result = CliRunner().invoke(main, ["--url", url, "timeline", run_id, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().lower().startswith("<!doctype html>")
    missing = CliRunner().invoke(main, ["--url", url, "timeline", "run_nope", "-o", str(out)])
    assert missing.exit_code != 0
    assert "no run" in missing.output


# -- forks: lineage and compare (F2, F3) --------------------------------------------------------

PLAIN_KEYS = {"run_id", "orchestration", "title", "plans", "lines", "frames"}


def test_fork_page_embeds_its_lineage(story: Story, rt: journaled.Runtime) -> None:
    """F2: a fork's page embeds its source, position, first position, carried steps and chain."""
    data = _data(timeline.render(rt, story.refork))
    first = rt.runs.history(story.refork)[0].position
    at = rt.runs.lineage(story.refork)[-1].at
    fork = data["fork"]
    assert (fork["source"], fork["at"], fork["first"]) == (story.fork, at, first)
    assert fork["carried"] == ["fetch", "sum"]
    assert [(x["run_id"], x["forked_from"], x["at"]) for x in fork["lineage"]] == [
        (x.run_id, x.forked_from, x.at) for x in rt.runs.lineage(story.refork)
    ]
    assert [x["run_id"] for x in fork["lineage"]] == [story.failed, story.fork, story.refork]
    assert f"forked from {story.fork} at #{fork['at']}" in fork["text"]
    assert data["title"] == f"run {story.refork} — completed"
    assert _data(timeline.render(rt, story.fork))["fork"]["replaced"] == ["mirror"]


@pytest.mark.parametrize("name", ["orchestration", "pass_run", "failed", "approval"])
def test_plain_page_embeds_no_lineage(story: Story, rt: journaled.Runtime, name: str) -> None:
    """F2: a run that is no fork embeds exactly what it did before forks existed."""
    assert set(_data(timeline.render(rt, story.run(name)))) == PLAIN_KEYS


def _browser() -> None:
    reason = browser.missing()
    if reason is not None:
        unavailable("BROWSER", f"no browser test: {reason}")


def _clean(driver: Any) -> None:
    """Assert the page loaded nothing and logged no error (CSP violations are errors)."""
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # selenium leaves it untyped
    assert [e for e in log("browser") if e["level"] == "SEVERE"] == []


READ_FORK = """
const mark = document.getElementById('forkmark');
return {
  line: document.getElementById('forkline').textContent,
  href: document.querySelector('#forkline a').getAttribute('href'),
  chain: Array.from(document.querySelectorAll('#chain li')).map((n) => n.dataset.run),
  mark: mark && [mark.dataset.position, mark.style.left],
  carried: Array.from(document.querySelectorAll('[data-carried="true"]'))
    .map((n) => n.dataset.step),
  replaced: Array.from(document.querySelectorAll('[data-replaced="true"]'))
    .map((n) => n.dataset.step),
  positions: window.timeline.positions,
};
"""


def test_fork_lineage_in_chromium(story: Story, rt: journaled.Runtime, tmp_path: Path) -> None:
    """F2: in Chromium a fork's page says where it was forked from, links the source's page
    beside it, marks the fork's first position on the scrubber and its carried-over steps."""
    _browser()
    from selenium.webdriver.common.by import By

    source = timeline.write(rt, story.failed, tmp_path / f"{story.failed}.html")
    fork = timeline.write(rt, story.fork, tmp_path / f"{story.fork}.html")
    refork = timeline.write(rt, story.refork, tmp_path / "refork.html")
    at = {r: rt.runs.lineage(r)[-1].at for r in (story.fork, story.refork)}
    first = {r: rt.runs.history(r)[0].position for r in (story.fork, story.refork)}
    with browser.chromium() as driver:
        driver.get(fork.as_uri())
        shown = driver.execute_script(READ_FORK)
        assert f"forked from {story.failed} at #{at[story.fork]}" in shown["line"]
        assert shown["href"] == f"{story.failed}.html"
        assert shown["chain"] == []  # a fork of a root: the line says it all
        assert shown["mark"] == [str(first[story.fork]), "0%"]
        assert shown["positions"][0] == first[story.fork]
        assert sorted(shown["carried"]) == ["fetch", "sum"]
        assert shown["replaced"] == ["mirror"]
        _clean(driver)

        driver.find_element(By.CSS_SELECTOR, "#forkline a").click()  # the source's page
        assert driver.current_url == source.as_uri()
        assert driver.find_elements(By.ID, "lineage") == []

        driver.get(refork.as_uri())
        shown = driver.execute_script(READ_FORK)
        assert f"forked from {story.fork} at #{at[story.refork]}" in shown["line"]
        assert shown["chain"] == [story.failed, story.fork, story.refork]
        assert shown["mark"] == [str(first[story.refork]), "0%"]
        assert sorted(shown["carried"]) == ["fetch", "sum"]
        assert shown["replaced"] == []
        driver.execute_script("window.setPosition(arguments[0])", first[story.refork])
        _check_dom(driver, rt, story.refork, first[story.refork])  # carried: succeeded already
        _clean(driver)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.get(fork.as_uri())
        assert driver.save_screenshot(str(ARTIFACTS / "timeline-fork.png"))


def test_plain_page_has_no_lineage_in_chromium(
    story: Story, rt: journaled.Runtime, tmp_path: Path
) -> None:
    """F2: a run that is no fork shows no lineage block, no fork marker, no carried-over step."""
    _browser()
    from selenium.webdriver.common.by import By

    page = timeline.write(rt, story.failed, tmp_path / "failed.html")
    with browser.chromium() as driver:
        driver.get(page.as_uri())
        assert driver.find_elements(By.ID, "lineage") == []
        assert driver.find_elements(By.CSS_SELECTOR, ".forkmark, [data-carried], .flag-fork") == []
        assert "forked" not in driver.find_element(By.TAG_NAME, "body").text
        _clean(driver)


READ_ROWS = """
return Array.from(document.querySelectorAll('#compare tbody tr')).map((r) => ({
  step: r.dataset.step,
  highlighted: r.classList.contains('differs'),
  background: getComputedStyle(r).backgroundColor,
  cells: Array.from(r.querySelectorAll('td')).map((c) => c.textContent.trim()),
}));
"""


def test_compare_highlights_exactly_the_differing_steps_in_chromium(
    story: Story, rt: journaled.Runtime, tmp_path: Path
) -> None:
    """F3: the compare page of a fork with one replaced step and its source shows each step's
    status and output in both runs and highlights exactly the steps that differ."""
    _browser()
    from selenium.webdriver.common.by import By

    comparison = rt.runs.compare(story.failed, story.fork)
    assert comparison.differing == ["mirror", "publish"]  # the replaced step and its dependent
    page = timeline.write_compare(rt, story.failed, story.fork, tmp_path / "compare.html")
    with browser.chromium() as driver:
        driver.get(page.as_uri())
        rows = driver.execute_script(READ_ROWS)
        assert [r["step"] for r in rows] == [s.step_id for s in comparison.steps]
        assert [r["step"] for r in rows if r["highlighted"]] == comparison.differing
        plain = {r["background"] for r in rows if not r["highlighted"]}
        assert len(plain) == 1
        assert plain.isdisjoint(r["background"] for r in rows if r["highlighted"])
        for row, step in zip(rows, comparison.steps, strict=True):
            status_a, out_a, status_b, out_b = row["cells"]
            assert (status_a, status_b) == (step.status_a, step.status_b)
            assert out_a.startswith(step.output_a or "")
            assert out_b.startswith(step.output_b or "")
        assert "disk full" in rows[1]["cells"][1]  # the source's error, escaped, as text
        text = driver.find_element(By.TAG_NAME, "header").text
        assert f"calls used in {story.failed}: {comparison.calls_used_a}" in text
        assert f"calls used in {story.fork}: {comparison.calls_used_b}" in text
        assert f"{story.fork} (forked at #" in text
        assert "2 of 4 step(s) differ: mirror, publish" in text
        _clean(driver)
        ARTIFACTS.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(ARTIFACTS / "timeline-compare.png"))


def test_compare_page_loads_nothing_from_anywhere(story: Story, rt: journaled.Runtime) -> None:
    """F3: the compare page has no script, link or URL, escapes run content, and forbids fetches."""
    page = timeline.render_compare(rt, story.failed, story.fork)
    assert page.startswith("<!doctype html>")
    assert "<script" not in page.lower()
    assert "<link" not in page.lower()
    assert re.search(r"\b(src|href|srcset|action)\s*=", page, re.I) is None
    for needle in ("http://", "https://", "@import", "url("):
        assert needle not in page
    assert "default-src 'none'" in page
    assert NASTY not in page  # the failed step's error is text, not markup


def test_compare_of_an_orchestration_is_an_error(story: Story, rt: journaled.Runtime) -> None:
    """F3: comparing an orchestration (not a run) says to compare its pass runs."""
    with pytest.raises(ValueError, match="compare its pass runs"):
        timeline.render_compare(rt, story.orchestration, story.fork)


def test_cli_writes_the_compare_page(story: Story, tmp_path: Path) -> None:
    """F3: `journaled timeline A --compare B -o file` writes the compare page; JSON names it."""
    from click.testing import CliRunner

    from journaled.cli import main

    out = tmp_path / "cmp" / "page.html"
    args = ["--url", story.url, "timeline", story.failed, "--compare", story.fork, "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "differing steps are highlighted" in result.output
    with journaled.open(story.url) as rt:
        assert out.read_text(encoding="utf-8") == timeline.render_compare(
            rt, story.failed, story.fork
        )
    as_json = CliRunner().invoke(main, [*args[:2], "--json", *args[2:]])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output) == {
        "run_id": story.failed,
        "compare": story.fork,
        "path": str(out),
    }
    missing = CliRunner().invoke(main, [*args[:5], "run_nope", "-o", str(out)])
    assert missing.exit_code != 0
    assert "no run" in missing.output


def test_compare_of_unrelated_runs_shows_steps_only_in_one(
    story: Story, rt: journaled.Runtime
) -> None:
    """F3: a step only in one run says so in the other's column; unrelated runs show no lineage."""
    other = story.pass_run  # the demo's pass: no step id in common with the failed run
    comparison = rt.runs.compare(story.failed, other)
    assert comparison.only_in_a == ["fetch", "mirror", "sum", "publish"]
    assert comparison.only_in_b
    page = timeline.render_compare(rt, story.failed, other)
    rows = dict(re.findall(r'<tr data-step="([^"]+)"[^>]*>(.*?)</tr>', page, re.S))
    assert list(rows) == [s.step_id for s in comparison.steps]
    for step_id in comparison.only_in_a:
        assert rows[step_id].count("not in this run") == 1
        assert rows[step_id].index("not in this run") > rows[step_id].index("</td><td>")
    for step_id in comparison.only_in_b:
        assert rows[step_id].count("not in this run") == 1
        assert rows[step_id].index("not in this run") < rows[step_id].index("<pre>")
    assert 'id="relation"' not in page


def test_a_page_that_cannot_be_written_is_a_one_line_error(tmp_path: Path) -> None:
    """O7, F3: ``journaled timeline -o PATH`` (and ``--compare``) where no page can be written
    (a file where its folder should be) says where and why in one line, exit 1, no traceback."""
    from click.testing import CliRunner

    from journaled.cli import main

    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    with journaled.open(url) as rt:
        rt.register_tool("ok", lambda _: "done")
        run_id = rt.execute(journaled.Plan(goal="g", steps=[journaled.Step("a", tool="ok")])).run_id
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    target = blocker / "page.html"
    for extra in ([], ["--compare", run_id]):
        result = CliRunner().invoke(
            main, ["--url", url, "timeline", run_id, "-o", str(target), *extra]
        )
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert f"cannot write the page to {target}" in result.output
        assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="cannot write the page"), journaled.open(url) as rt:
        timeline.write(rt, run_id, target)


_READ_STEPS = """
return Array.from(document.querySelectorAll('[data-step]')).map(
  (n) => [n.dataset.step, n.dataset.status, n.querySelector('.pill').textContent,
          n.querySelector('.note').textContent, n.querySelector('.child').hidden]);
"""


def _refuse(_: object) -> str:
    raise RuntimeError("no")


@pytest.mark.parametrize("ids", [("constructor", "toString"), ("__proto__", "hasOwnProperty")])
def test_step_ids_named_like_object_members_show_their_own_status(
    sqlite_url: str, tmp_path: Path, ids: tuple[str, str]
) -> None:
    """E1, O7: a step id is any text; in the page, steps named like JavaScript's object
    members show the status rt.runs.at gives them, with no note and no child run borrowed
    from ``Object.prototype`` (pending at the first event, then their own)."""
    _browser()
    with journaled.open(sqlite_url) as runtime:
        runtime.register_tool("boom", _refuse)
        runtime.register_tool("ok", lambda _: "ok")
        done, never = ids
        plan = journaled.Plan(
            goal="g",
            steps=[
                journaled.Step(done, tool="ok"),
                journaled.Step("first", tool="boom"),
                journaled.Step(never, tool="ok", depends_on=["first"]),
            ],
        )
        result = runtime.execute(plan)
        assert not result.ok
        page = timeline.write(runtime, result.run_id, tmp_path / "page.html")
        history = runtime.runs.history(result.run_id)
        first, last = history[0].position, history[-1].position
    with browser.chromium() as driver:
        driver.get(page.as_uri())
        driver.execute_script("window.setPosition(arguments[0])", first)
        at_first = {row[0]: row[1:] for row in driver.execute_script(_READ_STEPS)}
        driver.execute_script("window.setPosition(arguments[0])", last)
        at_last = {row[0]: row[1:] for row in driver.execute_script(_READ_STEPS)}
        _clean(driver)
    assert at_first[done] == at_first[never] == ["pending", "pending", "", True]
    assert at_last[done] == ["succeeded", "succeeded", "", True]
    assert at_last[never][:2] == ["skipped", "skipped"]
    assert at_last[never][3] is True
