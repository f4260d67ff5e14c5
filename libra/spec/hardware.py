"""GPU specifications and the built-in presets.

Bandwidths are in GB/s and FLOP/s in TFLOP/s (dense bf16). `nvlink_bandwidth_gbs` is the per-GPU, one-direction
bandwidth into the node's NVLink fabric; `network_bandwidth_gbs` is the per-GPU share of the inter-node network;
`host_bandwidth_gbs` is one direction of the GPU's host link (PCIe x16: 32 GB/s for Gen4 on A100/A800, 64 GB/s for
Gen5 on H100/H200, NVIDIA's datasheets), which the colocated pipeline's offload and reload use.
"""

from __future__ import annotations

import attrs

from libra.spec import checks
from libra.spec.errors import SpecError


def _positive(high: float):
    """Validator: a finite number (not a bool) in (0, high]; the bounds are far above any accelerator."""

    def check(instance: object, attribute: attrs.Attribute, value: float) -> None:
        checks.number(type(instance).__name__, attribute.name, value, 0.0, high, above=True)

    return check


def _name(instance: object, attribute: attrs.Attribute, value: str) -> None:
    checks.text(type(instance).__name__, attribute.name, value)


@attrs.frozen(kw_only=True)
class GPUSpec:
    """One accelerator: memory, dense bf16 compute and the four bandwidths the cost model uses."""

    name: str = attrs.field(validator=_name)
    memory_gb: float = attrs.field(validator=_positive(1e5))
    bf16_tflops: float = attrs.field(validator=_positive(1e6))
    hbm_bandwidth_gbs: float = attrs.field(validator=_positive(1e6))
    nvlink_bandwidth_gbs: float = attrs.field(validator=_positive(1e6))
    network_bandwidth_gbs: float = attrs.field(validator=_positive(1e6))
    host_bandwidth_gbs: float = attrs.field(default=32.0, validator=_positive(1e6))

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbs * 1e9


# Published datasheet numbers. A800 is the A100 with NVLink capped at 400 GB/s bidirectional (200 one way);
# the paper's cluster has 200 Gb/s RoCE per node, 25 GB/s shared by 8 GPUs.
GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            name="A800-80GB",
            memory_gb=80,
            bf16_tflops=312,
            hbm_bandwidth_gbs=2039,
            nvlink_bandwidth_gbs=200,
            network_bandwidth_gbs=25 / 8,
        ),
        GPUSpec(
            name="A100-80GB",
            memory_gb=80,
            bf16_tflops=312,
            hbm_bandwidth_gbs=2039,
            nvlink_bandwidth_gbs=300,
            network_bandwidth_gbs=25,
        ),
        GPUSpec(
            name="H100-80GB",
            memory_gb=80,
            bf16_tflops=989,
            hbm_bandwidth_gbs=3350,
            nvlink_bandwidth_gbs=450,
            network_bandwidth_gbs=50,
            host_bandwidth_gbs=64,
        ),
        GPUSpec(
            name="H200",
            memory_gb=141,
            bf16_tflops=989,
            hbm_bandwidth_gbs=4800,
            nvlink_bandwidth_gbs=450,
            network_bandwidth_gbs=50,
            host_bandwidth_gbs=64,
        ),
    )
}


def get_gpu(name: str) -> GPUSpec:
    """Look a GPU preset up by name (case-insensitive)."""
    for key, gpu in GPU_PRESETS.items():
        if key.lower() == name.lower():
            return gpu
    raise SpecError(f"unknown GPU {name!r}; known: {', '.join(GPU_PRESETS)}")
