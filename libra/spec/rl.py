"""RL training settings that size one step."""

from __future__ import annotations

import attrs

from libra.spec.errors import SpecError


@attrs.frozen(kw_only=True)
class RLSettings:
    """One step generates `num_prompts * samples_per_prompt` trajectories and trains on all of them
    (the global batch, in sequences)."""

    num_prompts: int = 512
    samples_per_prompt: int = 16
    max_model_len: int = 40960

    def __attrs_post_init__(self) -> None:
        for name in ("num_prompts", "samples_per_prompt", "max_model_len"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise SpecError(f"RLSettings.{name} must be an integer >= 1, got {value!r}")

    @property
    def global_batch(self) -> int:
        return self.num_prompts * self.samples_per_prompt
