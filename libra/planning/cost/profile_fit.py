"""Fit cost-model coefficients to what `libra profile` measured on a live engine and trainer (pure: numpy only).

Three kinds of points: decode steps (batch x context -> seconds per engine step), prefills (prompt tokens ->
seconds to the first token) and training steps (sequence length x micro-batch -> seconds per optimizer step).
Each group fits the coefficients it pins down with `calibrate()` on most points and reports the MAPE on the rest
(every `held_out_every`-th point, never seen by the fit):

- decode: `step_overhead_s`, `per_seq_overhead_s`, `hbm_efficiency` (`decode_mfu` stays: a small grid of
  memory-bound steps cannot separate it);
- prefill: `prefill_mfu` (time to first token = one engine step with the prefill; the weight read and the step
  overhead come from the decode fit);
- a burst of one-token requests: `per_request_overhead_s` (one point, nothing held out);
- training: `train_mfu`, `train_attention_efficiency`, `microbatch_overhead_s`.

The coefficients are relative to the GPU spec given (the cost model describes GPUs): measured on a CPU engine they
describe that engine as if it were the named GPU, which is what makes `--coeffs` reproduce the measured times.

A point that cannot have been measured is refused when it is made, in one line naming it: a time that is not > 0
(the fit's error is relative to it), a batch, micro-batch, request count or TP degree below 1, a negative context,
a prefill, burst prompt or training sequence of no token. So is a group with fewer points for its fit than
coefficients it fits (the held-out points do not count): such a fit is not determined by what was measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.cost.calibrate import TrainingMeasurement, calibrate
from libra.spec import ClusterSpec, GPUSpec, ModelSpec, SpecError, checks

DECODE_FIT = ("step_overhead_s", "per_seq_overhead_s", "hbm_efficiency")
PREFILL_FIT = ("prefill_mfu",)
REQUEST_FIT = ("per_request_overhead_s",)
TRAIN_FIT = ("train_mfu", "train_attention_efficiency", "microbatch_overhead_s")


def _measured(owner: str, time_s: float, tp: int) -> None:
    """A measured time is > 0 (each point's error is relative to it) and the instance's TP degree >= 1."""
    checks.number(owner, "time_s", time_s, 0.0, above=True)
    checks.whole(owner, "tp", tp, 1)


@attrs.frozen(kw_only=True)
class DecodeStep:
    """One engine step decoding `batch` sequences with `context` tokens each took `time_s` (median)."""

    batch: int
    context: float
    time_s: float
    tp: int = 1

    def __attrs_post_init__(self) -> None:
        point = f"DecodeStep(batch={self.batch!r}, context={self.context!r})"
        checks.whole(point, "batch", self.batch, 1)
        checks.number(point, "context", self.context, 0.0)
        _measured(point, self.time_s, self.tp)

    def predict(self, cm: CostModel) -> float:
        return float(cm.rollout.decode_step_time(self.tp, float(self.batch), float(self.context)))


@attrs.frozen(kw_only=True)
class Prefill:
    """Prefilling one prompt of `tokens` tokens took `time_s` (time to the first token: one engine step)."""

    tokens: float
    time_s: float
    tp: int = 1

    def __attrs_post_init__(self) -> None:
        point = f"Prefill(tokens={self.tokens!r})"
        checks.number(point, "tokens", self.tokens, 0.0, above=True)
        _measured(point, self.time_s, self.tp)

    def predict(self, cm: CostModel) -> float:
        prefill = float(cm.rollout.prefill_time(self.tp, float(self.tokens), self.tokens / 2.0))
        return prefill + cm.coeffs.step_overhead_s


@attrs.frozen(kw_only=True)
class RequestBurst:
    """`requests` one-token requests of `prompt_tokens` tokens, sent at once, all finished after `time_s`."""

    requests: int
    prompt_tokens: float
    time_s: float
    tp: int = 1

    def __attrs_post_init__(self) -> None:
        point = f"RequestBurst(requests={self.requests!r}, prompt_tokens={self.prompt_tokens!r})"
        checks.whole(point, "requests", self.requests, 1)
        checks.number(point, "prompt_tokens", self.prompt_tokens, 0.0, above=True)
        _measured(point, self.time_s, self.tp)

    def predict(self, cm: CostModel) -> float:
        n, p = float(self.requests), float(self.prompt_tokens)
        prefill = float(cm.rollout.prefill_time(self.tp, n * p, p / 2.0))
        return n * cm.coeffs.per_request_overhead_s + prefill + float(cm.rollout.decode_step_time(self.tp, n, p))


@attrs.frozen(kw_only=True)
class TrainStep:
    """One optimizer step over one micro-batch of `micro_batch` sequences of `seq_len` tokens took `time_s`."""

    seq_len: int
    micro_batch: int
    time_s: float

    def __attrs_post_init__(self) -> None:
        point = f"TrainStep(seq_len={self.seq_len!r}, micro_batch={self.micro_batch!r})"
        checks.whole(point, "seq_len", self.seq_len, 1)
        checks.whole(point, "micro_batch", self.micro_batch, 1)
        _measured(point, self.time_s, 1)

    def measurement(self) -> TrainingMeasurement:
        batch = BatchStats.uniform(num_sequences=self.micro_batch, length=self.seq_len)
        return TrainingMeasurement(tp=1, pp=1, dp=1, batch=batch, micro_batch=self.micro_batch, time_s=self.time_s)


@attrs.frozen(kw_only=True)
class GroupFit:
    kind: str
    fitted: dict  # coefficient -> value
    points: int
    held_out: int
    mape_fit: float  # percent, on the points the fit saw
    mape_held_out: float  # percent, on the held-out points (nan when none)


@attrs.frozen(kw_only=True)
class ProfileFit:
    coeffs: CostCoefficients
    groups: tuple[GroupFit, ...]

    def changed(self) -> dict:
        """The fitted coefficients (what a `--coeffs` file needs)."""
        out: dict = {}
        for g in self.groups:
            out.update(g.fitted)
        return out


def _split(points: Sequence, every: int) -> tuple[list, list]:
    if every < 2 or len(points) < 3:
        return list(points), []
    fit = [p for i, p in enumerate(points) if i % every != every - 1]
    return fit, [p for i, p in enumerate(points) if i % every == every - 1]


def _mape(cm: CostModel, points: Sequence) -> float:
    if not points:
        return float("nan")
    return 100.0 * float(np.mean([abs(p.predict(cm) / p.time_s - 1.0) for p in points]))


def _enough(kind: str, points: int, names: Sequence[str], every: int) -> None:
    """Refuse a group whose fit would see fewer points than it fits coefficients."""
    seen = len(_split(range(points), every)[0])
    if seen >= len(names):
        return
    need = next(n for n in range(len(names), 4 * len(names) + 4) if len(_split(range(n), every)[0]) >= len(names))
    raise SpecError(
        f"{kind}: {points} point(s), {seen} for the fit, cannot fit {len(names)} coefficients ({', '.join(names)}); "
        f"measure at least {need} ({_held_out_words(every)})"
    )


def _held_out_words(every: int) -> str:
    return f"one point in {every} is held out" if every >= 2 else "none is held out"


def _group(kind, cluster, model, start, points, names, every) -> tuple[CostCoefficients, GroupFit]:
    _enough(kind, len(points), names, every)
    fit_pts, held = _split(points, every)
    result = calibrate(cluster, model, fit_pts, fit=names, start=start, iterations=3000)
    cm = CostModel(cluster, model, result.coeffs)
    group = GroupFit(
        kind=kind,
        fitted={n: float(getattr(result.coeffs, n)) for n in names},
        points=len(points),
        held_out=len(held),
        mape_fit=_mape(cm, fit_pts),
        mape_held_out=_mape(cm, held),
    )
    return result.coeffs, group


def fit_profile(
    gpu: GPUSpec,
    model: ModelSpec,
    *,
    decode: Sequence[DecodeStep] = (),
    prefill: Sequence[Prefill] = (),
    train: Sequence[TrainStep] = (),
    requests: Sequence[RequestBurst] = (),
    start: CostCoefficients | None = None,
    held_out_every: int = 3,
) -> ProfileFit:
    """Fit each group that has points; coefficients of groups without points keep their values in `start`."""
    if not (decode or prefill or train):
        raise SpecError("nothing measured: profile needs decode, prefill or training points")
    cluster = ClusterSpec.from_total(gpu=gpu, num_gpus=1, gpus_per_node=1)
    coeffs = start or CostCoefficients()
    groups = []
    if decode:
        coeffs, g = _group("decode", cluster, model, coeffs, list(decode), DECODE_FIT, held_out_every)
        groups.append(g)
    if prefill:
        coeffs, g = _group("prefill", cluster, model, coeffs, list(prefill), PREFILL_FIT, held_out_every)
        groups.append(g)
    if requests:
        coeffs, g = _group("requests", cluster, model, coeffs, list(requests), REQUEST_FIT, held_out_every)
        groups.append(g)
    if train:
        measured = [t.measurement() for t in train]
        one_step = attrs.evolve(coeffs, logprob_forward_passes=0)  # a measured step has no extra log-prob pass
        fitted, g = _group("train", cluster, model, one_step, measured, TRAIN_FIT, held_out_every)
        coeffs = attrs.evolve(fitted, logprob_forward_passes=coeffs.logprob_forward_passes)
        groups.append(g)
    return ProfileFit(coeffs=coeffs, groups=tuple(groups))


def model_from_hf_config(config: dict, *, name: str, dtype_bytes: int = 2) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json mapping (Llama/Qwen-style dense or MoE decoder)."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 1)
        return ModelSpec(
            name=name,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            ffn_hidden_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            num_experts=experts,
            experts_per_token=int(config.get("num_experts_per_tok") or 1) if experts > 1 else 1,
            moe_ffn_hidden_size=int(config["moe_intermediate_size"]) if experts > 1 else None,
            dtype_bytes=dtype_bytes,
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"config.json of {name}: cannot read the architecture ({exc})") from None
