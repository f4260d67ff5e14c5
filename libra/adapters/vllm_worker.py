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
        self._libra_staged = []
        misfit = self._misshapen(staged)
        if misfit:  # refused before the reload: a reload that fails midway leaves layers on the meta device (dead)
            raise ValueError(f"weight version {version} does not fit the served model: {misfit}")
        try:
            self.model_runner.reload_weights(weights_iterator=iter(staged))  # type: ignore[attr-defined]
        except Exception as exc:  # vLLM's loaders assert without a message: say which tensor does not fit
            raise RuntimeError(
                f"weight version {version} does not fit the served model: {self._misfit(staged, exc)}"
            ) from exc
        return len(staged)

    def _misshapen(self, staged: list[Any]) -> str:
        """A staged tensor that cannot be the parameter the served model keeps under its name, on one rank (TP 1:
        the served parameter is whole, padded by vLLM to a multiple of 64 rows at most); "" if none is seen. Under
        TP > 1 nothing is checked here (shards), nor parameters vLLM repacked or fused under other names: vLLM's
        loaders are the check there."""
        from vllm.distributed import get_tensor_model_parallel_world_size

        if get_tensor_model_parallel_world_size() != 1:
            return ""
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        for name, tensor in staged:
            served = params.get(name)
            # a parameter vLLM repacked after loading (the CPU GEMMs keep an empty one) says nothing of its shape
            if served is None or served.numel() == 0 or served.dim() != tensor.dim():
                continue
            got, want = tuple(tensor.shape), tuple(served.shape)
            if any(g > w or w - g >= 64 for g, w in zip(got, want)):
                return f"{name} has shape {got}, the served model {want}"
        return ""

    def _misfit(self, staged: list[Any], exc: Exception) -> str:
        """What is wrong with `staged`: a tensor whose name the served model has with another shape (for the
        parameters vLLM keeps under their checkpoint name, such as embeddings, lm_head and norms), else the
        loader's own error."""
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        for name, tensor in staged:
            served = params.get(name)
            if served is not None and tuple(served.shape) != tuple(tensor.shape):
                return f"{name} has shape {tuple(tensor.shape)}, the served model {tuple(served.shape)} (this rank)"
        unknown = [name for name, _ in staged if name not in params]
        text = str(exc) if len(str(exc)) <= 200 else str(exc)[:200] + "..."
        detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        return f"{detail} (loading {len(staged)} tensors; not served under their own name: {unknown[:3]})"

    def libra_param_checksum(self, name: str) -> float:
        """Sum of one served parameter (float64), to check that an update arrived (diagnostics and tests)."""
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        return float(params[name].detach().double().sum())
