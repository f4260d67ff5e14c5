"""What a colocated pipeline pays to switch its GPUs between rollout and training, as verl's hybrid engine runs it.

Three terms, each from its own coefficient or hardware figure (docs/cost-model.md, "Colocated switches"):

- **sleep / wake** of the inference engine, a fixed cost per switch (`CostCoefficients.colocated_switch_s`:
  vllm-project/vime#442 measures `Actor.sleep()` + `wake_up()` at 11.27 s per step for Qwen3-0.6B, where moving
  the weights is negligible, so it is the fixed part);
- **offload / reload** over the host link (PCIe, `GPUSpec.host_bandwidth_gbs` at `link_efficiency`) at every
  switch: the engine's weight shard (vLLM's sleep level 1 keeps the weights in CPU memory and brings them back on
  wake) and, when the trainer offloads too, its state sharded over the training GPUs
  (`colocated_offload_bytes_per_param`: 0 as in verl's default FSDP config, 16 with parameter and optimizer
  offload on);
- **weight reshard** once per step, on the way into rollout: every rollout GPU gathers the new weights from the
  training layout over NVLink (`nvlink_bandwidth_gbs` at `link_efficiency`); the SGLang RL team reports under 0.5 s
  for a 7B model on H200 through CUDA IPC (hebiao064.github.io, "Efficient RL Training - Optimizing Memory Usage in
  veRL", 2025-06-18), which this bounds from below (0.05 s for 7B on H200).
"""

from __future__ import annotations

import attrs

from libra.planning.cost.coefficients import CostCoefficients
from libra.spec import GPUSpec, ModelSpec


@attrs.frozen(kw_only=True)
class ColocatedSwitch:
    """Seconds per switch (`sleep_wake_s`, `offload_s`) and per step (`reshard_s`, into rollout only)."""

    sleep_wake_s: float
    offload_s: float
    reshard_s: float

    @property
    def to_rollout_s(self) -> float:
        return self.sleep_wake_s + self.offload_s + self.reshard_s

    @property
    def to_training_s(self) -> float:
        return self.sleep_wake_s + self.offload_s

    @property
    def per_step_s(self) -> float:
        return self.to_rollout_s + self.to_training_s

    @classmethod
    def fixed(cls, seconds: float) -> ColocatedSwitch:
        """A flat cost per switch (what `ReconfigCosts.colocated_switch_s` sets), nothing per byte."""
        return cls(sleep_wake_s=seconds, offload_s=0.0, reshard_s=0.0)

    def to_dict(self) -> dict[str, float]:
        return {
            "sleep_wake_s": self.sleep_wake_s,
            "offload_s": self.offload_s,
            "reshard_s": self.reshard_s,
            "per_step_s": self.per_step_s,
        }


def colocated_switch(
    coeffs: CostCoefficients, model: ModelSpec, gpu: GPUSpec, *, rollout_tp: int, train_gpus: int
) -> ColocatedSwitch:
    """The switch costs of a colocated pipeline whose engines run at `rollout_tp` and whose trainer shards its state
    over `train_gpus` GPUs."""
    if rollout_tp < 1 or train_gpus < 1:
        raise ValueError(f"rollout_tp and train_gpus must be >= 1, got {rollout_tp} and {train_gpus}")
    host = gpu.host_bandwidth_gbs * 1e9 * coeffs.link_efficiency
    nvlink = gpu.nvlink_bandwidth_gbs * 1e9 * coeffs.link_efficiency
    engine_bytes = model.weight_bytes / rollout_tp
    trainer_bytes = model.num_params * coeffs.colocated_offload_bytes_per_param / train_gpus
    return ColocatedSwitch(
        sleep_wake_s=coeffs.colocated_switch_s,
        offload_s=(engine_bytes + trainer_bytes) / host,
        reshard_s=model.weight_bytes / nvlink,
    )
