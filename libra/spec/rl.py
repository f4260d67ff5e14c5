"""RL training settings that size one step."""

from __future__ import annotations

import attrs

from libra.spec import checks

MAX_TRAJECTORIES = 1 << 20  # prompts, and samples of a prompt, in one step (the CLI's bound on their product)
MAX_MODEL_LEN = 100_000_000  # tokens: ten times the trace loader's bound on one trajectory


@attrs.frozen(kw_only=True)
class RLSettings:
    """One step generates `num_prompts * samples_per_prompt` trajectories and trains on all of them
    (the global batch, in sequences)."""

    num_prompts: int = 512
    samples_per_prompt: int = 16
    max_model_len: int = 40960

    def __attrs_post_init__(self) -> None:
        checks.whole("RLSettings", "num_prompts", self.num_prompts, 1, MAX_TRAJECTORIES)
        checks.whole("RLSettings", "samples_per_prompt", self.samples_per_prompt, 1, MAX_TRAJECTORIES)
        checks.whole("RLSettings", "max_model_len", self.max_model_len, 1, MAX_MODEL_LEN)

    @property
    def global_batch(self) -> int:
        return self.num_prompts * self.samples_per_prompt
