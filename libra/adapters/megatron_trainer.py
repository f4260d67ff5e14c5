"""Megatron-core trainer: a plan's `TrainConfig` -> `parallel_state`, `GPTModel`, Megatron DDP + (distributed)
optimizer, and the side-channel gradient hook.

- `parallel_sizes(train)` maps TP/PP/DP/EP to `parallel_state.initialize_model_parallel` (DP is implied: world
  size = tp * pp * dp; EP re-uses DP x TP ranks of the expert layers, as `TrainConfig` states).
- `MegatronTrainer.train_step(batch, grad_hook=...)`: backward under Megatron DDP's `no_sync()` leaves this
  replica's gradients in the contiguous grad buffers (`param.main_grad`); the hook (the side channel, per pipeline
  stage) makes them the mean over every contributing replica, identical on all DP ranks; `finish_grad_sync()` then
  runs Megatron's own DP reduction over identical values (the mean of equal tensors: unchanged up to rounding) and,
  with the distributed optimizer, leaves each rank its shard; `optimizer.step()` updates.
- Megatron's forward, its DDP and RNG tracker call `torch.cuda`: this module runs on GPUs. On a CPU-only torch the
  configuration, process groups (gloo) and model build run; the tests add a CPU device shim of their own
  (tests/adapters/megatron_shim.py, test-only). `examples/gpu_check_megatron.py` runs the whole step on a GPU.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping
from typing import Any

from libra.adapters.errors import UnsupportedConfig
from libra.adapters.protocols import GradHook, run_grad_hook
from libra.adapters.types import WeightUpdate, check_snapshot, pack_weights
from libra.spec.plan import TrainConfig


def parallel_sizes(train: TrainConfig) -> dict[str, int]:
    """Keyword arguments of `parallel_state.initialize_model_parallel` for `train`."""
    return {
        "tensor_model_parallel_size": train.tp,
        "pipeline_model_parallel_size": train.pp,
        "expert_model_parallel_size": train.ep,
    }


def init_parallel(train: TrainConfig) -> None:
    """Create Megatron's process groups for `train` on the already initialised default group (any backend); groups
    that exist already must have `train`'s layout (`parallel_state.destroy_model_parallel()` first to change it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        raise UnsupportedConfig("torch.distributed must be initialised before init_parallel (world = tp*pp*dp)")
    world = dist.get_world_size()
    if world != train.num_gpus:
        raise UnsupportedConfig(
            f"world size {world} != TrainConfig num_gpus {train.num_gpus} "
            f"(tp({train.tp}) * pp({train.pp}) * dp({train.dp}))"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(**parallel_sizes(train))
        return
    have = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
        parallel_state.get_data_parallel_world_size(),
        parallel_state.get_expert_model_parallel_world_size(),
    )
    if have != (train.tp, train.pp, train.dp, train.ep):  # the groups would silently keep the old layout
        raise UnsupportedConfig(
            "Megatron's process groups exist for tp({}) * pp({}) * dp({}) (ep {}); ".format(*have)
            + f"TrainConfig asks for tp({train.tp}) * pp({train.pp}) * dp({train.dp}) (ep {train.ep}) on the "
            "same ranks"
        )


def gpt_config(
    train: TrainConfig,
    *,
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    ffn_hidden_size: int | None = None,
    num_moe_experts: int | None = None,
    cpu_init: bool = False,
) -> Any:
    """A fp32 `TransformerConfig` with the plan's parallel sizes."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    if num_layers % train.pp:
        raise UnsupportedConfig(f"pp({train.pp}) must divide num_layers({num_layers})")
    if num_attention_heads % train.tp:
        raise UnsupportedConfig(f"tp({train.tp}) must divide num_attention_heads({num_attention_heads})")
    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        ffn_hidden_size=ffn_hidden_size or 4 * hidden_size,
        num_moe_experts=num_moe_experts,
        tensor_model_parallel_size=train.tp,
        pipeline_model_parallel_size=train.pp,
        expert_model_parallel_size=train.ep,
        params_dtype=torch.float32,
        use_cpu_initialization=cpu_init,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def build_gpt(config: Any, *, vocab_size: int, max_sequence_length: int) -> Any:
    """This rank's `GPTModel` (its pipeline stage and tensor shard) with the local (non-Transformer-Engine) spec."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(num_experts=config.num_moe_experts),
        vocab_size=vocab_size,
        max_sequence_length=max_sequence_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )


