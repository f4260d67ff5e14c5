"""Runs inside vLLM's worker processes (passed as `worker_extension_cls`): weight loading for RL.

vLLM mixes this class into its worker; `collective_rpc("libra_load_weights", ...)` then calls it on every worker
(every TP rank). Each rank receives the full tensors of a bucket and lets the model's own `load_weights` shard them
(through vLLM's in-place `reload_weights`, which also redoes any post-load repacking, e.g. CPU GEMM layouts).
"""

from __future__ import annotations


class LibraWorkerExtension:
    def libra_load_weights(self, blob: bytes, version: int) -> int:
        """Load one safetensors bucket into the served model; returns the number of tensors loaded."""
        from safetensors.torch import load

        named = load(blob)
        self.model_runner.reload_weights(weights_iterator=iter(named.items()))  # type: ignore[attr-defined]
        return len(named)

    def libra_param_checksum(self, name: str) -> float:
        """Sum of one served parameter (float64), to check that an update arrived (diagnostics and tests)."""
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        return float(params[name].detach().double().sum())
