"""GPU check of the Megatron-core adapter (needs CUDA GPUs; CPU tests cover config, groups and model build only).

    torchrun --nproc-per-node 2 examples/gpu_check_megatron.py --tp 2          # TP=2, DP=1
    torchrun --nproc-per-node 4 examples/gpu_check_megatron.py --tp 2          # TP=2, DP=2 (hook vs Megatron DDP)

Checks, printing one JSON line per rank:
1. `MegatronTrainer` builds from a `TrainConfig` (parallel_state, GPTModel, Megatron DDP, distributed optimizer);
2. three optimizer steps on a fixed batch run and lower the loss;
3. the gradient hook: two trainers built with the same seeds take one step on the same batch, one with plain
   Megatron DDP, one with a hook that all-reduces the local gradients over the DP group (what the side channel does
   with no hybrid attached); their parameters must agree.
Exit code 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size, divides the world size (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps on the fixed batch (default 3, >= 2)")
    args = parser.parse_args()
    if args.tp < 1 or args.steps < 2:
        parser.error("--tp must be >= 1 and --steps >= 2 (the check compares the first and last loss)")
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world < 1:
        parser.error("start it with torchrun (torchrun --nproc-per-node N examples/gpu_check_megatron.py --tp T)")
    if world % args.tp:
        parser.error(f"--tp {args.tp} does not divide the {world} processes torchrun started")

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("gpu_check_megatron: error: no CUDA GPU here (the CPU tests cover the rest)", file=sys.stderr)
        return 2
    from megatron.core import parallel_state as ps

    from libra.adapters.megatron_trainer import MegatronTrainer, gpt_config
    from libra.spec import TrainConfig

    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    train = TrainConfig(num_gpus=world, tp=args.tp, pp=1, dp=world // args.tp)
    config = gpt_config(train, num_layers=2, hidden_size=128, num_attention_heads=4)

    def build():
        torch.manual_seed(0)
        return MegatronTrainer(train=train, config=config, vocab_size=256, max_sequence_length=64, lr=1e-3, seed=0)

    trainer = build()
    gen = torch.Generator().manual_seed(1234 + ps.get_data_parallel_rank())  # each DP replica its own shard
    tokens = torch.randint(0, 256, (4, 32), generator=gen).cuda()
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1)}
    losses = [trainer.train_step(batch) for _ in range(args.steps)]

    def dp_mean(step, grads):
        group = ps.get_data_parallel_group()
        for g in grads:
            dist.all_reduce(g, group=group)
            g /= ps.get_data_parallel_world_size()
        return grads

    results = {}
    for name, hook in (("plain", None), ("hook", dp_mean)):
        fresh = build()
        fresh.train_step(batch, grad_hook=hook)
        results[name] = [p.detach().float().clone() for p in fresh.module.parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(results["plain"], results["hook"]))
    ok = losses[-1] < losses[0] and diff < 1e-5
    print(
        json.dumps(
            {
                "rank": rank,
                "tp": ps.get_tensor_model_parallel_world_size(),
                "dp": ps.get_data_parallel_world_size(),
                "losses": losses,
                "hook_vs_ddp_max_diff": diff,
                "ok": ok,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
