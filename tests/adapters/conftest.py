"""Fixtures of the adapter tests: one tiny random model per session, shared vLLM engines per module."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from libra.adapters.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "model"))
