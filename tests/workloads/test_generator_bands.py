"""Fingerprints of the synthetic generators by their statistics: each generator's summary (`libra trace import
--json` / `trace_summary`) early and late in the drift, seed 0, 64 prompts x 8 samples, within stated bands. The
bands hold for seeds 0-2 with room (docs/corpus.md has the measured rows); `swe-agent`'s are the ranges of the real
coding agents of the corpus, and a second test checks it against the corpus itself. A change meant to alter a
workload moves its bands, and says so."""

from __future__ import annotations

import pytest

from libra.cli.trace import trace_summary
from libra.workloads import generate
from libra.workloads.corpus import load_corpus

# (statistic) -> (low, high), per generator and step
BANDS = {
    ("search-r1", 0): {
        "mean_tokens": (4800, 7800),
        "longest_10pct_share": (0.35, 0.50),
        "median_turns": (2, 5),
        "median_gen_tokens_per_turn": (340, 500),
        "median_tool_return_tokens": (380, 580),
        "p90_tool_return_tokens": (2000, 5000),
        "error_rate": (0.02, 0.06),
        "timeout_rate": (0.01, 0.03),
        "prompt_share": (0.03, 0.08),
    },
    ("search-r1", 100): {
        "mean_tokens": (10000, 15500),
        "longest_10pct_share": (0.25, 0.38),
        "median_turns": (4, 7),
        "median_gen_tokens_per_turn": (620, 950),
        "median_tool_return_tokens": (900, 1800),
        "p90_tool_return_tokens": (3600, 5700),
        "error_rate": (0.02, 0.05),
        "timeout_rate": (0.01, 0.03),
        "prompt_share": (0.015, 0.04),
    },
    ("dapo-math", 0): {
        "mean_tokens": (3200, 4900),
        "longest_10pct_share": (0.25, 0.36),
        "median_turns": (1, 1),
        "median_gen_tokens_per_turn": (1300, 2100),
        "median_tool_return_tokens": (30, 60),
        "p90_tool_return_tokens": (150, 300),
        "error_rate": (0.08, 0.25),
        "timeout_rate": (0.02, 0.09),
        "prompt_share": (0.035, 0.065),
    },
    ("dapo-math", 100): {
        "mean_tokens": (8000, 11500),
        "longest_10pct_share": (0.24, 0.32),
        "median_turns": (1, 1),
        "median_gen_tokens_per_turn": (3800, 5800),
        "median_tool_return_tokens": (35, 70),
        "p90_tool_return_tokens": (200, 340),
        "error_rate": (0.12, 0.28),
        "timeout_rate": (0.015, 0.09),
        "prompt_share": (0.014, 0.026),
    },
    ("r2e-gym", 0): {
        "mean_tokens": (1900, 3300),
        "longest_10pct_share": (0.38, 0.55),
        "median_turns": (2, 3),
        "median_gen_tokens_per_turn": (110, 160),
        "median_tool_return_tokens": (220, 320),
        "p90_tool_return_tokens": (1300, 2000),
        "error_rate": (0.20, 0.35),
        "timeout_rate": (0.015, 0.04),
        "prompt_share": (0.20, 0.36),
    },
    ("r2e-gym", 100): {
        "mean_tokens": (8500, 12500),
        "longest_10pct_share": (0.33, 0.47),
        "median_turns": (4, 7),
        "median_gen_tokens_per_turn": (250, 350),
        "median_tool_return_tokens": (220, 310),
        "p90_tool_return_tokens": (1300, 1900),
        "error_rate": (0.20, 0.30),
        "timeout_rate": (0.015, 0.035),
        "prompt_share": (0.05, 0.085),
    },
    # calibrated: per-turn shapes of the real coding agents (generation ~70 tokens, returns median 73-158 and P90
    # 631-1,111, errors 2-11 %, timeouts <= 1 %, tail 17-22 %), the paper's drift of the mean (~2.5K -> 11.5K)
    ("swe-agent", 0): {
        "mean_tokens": (2400, 3400),
        "longest_10pct_share": (0.18, 0.30),
        "median_turns": (2, 4),
        "median_gen_tokens_per_turn": (60, 110),
        "median_tool_return_tokens": (70, 160),
        "p90_tool_return_tokens": (550, 1100),
        "error_rate": (0.02, 0.11),
        "timeout_rate": (0.0, 0.01),
        "prompt_share": (0.45, 0.65),
    },
    ("swe-agent", 100): {
        "mean_tokens": (10000, 13500),
        "longest_10pct_share": (0.15, 0.30),
        "median_turns": (11, 36),
        "median_gen_tokens_per_turn": (60, 110),
        "median_tool_return_tokens": (70, 160),
        "p90_tool_return_tokens": (550, 1100),
        "error_rate": (0.02, 0.11),
        "timeout_rate": (0.0, 0.01),
        "prompt_share": (0.08, 0.33),
    },
}


def _summary(name: str, step: int) -> dict:
    return trace_summary(generate(name, num_steps=1, seed=0, num_prompts=64, samples_per_prompt=8, start_step=step))


@pytest.mark.parametrize(("name", "step"), sorted(BANDS))
def test_generator_statistics_within_their_bands(name, step) -> None:
    got = _summary(name, step)
    out = {k: round(got[k], 3) for k, (lo, hi) in BANDS[name, step].items() if not lo <= got[k] <= hi}
    assert not out, f"{name} step {step} outside its bands: {out}"


def test_swe_agent_is_calibrated_against_the_coding_corpus() -> None:
    """Late in the drift, each per-turn statistic of `swe-agent` lies within the range the corpus's coding agents
    span (widened by a quarter); r2e-gym's generations, returns and error rate do not (what calibration changed)."""
    corpus = load_corpus()
    real = [trace_summary(v) for k, v in corpus.items() if k.startswith(("swe-agent", "mini-swe-agent"))]
    assert len(real) >= 2
    keys = ("median_gen_tokens_per_turn", "median_tool_return_tokens", "p90_tool_return_tokens", "error_rate")
    keys += ("median_turns", "longest_10pct_share")

    def inside(summary, key) -> bool:
        lo, hi = min(r[key] for r in real), max(r[key] for r in real)
        return 0.75 * lo <= summary[key] <= 1.25 * hi

    ours = _summary("swe-agent", 100)
    assert all(inside(ours, k) for k in keys), {k: ours[k] for k in keys if not inside(ours, k)}
    r2e = _summary("r2e-gym", 100)
    assert not any(inside(r2e, k) for k in keys[:4])
