"""The reference trainer: plain `torch.nn.parallel.DistributedDataParallel` over a process group (gloo on CPU).

One process per replica. `train_step` runs the loss on this replica's shard, then either lets DDP all-reduce the
gradients (mean over the group) or, with a `grad_hook`, runs backward under `no_sync()` and hands the local
gradients to the hook (the side channel's `CoreExchange.reduce`, which adds hybrid contributions and divides by
the number of replicas that contributed), then steps the optimizer. The model's `state_dict` names are exported as
weights, so a Hugging Face model trained here loads straight into vLLM.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from libra.adapters.protocols import GradHook, run_grad_hook
from libra.adapters.types import WeightUpdate, check_snapshot, pack_weights

LossFn = Callable[[Any, Mapping[str, Any]], Any]


class TorchDDPTrainer:
    """`TrainerBackend` over DDP. `model` is the replica's module (identical initial weights on every rank),
    `optimizer_factory(params)` builds its optimizer (default Adam, lr 1e-3), `loss_fn(model, batch)` returns a
    scalar loss (default: the GRPO loss of `libra.adapters.grpo`). `process_group` None means the default group;
    `distributed=False` trains a single replica without any process group (a hybrid replica, or tests)."""

    def __init__(
        self,
        *,
        model: Any,
        loss_fn: LossFn | None = None,
        optimizer_factory: Callable | None = None,
        process_group: Any = None,
        distributed: bool = True,
    ) -> None:
        import torch

        from libra.adapters.grpo import policy_loss

        self.module = model
        self.loss_fn = loss_fn or policy_loss
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = (optimizer_factory or (lambda ps: torch.optim.Adam(ps, lr=1e-3)))(params)
        self._group = process_group
        if distributed:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(model, process_group=process_group)
        else:
            self.model = model
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def train_step(
        self, batch: Mapping[str, Any], *, grad_hook: GradHook | None = None, step: int | None = None
    ) -> float:
        import contextlib

        self.optimizer.zero_grad(set_to_none=False)
        sync_off = grad_hook is not None and hasattr(self.model, "no_sync")
        with self.model.no_sync() if sync_off else contextlib.nullcontext():
            loss = self.loss_fn(self.model, batch)
            loss.backward()
        if grad_hook is not None:
            run_grad_hook(grad_hook, self._version if step is None else step, self.local_grads())
        self.optimizer.step()
        self._version += 1
        return float(loss.detach())

    def local_grads(self) -> list[Any]:
        """This replica's gradients in side-channel order (zeros where a parameter got none)."""
        import torch

        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return [p.grad for p in params]

    def snapshot(self) -> Mapping[str, Any]:
        return {
            "version": self._version,
            "model": copy.deepcopy(self.module.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        check_snapshot(self.module.state_dict(), state, what="TorchDDPTrainer.restore")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._version = int(state["version"])

    def export_weights(self, *, bucket_bytes: int = 64 << 20) -> WeightUpdate:
        return pack_weights(self.module.state_dict().items(), version=self._version, bucket_bytes=bucket_bytes)
