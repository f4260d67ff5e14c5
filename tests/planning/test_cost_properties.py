"""Properties of the cost model over its whole input range (Hypothesis): more work never costs less, more instances
sharing the same work never make one slower, and no layout beats the ideal training time (docs/cost-model.md)."""

from __future__ import annotations

from functools import cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.planning.cost import BatchStats, CostModel
from libra.spec import ClusterSpec, get_gpu, get_model

MODELS = st.sampled_from(["Qwen3-4B", "Qwen3-14B", "Qwen3-30B-A3B", "Llama-3-70B"])
GPUS = st.sampled_from(["A800-80GB", "H100-80GB", "H200"])
TPS = st.sampled_from([1, 2, 4, 8])
FACTOR = st.floats(1.001, 4.0)


@cache
def _cm(model: str, gpu: str) -> CostModel:
    return CostModel(ClusterSpec.from_total(gpu=get_gpu(gpu), num_gpus=64, gpus_per_node=8), get_model(model))


@settings(max_examples=60)
@given(MODELS, GPUS, TPS, st.floats(0, 1e6), st.floats(0, 1e6), FACTOR)
def test_prefill_never_gets_cheaper_with_more_tokens_or_context(model, gpu, tp, tokens, context, f) -> None:
    r = _cm(model, gpu).rollout
    t = r.prefill_time(tp, tokens, context)
    assert r.prefill_time(tp, tokens * f, context) >= t and r.prefill_time(tp, tokens, context * f) >= t


_WORK = st.fixed_dictionaries(
    {
        "num_requests": st.floats(1, 5000),
        "decode_tokens": st.floats(0, 1e7),
        "prefill_tokens": st.floats(0, 1e6),
        "resident_context": st.floats(1, 40960),
        "max_gen": st.floats(0, 40960),
        "max_turns": st.floats(1, 40),
        "tool_latency_s": st.floats(0, 60),
    }
)
_MORE = st.sampled_from(
    ["decode_tokens", "prefill_tokens", "resident_context", "max_gen", "max_turns", "tool_latency_s"]
)


@settings(max_examples=100)
@given(MODELS, GPUS, TPS, _WORK, _MORE, FACTOR)
def test_an_instance_never_gets_faster_with_more_work(model, gpu, tp, work, field, f) -> None:
    r = _cm(model, gpu).rollout
    before = float(r.instance_time(tp, **work))
    after = float(r.instance_time(tp, **{**work, field: work[field] * f}))
    assert after >= before * (1 - 1e-12), (field, before, after)


@settings(max_examples=60)
@given(MODELS, GPUS, TPS, _WORK)
def test_more_instances_of_one_tp_sharing_the_work_never_make_one_slower(model, gpu, tp, work) -> None:
    r = _cm(model, gpu).rollout
    rows = {k: np.array([v]) for k, v in work.items() if k != "tool_latency_s"}
    shares = np.array([1.0, 2.0, 3.0, 4.0, 8.0, 16.0])
    times = r.instance_time_grid(
        tp,
        shares,
        **rows,
        tool_latency_s=work["tool_latency_s"],
        new_requests=rows["num_requests"],
        queued_share=np.array([0.0]),
    )[0]
    assert np.all(np.diff(times) <= 1e-12 * times[:-1]), times


# a mean length is 0 or at least one token (below that, subnormal token counts only measure float rounding)
_LENGTH = st.one_of(st.just(0.0), st.floats(1.0, 65536.0))
_LAYOUTS = st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 2, 1), (4, 2, 1), (8, 1, 1), (1, 1, 8), (1, 2, 8), (2, 1, 4)])


@settings(max_examples=80)
@given(MODELS, GPUS, _LAYOUTS, st.sampled_from([1, 2, 4, 8]), st.integers(1, 4096), _LENGTH, FACTOR)
def test_training_never_gets_cheaper_with_more_tokens_nor_beats_its_ideal(model, gpu, layout, dp, n, length, f):
    tp, pp, ep = layout
    dp = dp * ep  # expert parallelism is taken from the data-parallel ranks
    tc = _cm(model, gpu).training
    base = BatchStats.uniform(num_sequences=n, length=length)
    t = float(tc.step_time(tp, pp, dp, ep, 1, False, base))
    longer = float(tc.step_time(tp, pp, dp, ep, 1, False, BatchStats.uniform(num_sequences=n, length=length * f)))
    more = float(tc.step_time(tp, pp, dp, ep, 1, False, BatchStats.uniform(num_sequences=n + 1, length=length)))
    assert np.isfinite(t) and longer >= t * (1 - 1e-12) and more >= t * (1 - 1e-12)
    assert float(tc.ideal_step_time(tp * pp * dp, base)) <= t
