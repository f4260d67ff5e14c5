"""Values that cross the adapter protocols (frozen attrs): instance specs, sampling, stream events, weights."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import attrs


def _whole(label: str, value: Any, minimum: int) -> None:
    """A whole number (anything with `__index__` but a bool: numpy integers pass) of at least `minimum`."""
    try:
        ok = not isinstance(value, bool) and operator.index(value) >= minimum
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{label} must be a whole number >= {minimum}, got {value!r}")


@attrs.frozen(kw_only=True)
class InstanceSpec:
    """One rollout instance: `tp` is its tensor-parallel degree in the plan; `max_num_seqs` and `max_model_len`
    bound its batch and context (on CPU, where every instance runs with TP 1, they are what makes one "larger")."""

    name: str
    tp: int = 1
    max_num_seqs: int = 8
    max_model_len: int = 512

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"InstanceSpec.name must be a non-empty string, got {self.name!r}")
        for field, minimum in (("tp", 1), ("max_num_seqs", 1), ("max_model_len", 2)):
            _whole(f"InstanceSpec {self.name!r}: {field}", getattr(self, field), minimum)


@attrs.frozen(kw_only=True)
class Sampling:
    """Sampling settings of one generation turn. `temperature == 0` is greedy. A turn stops at `max_tokens`, at
    end of sequence (unless `ignore_eos`) or at any of `stop_token_ids` (e.g. the token that opens a tool call)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __attrs_post_init__(self) -> None:
        _whole("Sampling.max_tokens", self.max_tokens, 1)
        if not _real(self.temperature) or self.temperature < 0:
            raise ValueError(f"Sampling.temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling.top_p must be a number in (0, 1], got {self.top_p!r}")


def _real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


class EventKind(StrEnum):
    """What happened to a request in one `poll()`: new TOKENS, the turn FINISHED (stop/length), it was
    REQUEUED onto another instance after its engine died, or it FAILED (see `error`)."""

    TOKENS = "tokens"
    FINISHED = "finished"
    REQUEUED = "requeued"
    FAILED = "failed"


@attrs.frozen(kw_only=True)
class StreamEvent:
    """One event of one request. `new_token_ids` are the tokens generated since the previous event;
    `finish_reason` is vLLM's ("stop", "length", ...) for FINISHED; `weight_version` is the policy version that
    the instance held when it produced them."""

    request_id: str
    instance: str
    kind: EventKind
    new_token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    weight_version: int = -1
    error: str | None = None


@attrs.frozen(kw_only=True)
class Migration:
    """A request moved from one instance to another. `migrated_tokens` is the context the target re-prefilled
    (this adapter re-prefills: vLLM has no public KV export across engines); `running` says whether it moved
    mid-generation (aborted on the source) or between turns (at a tool call)."""

    request_id: str
    from_instance: str
    to_instance: str
    migrated_tokens: int
    running: bool


@attrs.frozen(kw_only=True)
class WeightUpdate:
    """New policy weights, version `version`, as one or more buckets; each bucket is a safetensors blob of some
    of the parameters (names as in the Hugging Face checkpoint). Bucketing bounds the memory of one transfer."""

    version: int
    buckets: tuple[bytes, ...]

    def __attrs_post_init__(self) -> None:
        _whole("WeightUpdate.version", self.version, 0)
        if isinstance(self.buckets, bytes | str) or not self.buckets:
            raise ValueError(
                f"WeightUpdate v{self.version} needs a non-empty tuple of buckets, got {self.buckets!r:.80}"
            )
        for i, blob in enumerate(self.buckets):
            if not isinstance(blob, bytes):  # a tensor or a dict here fails only inside the engine's worker
                raise ValueError(
                    f"WeightUpdate v{self.version} bucket {i} is a {type(blob).__name__}, not safetensors bytes "
                    "(pack_weights makes them)"
                )


def pack_weights(named_tensors, *, version: int, bucket_bytes: int = 64 << 20) -> WeightUpdate:
    """Pack `(name, tensor)` pairs into safetensors buckets of about `bucket_bytes` each (a tensor never splits).
    Tied parameters (one tensor under two names, as a tied embedding and lm_head) are packed under both names."""
    from safetensors.torch import save

    buckets: list[bytes] = []
    current: dict = {}
    storages: set[int] = set()  # of the tensors in `current`
    size = 0
    for name, tensor in named_tensors:
        t = tensor.detach().contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(save(current))
            current, size, storages = {}, 0, set()
        storage = t.untyped_storage().data_ptr()
        if storage in storages:  # tied weights (embedding = lm_head): safetensors refuses shared memory in one blob
            t = t.clone()
            storage = t.untyped_storage().data_ptr()
        storages.add(storage)
        current[name] = t
        size += nbytes
    if current:
        buckets.append(save(current))
    return WeightUpdate(version=version, buckets=tuple(buckets))


def check_snapshot(module_state: Mapping[str, Any], snapshot: Any, *, what: str) -> None:
    """Raise `StateMismatch` (one line, the first differing parameter) unless `snapshot` is a trainer snapshot
    (`version`, `model`, `optimizer`) whose model state has exactly `module_state`'s names and shapes."""
    from libra.adapters.errors import StateMismatch

    if not isinstance(snapshot, Mapping) or not {"version", "model", "optimizer"} <= set(snapshot):
        keys = sorted(snapshot) if isinstance(snapshot, Mapping) else type(snapshot).__name__
        raise StateMismatch(f"{what}: a snapshot has the keys version, model and optimizer; got {keys}")
    model = snapshot["model"]
    missing, extra = sorted(set(module_state) - set(model)), sorted(set(model) - set(module_state))
    if missing or extra:
        raise StateMismatch(f"{what}: snapshot lacks {missing[:3]} and has unknown {extra[:3]} parameters")
    for name, mine in module_state.items():
        theirs = model[name]
        if hasattr(mine, "shape") and tuple(getattr(theirs, "shape", ())) != tuple(mine.shape):
            raise StateMismatch(
                f"{what}: parameter {name!r} has shape {tuple(getattr(theirs, 'shape', ()))} in the snapshot, "
                f"{tuple(mine.shape)} in the model"
            )
