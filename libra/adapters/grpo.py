"""The GRPO pieces a trainer adapter needs: group-relative advantages and the policy-gradient loss on token ids.

Loss of one batch (no KL term, no clipping: one on-policy step)::

    A_i   = (r_i - mean(r_group)) / (std(r_group) + eps)        for the G samples of one prompt
    loss  = - sum_i sum_t m_it * A_i * log pi(y_it | y_i<t) / sum_i sum_t m_it

where `m` masks the tokens the policy generated (tool outputs and prompts are not trained on).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any


def group_advantages(rewards: Sequence[float], group_size: int, eps: float = 1e-6) -> list[float]:
    """Group-relative advantages; `rewards` holds consecutive groups of `group_size` samples of one prompt."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size!r}")
    for i, r in enumerate(rewards):  # one NaN would turn its whole group's advantages (and the loss) into NaN
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r):
            raise ValueError(f"reward {i} is {r!r}; rewards must be finite numbers")
    out: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = list(rewards[start : start + group_size])
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / len(group)) ** 0.5
        out.extend((r - mean) / (std + eps) for r in group)
    return out


def make_batch(
    contexts: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], advantages: Sequence[float], *, pad_id: int
) -> dict[str, Any]:
    """Right-padded tensors: `input_ids`, `loss_mask` (1 on generated tokens), `advantages` (one per sequence).
    A mask shorter than its context leaves the rest untrained; one longer than its context is an error."""
    import torch

    if not contexts or not len(contexts) == len(masks) == len(advantages):
        raise ValueError(
            f"make_batch needs one mask and one advantage per context (at least one); got {len(contexts)} contexts, "
            f"{len(masks)} masks, {len(advantages)} advantages"
        )
    for i, (c, m) in enumerate(zip(contexts, masks, strict=True)):
        if len(m) > len(c):
            raise ValueError(f"make_batch: mask {i} has {len(m)} entries for a context of {len(c)} tokens")
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.float32)
    for i, (c, m) in enumerate(zip(contexts, masks, strict=True)):
        ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return {"input_ids": ids, "loss_mask": mask, "advantages": torch.tensor(advantages, dtype=torch.float32)}


def policy_loss(model: Any, batch: Mapping[str, Any]) -> Any:
    """The GRPO loss above for a Hugging Face causal LM (`model(input_ids).logits`)."""
    import torch

    missing = sorted({"input_ids", "loss_mask", "advantages"} - set(batch))
    if missing:
        raise ValueError(f"a GRPO batch needs input_ids, loss_mask and advantages; it lacks {missing}")
    ids, mask, adv = batch["input_ids"], batch["loss_mask"], batch["advantages"]
    if tuple(mask.shape) != tuple(ids.shape) or tuple(adv.shape) != tuple(ids.shape[:1]):
        # broadcasting would train every row on one advantage (or one row's mask) without a word
        raise ValueError(
            f"a GRPO batch of input_ids {tuple(ids.shape)} needs loss_mask {tuple(ids.shape)} and advantages "
            f"{tuple(ids.shape[:1])}; got {tuple(mask.shape)} and {tuple(adv.shape)}"
        )
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    m = mask[:, 1:]
    return -(logp * m * adv[:, None]).sum() / m.sum().clamp(min=1.0)


def shard_batch(batch: Mapping[str, Any], rows: slice) -> dict[str, Any]:
    """Rows `rows` of every tensor in `batch` (a replica's shard of the fixed global batch)."""
    return {k: v[rows] for k, v in batch.items()}
