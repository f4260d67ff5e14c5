"""Fixtures of the adapter tests: one tiny random model per session, shared vLLM engines per module."""

from __future__ import annotations

import os

import pytest

from libra.adapters.types import InstanceSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from libra.adapters.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "model"))


@pytest.fixture(scope="session")
def vllm_backend(tiny_model_dir):
    """Two vLLM instances shared by every vLLM test (each engine start costs 15-30 s on CPU): `small` (plan TP 1,
    2 sequences) and `large` (plan TP 2, 8 sequences, longer context); on CPU both run with TP 1. Tests leave them
    as they found them (weights, sleep state, failover policy)."""
    pytest.importorskip("vllm")
    from libra.adapters.vllm_backend import VLLMRolloutBackend

    b = VLLMRolloutBackend(model=tiny_model_dir, engine_tp="one", sleep_mode="pause")
    b.start_instance(InstanceSpec(name="small", tp=1, max_num_seqs=2, max_model_len=256))
    b.start_instance(InstanceSpec(name="large", tp=2, max_num_seqs=8, max_model_len=512))
    yield b
    b.shutdown()