def lm_loss(model: Any, batch: Mapping[str, Any]) -> Any:
    """Mean next-token cross entropy of `batch["tokens"]` ([b, s]); Megatron's GPTModel returns per-token losses."""
    import torch

    tokens = batch["tokens"]
    b, s = tokens.shape
    positions = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
    causal = torch.triu(torch.ones(s, s, device=tokens.device), diagonal=1).bool()[None, None]  # True = masked
    losses = model(tokens, positions, causal, labels=batch["labels"])
    return losses.float().mean()


class MegatronTrainer:
    """`TrainerBackend` over Megatron-core for one pipeline stage of one TP group (single pipeline stage only:
    `train_step` runs forward/backward directly; a PP > 1 step needs Megatron's pipeline schedules).
    `snapshot`/`restore` use the optimizer's plain `state_dict`; with the distributed optimizer a whole-replica
    snapshot needs Megatron's sharded state dict (`sharded_state_dict` + dist checkpointing), not done here."""

    def __init__(
        self,
        *,
        train: TrainConfig,
        config: Any,
        vocab_size: int,
        max_sequence_length: int,
        lr: float,
        use_distributed_optimizer: bool = True,
        with_optimizer: bool = True,
        loss_fn: Callable | None = None,
        seed: int = 0,
    ) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if train.pp != 1:
            raise UnsupportedConfig(f"MegatronTrainer.train_step runs one pipeline stage; got pp({train.pp})")
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        init_parallel(train)
        model_parallel_cuda_manual_seed(seed)  # Megatron's TP RNG tracker (dropout, init) needs its seeds first
        self.train, self.config = train, config
        self.module = build_gpt(config, vocab_size=vocab_size, max_sequence_length=max_sequence_length)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=use_distributed_optimizer
        )
        self.model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=self.module)
        # Megatron's optimizers allocate on device="cuda": `with_optimizer=False` stops after the gradient sync
        # (CPU tests of the gradient path); a real run keeps it on.
        self.optimizer = (
            get_megatron_optimizer(
                OptimizerConfig(
                    optimizer="adam",
                    lr=lr,
                    weight_decay=0.0,
                    params_dtype=config.params_dtype,
                    clip_grad=0.0,
                    use_distributed_optimizer=use_distributed_optimizer,
                ),
                [self.model],
            )
            if with_optimizer
            else None
        )
        self.loss_fn = loss_fn or lm_loss
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def train_step(
        self, batch: Mapping[str, Any], *, grad_hook: GradHook | None = None, step: int | None = None
    ) -> float:
        self.model.zero_grad_buffer()
        if self.optimizer is not None:
            self.optimizer.zero_grad()
        with self.model.no_sync() if grad_hook is not None else contextlib.nullcontext():
            loss = self.loss_fn(self.model, batch)
            loss.backward()
        if grad_hook is not None:
            run_grad_hook(grad_hook, self._version if step is None else step, self.local_grads())
        self.model.finish_grad_sync()
        if self.optimizer is not None:
            self.optimizer.step()
        self._version += 1
        return float(loss.detach())

    def local_grads(self) -> list[Any]:
        """The grad-buffer views (`main_grad`) of this rank's trainable parameters, in side-channel order."""
        return [p.main_grad for p in self.module.parameters() if p.requires_grad]

    def snapshot(self) -> Mapping[str, Any]:
        if self.optimizer is None:
            raise UnsupportedConfig("snapshot needs the optimizer (with_optimizer=True)")
        return {
            "version": self._version,
            "model": copy.deepcopy(self.module.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        if self.optimizer is None:
            raise UnsupportedConfig("restore needs the optimizer (with_optimizer=True)")
        check_snapshot(self.module.state_dict(), state, what="MegatronTrainer.restore")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._version = int(state["version"])

    def export_weights(self, *, bucket_bytes: int = 64 << 20) -> WeightUpdate:
        """This rank's shard in Megatron names; converting to Hugging Face names (and gathering TP shards) is the
        job of a model-specific converter such as Megatron-Bridge, which this adapter does not ship."""
        named = [(n, t) for n, t in self.module.state_dict().items() if hasattr(t, "detach")]
        return pack_weights(named, version=self._version, bucket_bytes=bucket_bytes)
