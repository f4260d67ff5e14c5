"""The held-out sources of the corpus (data/corpus/held-out/): kept apart from the sources that the router's tests
gate on and complete as their manifest states, and the default router's margin over the baselines on them (never
tuned on)."""

from __future__ import annotations

import re

import pytest

from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest
from tests.scripts import load_script

HELD_OUT = DEFAULT_CORPUS / "held-out"


# held-out sources of fewer than 100 trajectories: the whole run, where it is that small
FEWER_RUNS = {"intercode-ctf-gpt4": 93}  # InterCode's CTF run: 93 of the benchmark's 100 tasks, all it logged


def test_held_out_sources_are_apart_and_complete() -> None:
    """Every held-out source loads with the count and provenance its manifest states (repository, commit, licence,
    sha256 per file), has >= 100 trajectories (or exactly the count `FEWER_RUNS` states), and none of them is in
    the manifest that the router's tests read."""
    manifest = load_manifest(HELD_OUT)
    corpus = load_corpus(HELD_OUT)
    gated = {s["name"] for s in load_manifest()["sources"]}
    assert manifest["sources"] and not gated & set(corpus)
    for src in manifest["sources"]:
        trajs = corpus[src["name"]]
        assert src["held_out"] and src["licence"] and src["repo"] and len(trajs) == src["trajectories"]
        assert len(trajs) == FEWER_RUNS[src["name"]] if src["name"] in FEWER_RUNS else len(trajs) >= 100
        assert sum(f["trajectories"] for f in src["files"]) == len(trajs)
        for f in src["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) and re.fullmatch(r"[0-9a-f]{40}", f["commit"])
        assert all(t.extra["source"] == src["name"] and t.turns for t in trajs)
        assert {t.extra["origin"]["path"] for t in trajs} <= {f["path"] for f in src["files"]}


# -- the default router on the held-out search agents (docs/routing.md, "Held-out search agent") -------------------
# Never tuned on. At 616dbdd the default beat the best baseline by >= 5 points on all five but moved 14.4 % and
# 14.0 % of the tokens on FireAct GPT-3.5 and Llama-2-13B (their files come in order of length: each chunk longer
# than the last, so the price learnt on the last steps is always too low). The migration ceiling (12 % of the
# tokens seen, every move of the run) was added after that and meets the bound everywhere; it costs Reflexion's
# ReAct one run of 138 (72 -> 71 single-shot right against the predictor's 65), below the 5 points, and the budget
# that targets the run's share (repay, hold_first) one more (+3.6), the test of what follows a tool (`tool_test`)
# two more (+2.2): strict xfail, so that a router change that wins it back shows here (XPASS) and the mark is
# updated.
# InterCode's CTF run with GPT-4 (added later, never tuned on) misses it too: +1.1 in file order (31.2 % against
# fcfs's 30.1 %, 8.7 % moved), -4.3 / -0.5 / +4.3 over 10 random orders (scripts/eval_corpus.py --orders 10).
# MedAgentBench's AgentBench runs (added later, never tuned on: clinical-records agents on a FHIR API, 100 runs
# each, a ~3.3K-token prompt and one or two calls) miss it with GPT-4o (+2.0 in file order, 6.7 % moved) and
# DeepSeek-V3 (+1.0, 11.2 % moved); GPT-4o-mini (+15.0) and Llama-3.3-70B meet it (+7.0, 32 vs 25, at 11.8 %
# moved; +5.0 before common tools were named only when told apart, +3.0 with the test but without its looser
# level for keeping a name: its `get` and `post` were named and unnamed at alternate step ends).
# InterCode's runs of the other models and its ReAct runs (added later still, never tuned on): eight of ten
# meet it in file order; text-davinci-003 on Bash misses it, as a multi-turn completion agent (+1.0: its runs end in
# one turn or use all ten, and all ten say nothing at admission of how much output they will get) and as ReAct
# (-1.0: a 1.9K-token few-shot prompt is 86 % of each run and every move carries it).
MISSES_MARGIN = {
    "reflexion-react-davinci003-hotpotqa": "+2.2 points (68 of 138 runs single-shot right against the predictor's 65)",
    "intercode-ctf-gpt4": "+1.1 points (29 of 93 runs single-shot right against fcfs's 28)",
    "medagentbench-gpt4o": "+2.0 points (29 of 100 runs single-shot right against mlfq's 27)",
    "medagentbench-deepseek-v3": "+1.0 point (26 of 100 runs single-shot right against mlfq's 25)",
    "intercode-bash-davinci003": "+1.0 point (52 of 199 runs single-shot right against mlfq's 50)",
    "intercode-bash-react-davinci003": "-1.0 point (62 of 200 runs single-shot right against the predictor's 64)",
}


@pytest.fixture(scope="module")
def held_out_scores():
    from libra.scheduling.sources import quantile_buckets, score_source

    return {name: score_source(t, quantile_buckets(t), {"default": {}}) for name, t in load_corpus(HELD_OUT).items()}


def _held_out_params():
    for src in load_manifest(HELD_OUT)["sources"]:
        reason = MISSES_MARGIN.get(src["name"])
        marks = [pytest.mark.xfail(strict=True, reason=f"misses the 5 points: {reason}")] if reason else []
        yield pytest.param(src["name"], marks=marks, id=src["name"])


@pytest.mark.parametrize("name", list(_held_out_params()))
def test_default_beats_baselines_on_held_out_search_agents(held_out_scores, name) -> None:
    """The accuracy half of the issue's target: the default beats the best of fcfs, mlfq, predictor and
    most-common by >= 5 points (measured with the recent admission expert and the test of what follows a tool,
    2026-12-06: +35.1, +31.7, +29.4 on FireAct, +2.2 on Reflexion's ReAct (strict xfail), +13.0 on WebDancer; +7.2
    on ReAct's WebShop agent, +5.2 on its FEVER agent,
    +5.0 / +8.2 / +6.8 / +8.3 on InterCode's Bash and SQL runs with GPT-4 / GPT-3.5, +13.4 / +10.3 on its Python
    runs, +14.3 on its SQL run with the tables given (GPT-3.5) and +1.1 on its CTF run with GPT-4 (strict xfail),
    added later and never tuned on; +2.0 / +15.0 / +1.0 / +7.0 on MedAgentBench's runs with GPT-4o / GPT-4o-mini /
    DeepSeek-V3 / Llama-3.3-70B, the first and third strict xfails, added later still; on InterCode's other models
    +1.0 / +11.0 / +13.6 / +6.6 on Bash and +7.5 / +9.2 / +11.2 / +10.3 on SQL with text-davinci-003 / text-bison /
    chat-bison / StarChat, and -1.0 / +6.9 on its ReAct runs on Bash / SQL, the two Bash misses strict xfails; +6.3
    on Moatless Tools' SWE-bench Lite runs with Claude 3.5 Sonnet, a coding agent, added later still; +11.8 / +12.7
    on InterCode's PaLM SQL runs with the tables given, text-bison / chat-bison, added last)."""
    from libra.scheduling.sources import BASELINES, TARGET_MARGIN, meets_target

    res = held_out_scores[name]
    gap = res["default"].routing_accuracy - max(res[b].routing_accuracy for b in BASELINES)
    assert meets_target(gap, 0.0), f"{gap:+.4f} < {TARGET_MARGIN}"  # (InterCode Bash / GPT-4: +5.0 exactly, 69 vs 59)


def test_default_migration_bound_on_held_out_search_agents(held_out_scores) -> None:
    """The migration half: <= 12 % of the tokens moved on every held-out source (measured 8.3 %, 8.9 %, 7.8 % on
    FireAct, 6.0 % on Reflexion, 8.5 % on WebDancer, 7.9 % on WebShop, 7.4 % on FEVER, 7.9-9.9 % on InterCode,
    6.7-11.8 % on MedAgentBench, 7.4-9.2 % on InterCode's other models and ReAct, 8.2 % on Moatless, 8.9 % and 8.5 %
    on the PaLM SQL runs with the tables given; 14.4 % and 14.0 % on the first two before the ceiling, 11.8 % and
    11.9 % before the recent admission expert)."""
    from libra.scheduling.sources import MAX_MIGRATED

    for name, res in held_out_scores.items():
        assert res["default"].migrated_token_fraction <= MAX_MIGRATED, name


# -- the coding agents' second bucket set (scripts/eval_corpus.py's CODING_BUCKETS, the issue's buckets for coding
# agents: 1:8000,2:16000,4:32000,8:inf) on the held-out coding sources; a unit that misses the target in file order
# is a strict xfail here, with its measured figure (none so far: Moatless / Claude 3.5 Sonnet, +5.9 and 6.3 % moved)
CODING_MISSES_MARGIN: dict[str, str] = {}


def _held_out_coding_params():
    for src in load_manifest(HELD_OUT)["sources"]:
        if src["kind"].startswith("coding"):
            reason = CODING_MISSES_MARGIN.get(src["name"])
            marks = [pytest.mark.xfail(strict=True, reason=f"misses the target: {reason}")] if reason else []
            yield pytest.param(src["name"], marks=marks, id=src["name"])


@pytest.mark.parametrize("name", list(_held_out_coding_params()))
def test_default_meets_the_target_on_held_out_coding_agents_with_fixed_buckets(name) -> None:
    """Both halves of the target on the held-out coding agents with the fixed buckets the issue names for them
    (measured 2026-12-06: Moatless Tools / claude-3-5-sonnet-20241022 on SWE-bench Lite +5.9 points over mlfq,
    6.3 % of the tokens moved; +7.8 at 7.2 % before tools were told apart pair by pair)."""
    from libra.scheduling.sources import BASELINES, MAX_MIGRATED, meets_target, score_source
    from libra.spec import parse_buckets

    buckets = parse_buckets(load_script("eval_corpus").CODING_BUCKETS)
    res = score_source(load_corpus(HELD_OUT)[name], buckets, {"default": {}})
    gap = res["default"].routing_accuracy - max(res[b].routing_accuracy for b in BASELINES)
    moved = res["default"].migrated_token_fraction
    assert meets_target(gap, moved), f"{gap:+.4f} points, {moved:.1%} moved (target {MAX_MIGRATED:.0%})"
