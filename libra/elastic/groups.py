"""The core exchange's process group (libra/elastic/core.py): where its small all-reduced tensors live, and a check
that the group is the one the exchange was told of."""

from __future__ import annotations

import torch

__all__ = ["check_group", "counts_device"]


def counts_device(group) -> torch.device:
    """Where the small tensors a replica all-reduces over ``group`` (replica counts) live: the current CUDA device
    on an NCCL group, which reduces only device memory; else the CPU (gloo reduces either)."""
    name = group.name() if hasattr(group, "name") else torch.distributed.get_backend(group)
    return torch.device("cuda", torch.cuda.current_device()) if name == "nccl" else torch.device("cpu")


def check_group(group, core_rank: int, num_core_replicas: int) -> None:
    """The core group must hold ``num_core_replicas`` ranks with this process at ``core_rank``: otherwise replicas
    take one another's shards (or the membership all-reduce of differently sized tensors fails or hangs). Groups
    that cannot say their size and rank (a stand-in) are not checked."""
    if not (callable(getattr(group, "size", None)) and callable(getattr(group, "rank", None))):
        return
    if group.size() != num_core_replicas:
        raise ValueError(f"num_core_replicas={num_core_replicas}, but core_group holds {group.size()} rank(s)")
    if group.rank() != core_rank:
        raise ValueError(f"core_rank={core_rank}, but this process is rank {group.rank()} of core_group")
