"""Values that cross the adapter protocols (frozen attrs): instance specs, sampling, stream events, weights."""

from __future__ import annotations

from enum import StrEnum

import attrs


@attrs.frozen(kw_only=True)
class InstanceSpec:
    """One rollout instance: `tp` is its tensor-parallel degree in the plan; `max_num_seqs` and `max_model_len`
    bound its batch and context (on CPU, where every instance runs with TP 1, they are what makes one "larger")."""

    name: str
    tp: int = 1
    max_num_seqs: int = 8
    max_model_len: int = 512

    def __attrs_post_init__(self) -> None:
        if self.tp < 1 or self.max_num_seqs < 1 or self.max_model_len < 2:
            raise ValueError(
                f"InstanceSpec {self.name!r}: tp({self.tp}) and max_num_seqs({self.max_num_seqs}) must be >= 1, "
                f"max_model_len({self.max_model_len}) >= 2"
            )


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
        if self.max_tokens < 1:
            raise ValueError(f"Sampling.max_tokens must be >= 1, got {self.max_tokens}")


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
        if not self.buckets:
            raise ValueError(f"WeightUpdate v{self.version} has no buckets")


def pack_weights(named_tensors, *, version: int, bucket_bytes: int = 64 << 20) -> WeightUpdate:
    """Pack `(name, tensor)` pairs into safetensors buckets of about `bucket_bytes` each (a tensor never splits)."""
    from safetensors.torch import save

    buckets: list[bytes] = []
    current: dict = {}
    size = 0
    for name, tensor in named_tensors:
        t = tensor.detach().contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(save(current))
            current, size = {}, 0
        current[name] = t
        size += nbytes
    if current:
        buckets.append(save(current))
    return WeightUpdate(version=version, buckets=tuple(buckets))
