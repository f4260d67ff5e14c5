"""Model architecture: what the cost model needs to count FLOPs, bytes of weights and bytes of KV cache."""

from __future__ import annotations

import attrs

from libra.spec import checks
from libra.spec.errors import SpecError


def _whole(low: int, high: int):
    """Validator: an integer (not a bool) in [low, high]. The upper bounds keep every search over layers, heads and
    experts small; they are far above any published model."""

    def check(instance: object, attribute: attrs.Attribute, value: int) -> None:
        checks.whole(type(instance).__name__, attribute.name, value, low, high)

    return check


def _at_least_one(instance: object, attribute: attrs.Attribute, value: int) -> None:
    _whole(1, 10**9)(instance, attribute, value)


def _flag(instance: object, attribute: attrs.Attribute, value: bool) -> None:
    checks.flag(type(instance).__name__, attribute.name, value)


def _optional_width(instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None:
        _whole(1, 10**7)(instance, attribute, value)


def _name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    checks.text(type(instance).__name__, attribute.name, value)


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A decoder-only transformer. For MoE models every layer has `num_experts` experts of `moe_ffn_hidden_size`
    and each token uses `experts_per_token` of them; dense models have `num_experts == 1`."""

    name: str = attrs.field(validator=_name)
    num_layers: int = attrs.field(validator=_whole(1, 10_000))
    hidden_size: int = attrs.field(validator=_whole(1, 10**6))
    num_heads: int = attrs.field(validator=_whole(1, 10_000))
    num_kv_heads: int = attrs.field(validator=_whole(1, 10_000))
    head_dim: int = attrs.field(validator=_whole(1, 10_000))
    ffn_hidden_size: int = attrs.field(validator=_whole(1, 10**7))
    vocab_size: int = attrs.field(validator=_whole(1, 10**8))
    num_experts: int = attrs.field(default=1, validator=_whole(1, 4096))
    experts_per_token: int = attrs.field(default=1, validator=_whole(1, 4096))
    moe_ffn_hidden_size: int | None = attrs.field(default=None, validator=_optional_width)
    dtype_bytes: int = attrs.field(default=2, validator=_whole(1, 8))
    tie_embeddings: bool = attrs.field(default=False, validator=_flag)

    def __attrs_post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise SpecError(
                f"ModelSpec {self.name}: num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
            )
        if self.experts_per_token > self.num_experts:
            raise SpecError(
                f"ModelSpec {self.name}: experts_per_token ({self.experts_per_token}) "
                f"exceeds num_experts ({self.num_experts})"
            )
        if self.is_moe and self.moe_ffn_hidden_size is None:
            raise SpecError(f"ModelSpec {self.name}: an MoE model (num_experts > 1) needs moe_ffn_hidden_size")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    # --- parameter counts -------------------------------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        q_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_o + k_v

    @property
    def expert_params(self) -> int:
        """Parameters of one gated MLP (gate, up, down)."""
        width = self.moe_ffn_hidden_size if self.is_moe else self.ffn_hidden_size
        assert width is not None  # an MoE model without moe_ffn_hidden_size is refused in __attrs_post_init__
        return 3 * self.hidden_size * int(width)

    @property
    def ffn_params_per_layer(self) -> int:
        router = self.hidden_size * self.num_experts if self.is_moe else 0
        return self.num_experts * self.expert_params + router

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def num_params(self) -> int:
        return self.num_layers * (self.attention_params_per_layer + self.ffn_params_per_layer) + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters touched by one token (all of them for a dense model)."""
        ffn = self.experts_per_token * self.expert_params
        return self.num_layers * (self.attention_params_per_layer + ffn) + self.embedding_params

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV-cache bytes per token on one GPU of a TP-`tp` instance: 2 * layers * kv_heads/tp * head_dim * bytes.
        KV heads are replicated when tp exceeds them, so the per-GPU share never drops below one head."""
        heads_per_gpu = max(self.num_kv_heads / tp, 1.0)
        return 2 * self.num_layers * heads_per_gpu * self.head_dim * self.dtype_bytes


# Architecture numbers from the models' published config.json files.
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="Qwen3-4B",
            num_layers=36,
            hidden_size=2560,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            ffn_hidden_size=9728,
            vocab_size=151936,
            tie_embeddings=True,
        ),
        ModelSpec(
            name="Qwen3-14B",
            num_layers=40,
            hidden_size=5120,
            num_heads=40,
            num_kv_heads=8,
            head_dim=128,
            ffn_hidden_size=17408,
            vocab_size=151936,
        ),
        ModelSpec(
            name="Qwen3-30B-A3B",
            num_layers=48,
            hidden_size=2048,
            num_heads=32,
            num_kv_heads=4,
            head_dim=128,
            ffn_hidden_size=6144,
            vocab_size=151936,
            num_experts=128,
            experts_per_token=8,
            moe_ffn_hidden_size=768,
        ),
        ModelSpec(
            name="Qwen2.5-7B",
            num_layers=28,
            hidden_size=3584,
            num_heads=28,
            num_kv_heads=4,
            head_dim=128,
            ffn_hidden_size=18944,
            vocab_size=152064,
        ),
        ModelSpec(
            name="Llama-3-70B",
            num_layers=80,
            hidden_size=8192,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            ffn_hidden_size=28672,
            vocab_size=128256,
        ),
    )
}


def get_model(name: str) -> ModelSpec:
    """Look a model preset up by name (case-insensitive)."""
    for key, model in MODEL_PRESETS.items():
        if key.lower() == name.lower():
            return model
    raise SpecError(f"unknown model {name!r}; known: {', '.join(MODEL_PRESETS)} (or pass a YAML/JSON file)")
