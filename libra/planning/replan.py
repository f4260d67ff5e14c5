"""The replan gate: apply a candidate plan only when it pays for its own reconfiguration.

    saving   = (T_current - T_candidate) * horizon_steps        (predicted, on the newest workload profile)
    cost     = to_rollout_s   if any GPU turns into rollout or the rollout instance mix changes
             + to_training_s  if any GPU turns into training (0 when the elastic pool joins without blocking)
    apply   <=> saving > cost  and  (T_current - T_candidate) / T_current >= min_relative_gain

Defaults from the published system (docs/design.md): turning a worker into rollout takes about 10.8 s (starting vLLM),
into training about 8 s (3.6 s snapshot + 4.4 s restore), and the published system also asks for a relative gain of at
least 5 %.
"""

from __future__ import annotations

import math
from collections import Counter

import attrs

from libra.spec import Plan, SpecError, checks


@attrs.frozen(kw_only=True)
class ReplanDecision:
    """What the gate decided and why; a value to log, test and replay."""

    apply: bool
    current_s: float
    candidate_s: float
    saving_s: float
    cost_s: float
    gpus_to_rollout: int
    gpus_to_training: int
    reason: str


def _finite_at_least(low: float):
    def check(instance: object, attribute: attrs.Attribute, value: object) -> None:
        if not low <= checks.as_float(value) < math.inf:  # a bool, a string or NaN: as_float is NaN
            raise SpecError(f"ReplanGate.{attribute.name} must be a number >= {low:g}, got {value!r}")

    return check


@attrs.frozen(kw_only=True)
class ReplanGate:
    to_rollout_s: float = attrs.field(default=10.8, validator=_finite_at_least(0.0))
    to_training_s: float = attrs.field(default=8.0, validator=_finite_at_least(0.0))
    min_relative_gain: float = attrs.field(default=0.05, validator=_finite_at_least(0.0))
    nonblocking_join: bool = False  # elastic pool: a joining replica syncs while the core trains

    def reconfiguration_cost(self, current: Plan, candidate: Plan) -> tuple[float, int, int]:
        to_rollout = max(0, candidate.rollout.num_gpus - current.rollout.num_gpus)
        to_training = max(0, candidate.train.num_gpus - current.train.num_gpus)
        mix = lambda p: Counter((g.tp, g.count) for g in p.rollout.instances)  # noqa: E731
        restart = to_rollout > 0 or mix(current) != mix(candidate)
        cost = self.to_rollout_s if restart else 0.0
        rebuild = _layout(candidate) != _layout(current)  # a new TP/PP/EP layout reloads the training state
        if rebuild or (to_training > 0 and not self.nonblocking_join):
            cost += self.to_training_s
        return cost, to_rollout, to_training

    def decide(
        self,
        *,
        current: Plan,
        candidate: Plan,
        horizon_steps: int,
        current_makespan_s: float | None = None,
        candidate_makespan_s: float | None = None,
    ) -> ReplanDecision:
        """`current_makespan_s` is the current plan's predicted makespan on the newest profile (it drifts);
        `candidate_makespan_s` defaults to the candidate's own prediction."""
        if not (checks.is_whole(horizon_steps) and horizon_steps >= 1):
            raise SpecError(f"horizon_steps must be >= 1, got {horizon_steps!r} (a whole number of steps)")
        t_cur = current.makespan_s if current_makespan_s is None else current_makespan_s
        t_new = candidate.makespan_s if candidate_makespan_s is None else candidate_makespan_s
        cost, to_rollout, to_training = self.reconfiguration_cost(current, candidate)
        gain = t_cur - t_new
        saving = gain * horizon_steps
        relative = gain / t_cur if t_cur > 0 else 0.0
        if not t_new < math.inf:  # (inf, or NaN: nothing compares true against it, so it must not fall through)
            apply, reason = False, "the candidate does not fit the newest profile either"
            saving = 0.0
        elif t_cur == math.inf:
            apply, reason = (
                True,
                f"the current plan no longer fits the newest profile; the candidate takes {t_new:.1f} s",
            )
        elif gain <= 0:
            apply, reason = False, f"candidate is not faster ({t_new:.1f} s vs {t_cur:.1f} s per step)"
        elif relative < self.min_relative_gain:
            apply, reason = False, f"gain {relative:.1%} below the {self.min_relative_gain:.0%} threshold"
        elif saving <= cost:
            apply, reason = False, f"saving {saving:.1f} s over {horizon_steps} steps does not cover {cost:.1f} s"
        else:
            apply, reason = True, f"saving {saving:.1f} s over {horizon_steps} steps exceeds {cost:.1f} s"
        return ReplanDecision(
            apply=apply,
            current_s=t_cur,
            candidate_s=t_new,
            saving_s=saving,
            cost_s=cost,
            gpus_to_rollout=to_rollout,
            gpus_to_training=to_training,
            reason=reason,
        )


def _layout(plan: Plan) -> tuple[int, int, int]:
    t = plan.train
    return (t.tp, t.pp, t.ep)
