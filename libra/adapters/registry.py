"""Backends by name. Entries are import paths, resolved lazily, so that `import libra.adapters` needs no engine."""

from __future__ import annotations

import importlib
from typing import Any

from libra.adapters.errors import BackendUnavailable, UnknownBackend

ROLLOUT_BACKENDS: dict[str, str] = {"vllm": "libra.adapters.vllm_backend:VLLMRolloutBackend"}
TRAINER_BACKENDS: dict[str, str] = {
    "torch-ddp": "libra.adapters.torch_ddp:TorchDDPTrainer",
    "deepspeed": "libra.adapters.deepspeed_trainer:DeepSpeedTrainer",
    "megatron": "libra.adapters.megatron_trainer:MegatronTrainer",
}


def register_backend(kind: str, name: str, target: str) -> None:
    """Register `target` ("module:Class") as backend `name` of `kind` ("rollout" or "trainer")."""
    table = _table(kind)
    module_name, _, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backend name is a non-empty string, got {name!r}")
    if not module_name or not attr:
        raise ValueError(f"{kind} backend {name!r}: target must be 'module:Class', got {target!r}")
    if name in table and table[name] != target:
        raise ValueError(f"{kind} backend {name!r} is already registered as {table[name]!r}")
    table[name] = target


def backend_names(kind: str) -> tuple[str, ...]:
    return tuple(sorted(_table(kind)))


def get_backend(kind: str, name: str) -> Any:
    """The class registered as `name`. Unknown names raise `UnknownBackend` (listing the known ones); a backend
    whose engine is not installed raises `BackendUnavailable` with the pip extra to install."""
    table = _table(kind)
    if not isinstance(name, str) or name not in table:
        raise UnknownBackend(f"unknown {kind} backend {name!r}; registered: {', '.join(sorted(table))}")
    module_name, _, attr = table[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(
            f"{kind} backend {name!r} needs a package that is not installed ({exc.name}); "
            f"install the matching extra, e.g. pip install 'libra[{name.split('-')[0]}]'"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UnknownBackend(
            f"{kind} backend {name!r} is registered as {table[name]!r}, but {module_name} has no {attr!r}"
        ) from None


def make_backend(kind: str, name: str, **options: Any) -> Any:
    """Construct backend `name` of `kind` with keyword `options`."""
    return get_backend(kind, name)(**options)


def _table(kind: str) -> dict[str, str]:
    if kind == "rollout":
        return ROLLOUT_BACKENDS
    if kind == "trainer":
        return TRAINER_BACKENDS
    raise UnknownBackend(f"unknown backend kind {kind!r}; expected 'rollout' or 'trainer'")
