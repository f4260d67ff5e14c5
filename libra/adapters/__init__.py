"""Adapters: carry Libra's decisions out on real engines.

Protocols (`RolloutBackend`, `TrainerBackend`), a registry by name, typed errors and plain values import with no
engine installed. Engine code lives in submodules that import their engine lazily and are loaded by name:

- `libra.adapters.vllm_backend`      — vLLM rollout instances (`VLLMRolloutBackend`), weights, sleep/wake, death
- `libra.adapters.routing`           — `RoutedRollout`: a router's `RouteDecision`s applied to a rollout backend
- `libra.adapters.torch_ddp`         — plain torch.distributed reference trainer
- `libra.adapters.deepspeed_trainer` — DeepSpeed (ZeRO) trainer with the side-channel gradient hook
- `libra.adapters.megatron_trainer`  — Megatron-core: plan -> parallel_state, GPTModel, DDP + distributed optimizer
- `libra.adapters.ray_launcher`      — Ray placement groups per pool, actors for instances and replicas
"""

from libra.adapters.errors import (
    AdapterError,
    BackendUnavailable,
    EngineDiedError,
    InstanceAsleep,
    InstanceNotFound,
    ReplicaDiedError,
    RequestFailedError,
    RequestNotFound,
    StateMismatch,
    UnknownBackend,
    UnsupportedConfig,
    WorkerNotFound,
)
from libra.adapters.protocols import GradHook, RolloutBackend, TrainerBackend
from libra.adapters.registry import backend_names, get_backend, make_backend, register_backend
from libra.adapters.types import EventKind, InstanceSpec, Migration, Sampling, StreamEvent, WeightUpdate

__all__ = [
    "AdapterError",
    "BackendUnavailable",
    "EngineDiedError",
    "EventKind",
    "GradHook",
    "InstanceAsleep",
    "InstanceNotFound",
    "InstanceSpec",
    "Migration",
    "ReplicaDiedError",
    "RequestFailedError",
    "RequestNotFound",
    "RolloutBackend",
    "Sampling",
    "StateMismatch",
    "StreamEvent",
    "TrainerBackend",
    "UnknownBackend",
    "UnsupportedConfig",
    "WeightUpdate",
    "WorkerNotFound",
    "backend_names",
    "get_backend",
    "make_backend",
    "register_backend",
]
