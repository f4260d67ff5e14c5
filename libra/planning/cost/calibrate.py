"""Fit cost-model coefficients to measured timings and report the fit error (MAPE).

A user runs a few rollout batches and training steps on their own cluster, records them as `RolloutMeasurement`
and `TrainingMeasurement` values, and calls `calibrate`. The fit minimises the mean squared log error over the
chosen coefficients (all positive, so the search runs in log space) with Nelder-Mead; numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import numpy as np

from libra.planning.cost import BatchStats, CostCoefficients, CostModel
from libra.planning.cost.coefficients import _FRACTIONS
from libra.spec import ClusterSpec, ModelSpec, SpecError

DEFAULT_FIT = (
    "hbm_efficiency",
    "decode_mfu",
    "prefill_mfu",
    "step_overhead_s",
    "per_request_overhead_s",
    "train_mfu",
    "train_attention_efficiency",
    "microbatch_overhead_s",
)


@attrs.frozen(kw_only=True)
class RolloutMeasurement:
    """One instance of degree `tp` served requests with these totals in `time_s` seconds."""

    tp: int
    num_requests: float
    decode_tokens: float
    prefill_tokens: float
    resident_context: float
    max_gen: float
    time_s: float

    def predict(self, cm: CostModel) -> float:
        return float(
            cm.rollout.instance_time(
                self.tp,
                num_requests=self.num_requests,
                decode_tokens=self.decode_tokens,
                prefill_tokens=self.prefill_tokens,
                resident_context=self.resident_context,
                max_gen=self.max_gen,
            )
        )


@attrs.frozen(kw_only=True)
class TrainingMeasurement:
    """One training step with this layout and batch took `time_s` seconds."""

    tp: int
    pp: int
    dp: int
    batch: BatchStats
    time_s: float
    ep: int = 1
    micro_batch: int = 1
    recompute: bool = False

    def predict(self, cm: CostModel) -> float:
        return float(
            cm.training.step_time(self.tp, self.pp, self.dp, self.ep, self.micro_batch, self.recompute, self.batch)
        )


class Measurement(Protocol):
    """Anything measured that the cost model can predict: a time and how to predict it (the rollout and training
    measurements above, or a published anchor)."""

    @property
    def time_s(self) -> float: ...

    def predict(self, cm: CostModel) -> float: ...


@attrs.frozen(kw_only=True)
class CalibrationResult:
    coeffs: CostCoefficients
    mape_before: float
    mape_after: float
    errors: tuple[float, ...]  # relative error of each measurement after the fit
    iterations: int


def mape(cm: CostModel, measurements: Sequence[Measurement]) -> float:
    """Mean absolute percentage error of the model's predictions, in percent."""
    errs = [abs(m.predict(cm) / m.time_s - 1.0) for m in measurements]
    return 100.0 * float(np.mean(errs))


def _nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, *, iterations: int, step: float = 0.3, tol: float = 1e-10
) -> tuple[np.ndarray, int]:
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    it = 0
    for it in range(1, iterations + 1):  # noqa: B007 - `it` is returned
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflect = centroid + (centroid - simplex[-1])
        fr = f(reflect)
        if fr < values[0]:
            expand = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expand)
            simplex[-1], values[-1] = (expand, fe) if fe < fr else (reflect, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflect, fr
        else:
            contract = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contract)
            if fc < values[-1]:
                simplex[-1], values[-1] = contract, fc
            else:  # shrink towards the best point
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    best = int(np.argmin(values))
    return simplex[best], it


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1.0 - p))


def calibrate(
    cluster: ClusterSpec,
    model: ModelSpec,
    measurements: Sequence[Measurement],
    *,
    fit: Sequence[str] = DEFAULT_FIT,
    start: CostCoefficients | None = None,
    iterations: int = 2000,
) -> CalibrationResult:
    """Fit the coefficients named in `fit` (others stay as in `start`) to `measurements`."""
    if not measurements:
        raise SpecError("calibrate needs at least one measurement")
    for m in measurements:
        if not (m.time_s > 0 and math.isfinite(m.time_s)):  # inf would make every fit equally bad
            raise SpecError(f"measured time must be a finite number > 0, got {m.time_s!r} in {m}")
    start = start or CostCoefficients()
    known = {f.name for f in attrs.fields(CostCoefficients)}
    unknown = [name for name in fit if name not in known]
    if unknown:
        raise SpecError(f"cannot fit unknown coefficient(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    fraction = np.array([name in _FRACTIONS for name in fit])
    # positive coefficients are searched in log space, efficiencies in logit space so they stay in (0, 1)
    v0 = np.array([float(getattr(start, name)) for name in fit])
    x0 = np.where(fraction, _logit(np.clip(v0, 1e-6, 0.999)), np.log(np.maximum(v0, 1e-12)))
    targets = np.log([m.time_s for m in measurements])

    def coeffs_at(x: np.ndarray) -> CostCoefficients:
        values = np.where(fraction, 1.0 / (1.0 + np.exp(-x)), np.exp(x))
        return start.replace(**{name: float(v) for name, v in zip(fit, values)})

    def loss(x: np.ndarray) -> float:
        cm = CostModel(cluster, model, coeffs_at(x))
        pred = np.array([m.predict(cm) for m in measurements])
        if not np.all(np.isfinite(pred)) or np.any(pred <= 0):
            return 1e9
        return float(np.mean((np.log(pred) - targets) ** 2))

    before = mape(CostModel(cluster, model, start), measurements)
    x, iters = _nelder_mead(loss, x0, iterations=iterations)
    fitted = coeffs_at(x)
    cm = CostModel(cluster, model, fitted)
    errors = tuple(m.predict(cm) / m.time_s - 1.0 for m in measurements)
    return CalibrationResult(
        coeffs=fitted,
        mape_before=before,
        mape_after=100.0 * float(np.mean(np.abs(errors))),
        errors=errors,
        iterations=iters,
    )
