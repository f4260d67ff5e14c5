"""Published measurements (anchors.yaml) as data, what the cost model predicts for each, and the fit of the defaults.

`load_anchors()` reads the table and checks every row (a bad value, unit, split, source or setup field is a one-line
SpecError naming the file, the anchor and the field); each `Anchor` knows its setup (GPU, model, layout, batch) and
the measured time in seconds derived from the number as published (tokens/s, ms, tokens/s/GPU).
`Anchor.predict(cm)` is the cost model's time for the same setup with `cm.coeffs` (the anchor's own GPU and model,
whatever `cm` was built for), so the anchors go straight into `calibrate()`. `fit_defaults()` fits on the
`split: fit` anchors and `family_errors()` reports the held-out and overall MAPE per family (docs/cost-model.md;
tests/planning/test_cost_anchors.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import cast

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.spec import ClusterSpec, ModelSpec, SpecError, checks, get_gpu, get_model
from libra.spec.loaders import construct, read_mapping

ANCHORS_FILE = Path(__file__).with_name("anchors.yaml")
KINDS = ("decode_batch1", "static_batch", "prefill", "train_step")

# The coefficients the anchors pin down (the rest: engine behaviour under load, fitted to the paper's ratios).
ANCHOR_FIT = (
    "hbm_efficiency",
    "allreduce_latency_s",
    "step_overhead_s",
    "tp_step_overhead_s",
    "prefill_mfu",
    "train_mfu",
    "train_attention_efficiency",
    "microbatch_overhead_s",
    "expert_efficiency",
    "expert_saturation_tokens",
)


@attrs.frozen(kw_only=True)
class Anchor:
    id: str
    family: str
    kind: str
    source: str
    url: str
    where: str
    gpu: str
    model: ModelSpec
    published: float
    unit: str
    split: str
    setup: dict = attrs.field(eq=False, repr=False)

    @property
    def time_s(self) -> float:
        """The measured time in seconds of what `predict` computes, from the number as published."""
        s, v = self.setup, self.published
        if self.kind == "decode_batch1":
            return 1.0 / v  # tokens/s of one sequence
        if self.kind == "static_batch":
            return s["batch"] * s["output"] / v  # output tokens/s of the batch
        if self.kind == "prefill":
            return v / 1e3  # ms
        tokens = s["global_batch"] * s["seq_len"]
        if self.unit == "s":
            return v
        if self.unit == "tokens/s":
            return tokens / v
        return tokens / (v * s["gpus"])  # tokens/s/GPU

    def predict(self, cm: CostModel) -> float:
        """The cost model's seconds for this setup with `cm.coeffs` (this anchor's own GPU and model)."""
        s, c = self.setup, cm.coeffs
        gpu = get_gpu(self.gpu)
        if self.kind == "train_step":
            cluster = ClusterSpec.from_total(gpu=gpu, num_gpus=s["gpus"], gpus_per_node=8)
            tm = CostModel(cluster, self.model, attrs.evolve(c, logprob_forward_passes=0)).training
            tp, pp, ep = s.get("tp", 1), s.get("pp", 1), s.get("ep", 1)
            batch = BatchStats.uniform(num_sequences=s["global_batch"], length=s["seq_len"])
            dp = s["gpus"] // (tp * pp)
            return float(tm.step_time(tp, pp, dp, ep, s["micro_batch"], bool(s["recompute"]), batch))
        cluster = ClusterSpec.from_total(gpu=gpu, num_gpus=8, gpus_per_node=8)
        rc = CostModel(cluster, self.model, c).rollout
        tp = s["tp"]
        if self.kind == "decode_batch1":
            return float(rc.decode_step_time(tp, 1.0, float(s["context"])))
        if self.kind == "prefill":
            n = float(s["input"])
            return float(rc.prefill_time(tp, n, n / 2.0))
        requests, n_in, n_out = float(s["batch"]), float(s["input"]), float(s["output"])
        prefill = rc.prefill_time(tp, requests * n_in, n_in / 2.0)
        return float(prefill + n_out * rc.decode_step_time(tp, requests, n_in + n_out / 2.0))


# What each kind's published number is in (Anchor.time_s converts it) and its setup: required fields, then
# optional ones; every setup value is a positive number (a whole number where marked), `recompute` a boolean.
_UNITS = {
    "decode_batch1": ("tokens/s",),
    "static_batch": ("output tokens/s",),
    "prefill": ("ms",),
    "train_step": ("s", "tokens/s", "tokens/s/GPU"),
}
_WHOLE = ("tp", "pp", "ep", "gpus", "batch", "input", "output", "seq_len", "global_batch", "micro_batch")
_SETUP: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "decode_batch1": (("tp", "context"), ()),
    "static_batch": (("tp", "batch", "input", "output"), ()),
    "prefill": (("tp", "input"), ()),
    "train_step": (("gpus", "seq_len", "global_batch", "micro_batch", "recompute"), ("tp", "pp", "ep")),
}
_SPLITS = ("fit", "check")
_FIXED = ("id", "family", "kind", "source", "gpu", "published", "unit", "split")


def _number(raw: object) -> bool:
    """A finite number > 0 as `libra.spec.checks` reads numbers (a bool, a string or an integer too large for a
    float is none)."""
    return 0 < checks.as_float(raw) < math.inf


def _check_setup(where: str, kind: str, setup: dict) -> None:
    """One-line SpecError for a missing, unknown or bad setup field of an anchor of `kind`."""
    required, optional = _SETUP[kind]
    missing = [k for k in required if k not in setup]
    if missing:
        raise SpecError(f"{where}: missing field(s) {', '.join(missing)} for kind {kind}")
    unknown = sorted(set(setup) - set(required) - set(optional))
    if unknown:
        known = ", ".join((*required, *optional))
        raise SpecError(f"{where}: unknown field(s) {', '.join(unknown)} for kind {kind}; known: {known}")
    for key, raw in setup.items():
        if key == "recompute":
            if not isinstance(raw, bool):
                raise SpecError(f"{where}: recompute must be true or false, got {raw!r}")
        elif key in _WHOLE:
            if not (_number(raw) and float(cast(float, raw)).is_integer()):
                raise SpecError(f"{where}: {key} must be a whole number >= 1, got {raw!r}")
        elif not _number(raw):
            raise SpecError(f"{where}: {key} must be a finite number > 0, got {raw!r}")
    if kind == "train_step":
        tp, pp, ep = setup.get("tp", 1), setup.get("pp", 1), setup.get("ep", 1)
        if setup["gpus"] % (tp * pp) or (setup["gpus"] // (tp * pp)) % ep:
            raise SpecError(f"{where}: gpus({setup['gpus']}) must be a multiple of tp({tp}) * pp({pp}) * ep({ep})")


def _anchor(path: str, row: object, models: dict[str, ModelSpec], sources: dict) -> Anchor:
    """One row of the table, checked: a one-line SpecError naming the file, the anchor and the field."""
    if not isinstance(row, dict):
        raise SpecError(f"{path}: each anchor must be a mapping, got {row!r}")
    where = f"{path}: anchor {row.get('id')!r}"
    row = dict(row)
    row.pop("note", None)
    missing = [k for k in (*_FIXED, "model") if k not in row]
    if missing:
        raise SpecError(f"{where}: missing field(s) {', '.join(missing)}")
    fixed = {k: row.pop(k) for k in _FIXED}
    if not isinstance(fixed["id"], str) or not fixed["id"]:
        raise SpecError(f"{where}: id must be a non-empty string")
    if fixed["kind"] not in KINDS:
        raise SpecError(f"{where}: unknown kind {fixed['kind']!r}; known: {', '.join(KINDS)}")
    kind = fixed["kind"]
    if not isinstance(fixed["family"], str) or not fixed["family"]:
        raise SpecError(f"{where}: family must be a non-empty string, got {fixed['family']!r}")
    if not _number(fixed["published"]):
        raise SpecError(f"{where}: published must be a finite number > 0, got {fixed['published']!r}")
    if fixed["unit"] not in _UNITS[kind]:
        raise SpecError(
            f"{where}: unit must be one of {', '.join(_UNITS[kind])} for kind {kind}, got {fixed['unit']!r}"
        )
    if fixed["split"] not in _SPLITS:
        raise SpecError(f"{where}: split must be fit or check, got {fixed['split']!r}")
    source = sources.get(fixed["source"]) if isinstance(fixed["source"], str) else None
    if (
        not isinstance(source, dict)
        or not isinstance(source.get("url"), str)
        or not isinstance(source.get("where"), str)
    ):
        raise SpecError(f"{where}: source {fixed['source']!r} is not one of the sources with a url and a where")
    name = row.pop("model")
    if not isinstance(name, str) or not isinstance(fixed["gpu"], str):
        raise SpecError(f"{where}: model and gpu must be names, got {name!r} and {fixed['gpu']!r}")
    try:
        model = models[name] if name in models else get_model(name)
        get_gpu(fixed["gpu"])
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    _check_setup(where, kind, row)
    return Anchor(**fixed, url=source["url"], where=source["where"], model=model, setup=row)


@cache
def _load(path: str) -> tuple[Anchor, ...]:
    data = read_mapping(Path(path))
    models, sources, rows = data.get("models") or {}, data.get("sources") or {}, data.get("anchors")
    if not isinstance(models, dict) or not isinstance(sources, dict):
        raise SpecError(f"{path}: models and sources must be mappings")
    if not isinstance(rows, list) or not rows:
        raise SpecError(f"{path}: anchors must be a non-empty list of anchors")
    specs = {}
    for name, fields in models.items():
        if not isinstance(fields, dict):
            raise SpecError(f"{path}: model {name!r} must be a mapping of ModelSpec fields")
        try:
            specs[name] = construct(ModelSpec, {"name": name, **fields}, Path(path))
        except SpecError as exc:
            raise SpecError(f"{path}: model {name!r}: {str(exc).removeprefix(f'{path}: ')}") from None
    out = [_anchor(path, row, specs, sources) for row in rows]
    seen: set[str] = set()
    for a in out:
        if a.id in seen:
            raise SpecError(f"{path}: anchor {a.id!r}: the id is used twice")
        seen.add(a.id)
    return tuple(out)


def load_anchors(path: str | Path = ANCHORS_FILE) -> tuple[Anchor, ...]:
    """Every anchor of the table (cached per path)."""
    return _load(str(path))


def families(anchors: Sequence[Anchor]) -> list[str]:
    return sorted({a.family for a in anchors})


@attrs.frozen(kw_only=True)
class FamilyError:
    family: str
    count: int
    held_out: int
    mape_all: float  # percent, every anchor of the family
    mape_held_out: float  # percent, the `split: check` anchors only (nan when none)


def anchor_errors(anchors: Sequence[Anchor], coeffs: CostCoefficients | None = None) -> dict[str, float]:
    """Relative error (predicted / measured - 1) of every anchor under `coeffs` (defaults when None)."""
    coeffs = coeffs or CostCoefficients()
    cm = CostModel(
        ClusterSpec.from_total(gpu=get_gpu("A100-80GB"), num_gpus=8, gpus_per_node=8), get_model("Qwen3-14B"), coeffs
    )
    return {a.id: a.predict(cm) / a.time_s - 1.0 for a in anchors}


def family_errors(anchors: Sequence[Anchor], coeffs: CostCoefficients | None = None) -> list[FamilyError]:
    errors = anchor_errors(anchors, coeffs)
    out = []
    for fam in families(anchors):
        members = [a for a in anchors if a.family == fam]
        held = [a for a in members if a.split == "check"]
        all_err = [abs(errors[a.id]) for a in members]
        held_err = [abs(errors[a.id]) for a in held]
        out.append(
            FamilyError(
                family=fam,
                count=len(members),
                held_out=len(held),
                mape_all=100.0 * float(np.mean(all_err)),
                mape_held_out=100.0 * float(np.mean(held_err)) if held_err else float("nan"),
            )
        )
    return out


def fit_defaults(
    anchors: Sequence[Anchor] | None = None,
    *,
    start: CostCoefficients | None = None,
    fit: Sequence[str] = ANCHOR_FIT,
    iterations: int = 4000,
):
    """`calibrate()` on the `split: fit` anchors; returns its CalibrationResult (coefficients and fit MAPE)."""
    from libra.planning.cost.calibrate import calibrate

    anchors = load_anchors() if anchors is None else anchors
    train = [a for a in anchors if a.split == "fit"]
    cluster = ClusterSpec.from_total(gpu=get_gpu("A100-80GB"), num_gpus=8, gpus_per_node=8)
    return calibrate(cluster, get_model("Qwen3-14B"), train, fit=fit, start=start, iterations=iterations)
