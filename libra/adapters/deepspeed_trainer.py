"""DeepSpeed trainer: a `TrainerBackend` over `deepspeed.initialize` (ZeRO stages 0-3; CPU + gloo in tests).

Gradient hook. DeepSpeed all-reduces gradients inside `engine.backward` (stages 0/1) or in backward hooks
(stages 2/3, which partition gradients). With a `grad_hook`, the backward of stages 0 and 1 runs under DeepSpeed's
public `engine.no_sync()`, so the gradients stay local; the hook (the side channel) turns them into the mean over
every contributing replica, identical on all core ranks; then stage 0 steps directly and stage 1 lets DeepSpeed run
its own reduction, which averages identical tensors (a no-op up to rounding) and fills its partitions. Stages 2 and
3 reduce during backward, before any hook could run: a hook there raises `UnsupportedConfig`.

Snapshot/restore carry the module's `state_dict` and the optimizer's; with ZeRO >= 1 the optimizer state is
partitioned across the core ranks, so a whole-replica snapshot is available only at stage 0 (use DeepSpeed's
universal checkpoint for the others). On CPU call `init_distributed()` (gloo) first.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from typing import Any

from libra.adapters.errors import UnsupportedConfig
from libra.adapters.protocols import GradHook, run_grad_hook
from libra.adapters.types import WeightUpdate, check_snapshot, pack_weights


def deepspeed_config(
    *, zero_stage: int, micro_batch: int, lr: float, dp: int, gradient_clipping: float = 0.0
) -> dict[str, Any]:
    """A DeepSpeed config for fp32 training with torch's Adam (no fused-op compile): `train_batch_size` is the
    global batch `micro_batch * dp` (one micro-batch per step, gradient accumulation 1)."""
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise UnsupportedConfig(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    for name, value in (("micro_batch", micro_batch), ("dp", dp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UnsupportedConfig(f"{name} must be a whole number >= 1, got {value!r}")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < float("inf"):
        raise UnsupportedConfig(f"lr must be a finite number > 0, got {lr!r}")
    if isinstance(gradient_clipping, bool) or not isinstance(gradient_clipping, int | float) or gradient_clipping < 0:
        raise UnsupportedConfig(f"gradient_clipping must be a number >= 0 (0: off), got {gradient_clipping!r}")
    return {
        "train_batch_size": micro_batch * dp,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": gradient_clipping,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "torch_adam": True, "adam_w_mode": False}},
        "zero_optimization": {"stage": zero_stage, "overlap_comm": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def get_accelerator_name() -> str:
    """DeepSpeed's accelerator name (`cpu`, `cuda`, ...)."""
    from deepspeed.accelerator import get_accelerator

    return str(get_accelerator().device_name())


def init_distributed(backend: str = "gloo") -> None:
    """`deepspeed.init_distributed(dist_backend=backend)` without DeepSpeed's shared-memory all-reduce op.

    That op serves only `inference_all_reduce` (DeepSpeed's CPU inference path), never a training collective, yet
    DeepSpeed JIT-compiles it in every process that initialises its communication on a CPU accelerator: minutes per
    new environment, with every other rank waiting on the builder's lock (a killed build leaves the lock behind and
    later runs wait forever). Training collectives go through torch.distributed either way."""
    os.environ.setdefault("DS_BUILD_OPS", "0")
    import deepspeed
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:  # None on accelerators without the op (CUDA): nothing to skip
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    deepspeed.init_distributed(dist_backend=backend, verbose=False)


def _zero_stage(config: Mapping[str, Any]) -> int:
    stage = config.get("zero_optimization", {}).get("stage", 0)
    try:
        value = None if isinstance(stage, bool | float) else int(stage)
    except (TypeError, ValueError):
        value = None
    if value not in (0, 1, 2, 3):
        raise UnsupportedConfig(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    return int(stage)


def _check_batch(config: Mapping[str, Any], world: int) -> None:
    """The data parallelism the config was written for must be the world it runs in (DeepSpeed only asserts it)."""
    total = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    if total is None or micro is None:
        return  # DeepSpeed derives the missing one from the world size
    if total != micro * accumulation * world:
        raise UnsupportedConfig(
            f"train_batch_size({total}) != train_micro_batch_size_per_gpu({micro}) * gradient_accumulation_steps"
            f"({accumulation}) * world size({world}): the config is for dp = {total // max(micro * accumulation, 1)}, "
            f"this process group has {world} ranks"
        )


class DeepSpeedTrainer:
    """One DeepSpeed engine over the default process group; `loss_fn(module, batch)` returns a scalar loss."""

    def __init__(self, *, model: Any, config: Mapping[str, Any], loss_fn: Callable | None = None) -> None:
        os.environ.setdefault("DS_BUILD_OPS", "0")
        import deepspeed
        import deepspeed.comm

        from libra.adapters.grpo import policy_loss

        if not deepspeed.comm.is_initialized():
            init_distributed("gloo" if get_accelerator_name() == "cpu" else "nccl")

        self.zero_stage = _zero_stage(config)
        _check_batch(config, deepspeed.comm.get_world_size())
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=dict(config)
        )
        self.loss_fn = loss_fn or policy_loss
        self._version = 0

    @property
    def module(self) -> Any:
        return self.engine.module

    @property
    def version(self) -> int:
        return self._version

    def train_step(
        self, batch: Mapping[str, Any], *, grad_hook: GradHook | None = None, step: int | None = None
    ) -> float:
        if grad_hook is None:
            loss = self.loss_fn(self.engine, batch)
            self.engine.backward(loss)
        else:
            if self.zero_stage >= 2:
                raise UnsupportedConfig(
                    f"a gradient hook needs ZeRO stage 0 or 1 (gradients reduced after backward); got stage "
                    f"{self.zero_stage}, which reduces inside backward"
                )
            with self.engine.no_sync():
                loss = self.loss_fn(self.engine, batch)
                self.engine.backward(loss)
            run_grad_hook(grad_hook, self._version if step is None else step, self.local_grads())
            if self.zero_stage == 1:
                self.engine.allreduce_gradients()
        self.engine.step()
        self._version += 1
        return float(loss.detach())

    def local_grads(self) -> list[Any]:
        import torch

        params = [p for p in self.engine.module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in params]

    def snapshot(self) -> Mapping[str, Any]:
        self._whole_replica_state("snapshot")
        return {
            "version": self._version,
            "model": copy.deepcopy(self.engine.module.state_dict()),
            "optimizer": copy.deepcopy(self.engine.optimizer.state_dict()),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self._whole_replica_state("restore")
        check_snapshot(self.engine.module.state_dict(), state, what="DeepSpeedTrainer.restore")
        self.engine.module.load_state_dict(state["model"])
        self.engine.optimizer.load_state_dict(state["optimizer"])
        self._version = int(state["version"])

    def export_weights(self, *, bucket_bytes: int = 64 << 20) -> WeightUpdate:
        if self.zero_stage == 3:
            import deepspeed

            params = list(self.engine.module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                named = [(n, p.detach().clone()) for n, p in self.engine.module.named_parameters()]
        else:
            named = list(self.engine.module.state_dict().items())
        return pack_weights(named, version=self._version, bucket_bytes=bucket_bytes)

    def _whole_replica_state(self, what: str) -> None:
        if self.zero_stage != 0:
            raise UnsupportedConfig(
                f"{what} of a whole replica needs ZeRO stage 0 (stage {self.zero_stage} partitions optimizer state "
                "over the core ranks; use DeepSpeed's universal checkpoint)"
            )
