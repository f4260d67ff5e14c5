"""Seeded synthetic agentic workloads with drift: `search-r1`, `dapo-math`, `r2e-gym`.

A run draws `num_prompts` prompts per step from a data set of `num_dataset_prompts` prompts (an epoch is a seeded
permutation of it, so prompts recur across steps as in real RL training) and `samples_per_prompt` samples of each.
Every prompt has latent traits (difficulty, verbosity) that its samples share; tool returns shift, but do not
fix, how long a trajectory goes on. Lengths drift with the step: `progress = min(1, step / drift_steps)`.

`WorkloadGenerator.step(s)` depends only on (name, seed, sizes, s): any call order gives the same trajectories.
Every trajectory says it is synthetic: `extra["source"] == "synthetic:<name>"` (written to a trace and read back).
"""

from __future__ import annotations

import zlib
from types import ModuleType
from typing import Any

import numpy as np

from libra.spec import SpecError, checks
from libra.workloads.generators import dapo_math, r2e_gym, search_r1, swe_agent
from libra.workloads.generators._base import GeneratedStep, PromptPool, TurnFields, cap_lengths
from libra.workloads.trace import MAX_TOKENS, Trajectory

_MODULES: dict[str, ModuleType] = {m.NAME: m for m in (search_r1, dapo_math, r2e_gym, swe_agent)}
WORKLOAD_NAMES: tuple[str, ...] = tuple(_MODULES)

# bounds checked before any array is made (one step's arrays are about 2 KB a trajectory; the prompt pool 40 bytes a
# prompt): the CLI's bound on a step, and room for its default data set of 4 x the prompts of a step
MAX_TRAJECTORIES_PER_STEP = 1 << 20
MAX_DATASET_PROMPTS = 1 << 24
MAX_GENERATED = 10 * MAX_TRAJECTORIES_PER_STEP  # trajectories of one `generate` call (the CLI's bound too)

__all__ = ["WORKLOAD_NAMES", "GeneratedStep", "TurnFields", "WorkloadGenerator", "generate"]


def _positive_int(name: str, value: Any, highest: int | None = None) -> int:
    if not (checks.is_whole(value) and value >= 1):
        raise SpecError(f"{name} must be an integer >= 1, got {value!r}")
    if highest is not None and value > highest:
        raise SpecError(f"{name} must be at most {highest:,}, got {value:,}")
    return int(value)


