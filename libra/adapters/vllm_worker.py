"""Runs inside vLLM's worker processes (passed as `worker_extension_cls`): weight loading for RL.

vLLM mixes this class into its worker; `collective_rpc(...)` then calls it on every worker (every TP rank). A
weight update arrives as safetensors buckets (`libra_stage_weights`, one call per bucket, kept in host memory) and
is applied at once by `libra_commit_weights`: vLLM's in-place `reload_weights` processes a layer only when all of
its checkpoint tensors (e.g. q, k and v of a fused qkv projection) come in the same reload, so the buckets of one
version are loaded together. The model's own `load_weights` shards full tensors for this rank, and the reload
redoes any post-load repacking (e.g. CPU GEMM layouts).
"""

from __future__ import annotations

from typing import Any


class LibraWorkerExtension:
    _libra_staged: list[Any]

    def libra_stage_weights(self, blob: bytes, version: int) -> int:
        """Keep one safetensors bucket of version `version`; returns the number of tensors staged so far."""
        from safetensors.torch import load

        staged = getattr(self, "_libra_staged", None)
        if staged is None or getattr(self, "_libra_staged_version", None) != version:
            staged = self._libra_staged = []
            self._libra_staged_version = version
        staged.extend(load(blob).items())
        return len(staged)

    def libra_commit_weights(self, version: int) -> int:
        """Load every staged tensor of `version` into the served model; returns how many were loaded."""
        staged = getattr(self, "_libra_staged", None) or []
        if getattr(self, "_libra_staged_version", None) != version:
            raise RuntimeError(
                f"commit of weight version {version} but version "
                f"{getattr(self, '_libra_staged_version', None)} is staged"
            )
        self.model_runner.reload_weights(weights_iterator=iter(staged))  # type: ignore[attr-defined]
        self._libra_staged = []
        return len(staged)

    def libra_param_checksum(self, name: str) -> float:
        """Sum of one served parameter (float64), to check that an update arrived (diagnostics and tests)."""
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        return float(params[name].detach().double().sum())
