"""Test-only CPU device shim for Megatron-core on a CPU-only torch (never imported by libra).

Megatron's forward path, its DDP and its RNG tracker ask `torch.cuda` for the current device and RNG state. This
shim answers with the CPU device and the CPU generator, so that forward, backward, DDP and the optimizer run on
gloo. It changes nothing in libra; a real run needs a GPU (examples/gpu_check_megatron.py).
"""

from __future__ import annotations


def install() -> None:
    import torch

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.device_count = lambda: 0
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.is_available = lambda: False
    torch.cuda.random.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.random.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