class WorkloadGenerator:
    """Trajectories of one synthetic workload, step by step.

    `num_dataset_prompts` defaults to 4 x `num_prompts` (each prompt comes back about every fourth step).
    Trajectories are cut at `max_model_len` total tokens; prompts are not: a prompt longer than `max_model_len` gives
    a trajectory of the prompt and one empty turn (the CLI refuses such a length). Each tool turn carries
    `tool_latency_s` in `extra`, each trajectory `extra["source"] = "synthetic:<name>"`.
    """

    def __init__(
        self,
        name: str,
        *,
        seed: int,
        num_prompts: int = 64,
        samples_per_prompt: int = 16,
        max_model_len: int = 40960,
        drift_steps: int = 100,
        num_dataset_prompts: int | None = None,
    ) -> None:
        if not isinstance(name, str) or name not in _MODULES:
            raise SpecError(f"unknown workload {name!r}; expected one of {', '.join(WORKLOAD_NAMES)}")
        if not (checks.is_whole(seed) and seed >= 0):
            raise SpecError(f"seed must be a non-negative integer, got {seed!r}")
        self.name = name
        self.seed = seed
        self.num_prompts = _positive_int("num_prompts", num_prompts, MAX_TRAJECTORIES_PER_STEP)
        self.samples_per_prompt = _positive_int("samples_per_prompt", samples_per_prompt, MAX_TRAJECTORIES_PER_STEP)
        if num_prompts * samples_per_prompt > MAX_TRAJECTORIES_PER_STEP:
            raise SpecError(
                f"num_prompts x samples_per_prompt must be at most {MAX_TRAJECTORIES_PER_STEP:,} trajectories a "
                f"step, got {num_prompts:,} x {samples_per_prompt:,}"
            )
        # (the trace schema's bound: a trajectory of the generator is valid by construction, `to_trajectories`)
        self.max_model_len = _positive_int("max_model_len", max_model_len, MAX_TOKENS)
        self.drift_steps = _positive_int("drift_steps", drift_steps)
        self.num_dataset_prompts = _positive_int(
            "num_dataset_prompts",
            4 * num_prompts if num_dataset_prompts is None else num_dataset_prompts,
            MAX_DATASET_PROMPTS,
        )
        self._module = _MODULES[name]
        self._tag = zlib.crc32(name.encode())
        rng = np.random.default_rng([seed, self._tag, 0])
        self._pool = PromptPool(
            prompt_tokens=self._module.prompt_tokens(rng, self.num_dataset_prompts),
            traits=rng.standard_normal((self.num_dataset_prompts, self._module.NUM_TRAITS)),
        )
        self._epochs: dict[int, np.ndarray] = {}

    @property
    def tools(self) -> tuple[str, ...]:
        return self._module.TOOLS

    def progress(self, step: int) -> float:
        """Where `step` lies in the drift: 0 at the start, 1 at `drift_steps` and after."""
        return min(1.0, self._check_step(step) / self.drift_steps)

    def _epoch(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            self._epochs[epoch] = np.random.default_rng([self.seed, self._tag, 2, epoch]).permutation(
                self.num_dataset_prompts
            )
        return self._epochs[epoch]

    def _check_step(self, step: Any) -> int:
        if not (checks.is_whole(step) and step >= 0):
            raise SpecError(f"step must be a non-negative integer, got {step!r}")
        # the prompts of a step are positions step * num_prompts + i in the run's sequence of prompts (int64)
        highest = (2**63 - 1) // self.num_prompts - 1
        if step > highest:
            raise SpecError(f"step must be at most {highest:,} with {self.num_prompts} prompts per step, got {step}")
        return int(step)

    def prompt_indices(self, step: int) -> np.ndarray:
        """Data-set indices of the prompts of `step`: consecutive slices of seeded per-epoch permutations."""
        start = self._check_step(step) * self.num_prompts
        positions = np.arange(start, start + self.num_prompts)
        epochs, offsets = np.divmod(positions, self.num_dataset_prompts)
        return np.array([self._epoch(int(e))[o] for e, o in zip(epochs, offsets)], np.int64)

    def step(self, step: int) -> list[Trajectory]:
        """All `num_prompts * samples_per_prompt` trajectories of one step, grouped by prompt."""
        return self.step_arrays(step).trajectories()

    def step_arrays(self, step: int) -> GeneratedStep:
        """`step(step)` as arrays, with the trajectories made only when asked (`GeneratedStep.trajectories`)."""
        step = self._check_step(step)
        prompts = np.repeat(self.prompt_indices(step), self.samples_per_prompt)
        rng = np.random.default_rng([self.seed, self._tag, 1, step])
        ptoks = self._pool.prompt_tokens[prompts]
        batch = self._module.simulate(rng, self._pool.traits[prompts], ptoks, self.progress(step))
        return GeneratedStep(
            step=step,
            batch=cap_lengths(batch, ptoks, self.max_model_len, copy=False),  # (the batch is this call's own)
            workload=self.name,
            tool_names=self._module.TOOLS,
            prompts=prompts,
            prompt_tokens=ptoks,
            samples=np.tile(np.arange(self.samples_per_prompt), self.num_prompts),
        )


def generate(
    name: str,
    *,
    num_steps: int,
    seed: int,
    num_prompts: int = 64,
    samples_per_prompt: int = 16,
    start_step: int = 0,
    **kw,
) -> list[Trajectory]:
    """Trajectories of steps `start_step .. start_step + num_steps - 1`, in step order."""
    num_steps = _positive_int("num_steps", num_steps)
    if not (checks.is_whole(start_step) and start_step >= 0):
        raise SpecError(f"start_step must be a non-negative integer, got {start_step!r}")
    gen = WorkloadGenerator(name, seed=seed, num_prompts=num_prompts, samples_per_prompt=samples_per_prompt, **kw)
    total = num_steps * num_prompts * samples_per_prompt
    if total > MAX_GENERATED:  # (all of them are held in one list: checked before the first step is made)
        raise SpecError(
            f"num_steps x num_prompts x samples_per_prompt must be at most {MAX_GENERATED:,} trajectories, "
            f"got {num_steps:,} x {num_prompts:,} x {samples_per_prompt:,}"
        )
    gen._check_step(start_step + num_steps - 1)  # (the last step too: not found after the others are made)
    out: list[Trajectory] = []
    for s in range(start_step, start_step + num_steps):
        out.extend(gen.step(s))
    return out
