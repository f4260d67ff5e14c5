"""The rollout backend of a run: the engines `libra run` drives, and the checked weight push after each optimizer
step (`Orchestrator` calls both; `make_backend` is public, to start engines once and hand them to several runs)."""

from __future__ import annotations

import math
from typing import Any

from libra.runtime.clock import Clock
from libra.runtime.config import RunConfig


def make_backend(config: RunConfig, model_dir: str) -> Any:
    """The rollout backend a run of `config` drives (no instance started): vLLM engines of `model_dir`, each with
    TP 1, paused (not stopped) while lent to training; local processes, or Ray actors with `config.ray`."""
    if config.ray is not None:
        from libra.adapters.ray_rollout import RayRolloutBackend

        v = config.virtual
        return RayRolloutBackend(
            model=model_dir,
            dtype=config.engine.dtype,
            seed=config.seed,
            address=config.ray.address,
            nodes=-(-v.gpus // v.gpus_per_node),
            gpus_per_node=v.gpus_per_node,
        )
    from libra.adapters.vllm_backend import VLLMRolloutBackend

    return VLLMRolloutBackend(
        model=model_dir, dtype=config.engine.dtype, seed=config.seed, engine_tp="one", sleep_mode="pause"
    )


def push_weights(backend: Any, trainer: Any, update: Any, clock: Clock, step: int) -> dict[str, Any]:
    """Push a weight update to every instance, then check both sides: each instance reports the update's version,
    and when the trainer is still at that version, each serves its `lm_head` with the trainer's checksum. Raises
    `RuntimeError` on any mismatch; returns the step record's `push` entry."""
    start = clock.now()
    served = backend.load_weights(update)
    want = float(trainer.module.lm_head.weight.detach().double().sum()) if trainer.version == update.version else None
    versions = {n: backend.weight_version(n) for n in backend.instances()}
    checks = {n: backend.param_checksum(n, "lm_head.weight") for n in backend.instances()}
    bad = {n: v for n, v in versions.items() if v != update.version}
    if served != update.version or bad:
        raise RuntimeError(f"weight push of version {update.version}: instances serve {bad or served}")
    if want is not None and any(_differs(c, want) for c in checks.values()):
        raise RuntimeError(f"weight push of version {update.version}: checksums {checks} != trainer {want}")
    for n in versions:
        clock.mark(n, "weights", start, clock.now(), step)
    return {"version": update.version, "instances": versions, "checksum_checked": want is not None}


def _differs(served: float, want: float) -> bool:
    """Whether an instance's checksum differs from the trainer's (relative 1e-6). A value that is not finite must
    be the same (NaN as NaN): `abs(nan - want) > tolerance` is false, so an instance serving NaN weights passed."""
    if not (math.isfinite(served) and math.isfinite(want)):
        return not (served == want or (math.isnan(served) and math.isnan(want)))
    return abs(served - want) > 1e-6 * max(1.0, abs(want))


__all__ = ["make_backend", "push_weights"]
