"""Protocols, registry, values and GRPO helpers (no engine started)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from libra.adapters import (
    BackendUnavailable,
    RolloutBackend,
    TrainerBackend,
    UnknownBackend,
    backend_names,
    get_backend,
    register_backend,
)
from libra.adapters.grpo import group_advantages


def test_import_needs_no_engine():
    code = (
        "import sys, libra.adapters, libra.adapters.routing, libra.adapters.ray_launcher; "
        "print(sorted(m for m in ('torch', 'vllm', 'ray', 'deepspeed', 'megatron') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registry_names_and_errors():
    assert backend_names("rollout") == ("vllm",)
    assert backend_names("trainer") == ("deepspeed", "megatron", "torch-ddp")
    with pytest.raises(UnknownBackend, match=r"unknown rollout backend 'sglang'; registered: vllm"):
        get_backend("rollout", "sglang")
    with pytest.raises(UnknownBackend, match="expected 'rollout' or 'trainer'"):
        get_backend("critic", "vllm")
    register_backend("trainer", "missing-engine", "libra_no_such_module:Trainer")
    with pytest.raises(BackendUnavailable, match="libra_no_such_module"):
        get_backend("trainer", "missing-engine")
    with pytest.raises(ValueError, match="already registered"):
        register_backend("trainer", "missing-engine", "elsewhere:Trainer")
    from libra.adapters.registry import TRAINER_BACKENDS

    del TRAINER_BACKENDS["missing-engine"]


def test_registered_classes_satisfy_the_protocols():
    pytest.importorskip("torch")
    from libra.adapters.torch_ddp import TorchDDPTrainer

    assert get_backend("trainer", "torch-ddp") is TorchDDPTrainer
    trainer = TorchDDPTrainer(model=__import__("torch").nn.Linear(2, 2), distributed=False)
    assert isinstance(trainer, TrainerBackend)
    pytest.importorskip("vllm")
    assert issubclass(get_backend("rollout", "vllm"), RolloutBackend)


def test_pack_weights_splits_buckets_without_splitting_tensors():
    torch = pytest.importorskip("torch")
    from safetensors.torch import load

    from libra.adapters.types import pack_weights

    named = [(f"w{i}", torch.full((256,), float(i))) for i in range(5)]  # 1 KiB each
    update = pack_weights(named, version=3, bucket_bytes=2048)
    assert update.version == 3 and len(update.buckets) == 3
    merged = {k: v for blob in update.buckets for k, v in load(blob).items()}
    assert sorted(merged) == [n for n, _ in named]
    assert all(torch.equal(merged[n], t) for n, t in named)


def test_group_advantages_are_relative_within_each_group():
    adv = group_advantages([1.0, 0.0, 2.0, 2.0], 2)
    assert adv[0] == pytest.approx(1.0, abs=1e-4) and adv[1] == pytest.approx(-1.0, abs=1e-4)
    assert adv[2:] == [0.0, 0.0]
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        group_advantages([1.0, 2.0], 3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool": "bash", "status": "failed"}, r"^ToolReturn.status must be one of ok, error, timeout, got 'failed'$"),
        ({"tool": "bash", "status": None}, r"^ToolReturn.status must be one of ok, error, timeout, got None$"),
        ({"tool": "", "status": "ok"}, r"^ToolReturn.tool must be a non-empty string, got ''$"),
    ],
)
def test_a_tool_return_outside_the_trace_schema_is_refused_where_the_tool_builds_it(fields, message) -> None:
    """Before, the rollout loop met it when it recorded the turn, with the other requests still generating."""
    from libra.adapters.routing import ToolReturn
    from libra.spec import SpecError

    with pytest.raises(SpecError, match=message):
        ToolReturn(output_token_ids=(1, 2), **fields)
    assert ToolReturn(tool="bash", status="timeout", output_token_ids=()).status == "timeout"
