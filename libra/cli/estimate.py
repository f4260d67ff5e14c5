"""`libra estimate`: what the cost model predicts for one configuration, so it can be seen and challenged.

Decode step time at each batch x context per TP degree, prefill time, memory per GPU of a rollout instance, and one
training step (the best layout on `--gpus` GPUs, or the one given with `--train-layout`). The defaults are anchored
on published measurements (docs/cost-model.md); `--coeffs` shows what a fitted file (e.g. from `libra profile`)
changes.
"""

from __future__ import annotations

import argparse
from typing import Any

from libra.cli._common import (
    MAX_MODEL_LEN,
    MAX_TRAJECTORIES_PER_STEP,
    CLIError,
    add_setup_args,
    check_ranges,
    emit_json,
    key_values,
    table,
)

GB = 1e9


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="what the cost model predicts: decode/prefill latency per TP, memory, one training step",
        description="Print the cost model's predictions for one configuration. Defaults: Qwen3-14B on A800-80GB, "
        "TP 1,2,4,8, batch 1 and 64 at 8,192 tokens of context, a training step of 512 x 8,192 tokens on 8 GPUs.",
    )
    add_setup_args(p, gpus=8)
    p.add_argument("--tp", default="1,2,4,8", help="rollout TP degrees (comma-separated, default 1,2,4,8)")
    p.add_argument("--batch", default="1,64", help="concurrent sequences per instance (default 1,64)")
    p.add_argument("--context", default="8192", help="resident context per sequence, tokens (default 8192)")
    p.add_argument("--prefill", default="2048", help="prompt tokens to prefill, batch 1 (default 2048)")
    p.add_argument("--train-seqs", type=int, default=512, help="sequences per training step (default 512)")
    p.add_argument("--train-len", type=int, default=8192, help="tokens per training sequence (default 8192)")
    p.add_argument(
        "--train-layout",
        default=None,
        metavar="TP,PP,DP[,EP[,MB[,recompute]]]",
        help="training layout to price (default: the best one on --gpus, found by the planner's search)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(run=run)


def _ints(text: str, flag: str, *, positive: bool = True, high: int | None = None) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or (positive and min(values) < 1):
        raise CLIError(f"{flag} needs integers >= 1, got {text!r}")
    if high is not None and max(values) > high:
        raise CLIError(f"{flag} needs integers <= {high:,}, got {text!r}")
    return values


_RECOMPUTE = {"1": True, "true": True, "yes": True, "recompute": True, "0": False, "false": False, "no": False}


def _layout(text: str, cm, num_sequences: int):
    """The layout of --train-layout, refused where the planner's search could never choose it: TP, PP and EP
    that do not divide the model (or TP x EP that leaves a node), a micro-batch over a replica's sequences."""
    from libra.planning.train_tree import ep_degrees, pp_degrees, tp_degrees
    from libra.spec import TrainConfig

    parts = [x.strip() for x in text.split(",")]
    if not 3 <= len(parts) <= 6:
        raise CLIError(f"--train-layout is TP,PP,DP[,EP[,MB[,recompute]]], got {text!r}")
    if len(parts) == 6 and parts[5].lower() not in _RECOMPUTE:
        raise CLIError(f"--train-layout {text!r}: recompute is one of {', '.join(_RECOMPUTE)}, got {parts[5]!r}")
    recompute = len(parts) == 6 and _RECOMPUTE[parts[5].lower()]
    nums = _ints(",".join(parts[:5]), "--train-layout")
    tp, pp, dp = nums[:3]
    ep = nums[3] if len(nums) > 3 else 1
    mb = nums[4] if len(nums) > 4 else 1
    num_gpus = cm.cluster.num_gpus
    if tp * pp * dp != num_gpus:
        raise CLIError(f"--train-layout {text!r}: tp * pp * dp = {tp * pp * dp}, but --gpus is {num_gpus}")
    for name, value, valid in (("tp", tp, tp_degrees(cm)), ("pp", pp, pp_degrees(cm)), ("ep", ep, ep_degrees(cm, tp))):
        if value not in valid:
            raise CLIError(
                f"--train-layout {text!r}: {name} {value} does not fit {cm.model.name} on nodes of "
                f"{cm.cluster.gpus_per_node} GPUs; {name} is one of {', '.join(map(str, valid))}"
            )
    per_replica = -(-num_sequences // dp)
    if mb > per_replica:
        raise CLIError(f"--train-layout {text!r}: micro-batch {mb} exceeds the {per_replica} sequences of a replica")
    return TrainConfig(num_gpus=num_gpus, tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=mb, recompute=recompute)


def estimate(args: argparse.Namespace) -> dict[str, Any]:
    from libra.cli._common import setup_from_args
    from libra.planning.cost import BatchStats, CostModel
    from libra.planning.cost.switch import colocated_switch
    from libra.planning.train_tree import TrainingSearch

    check_ranges(args, {"train_seqs": (1, MAX_TRAJECTORIES_PER_STEP), "train_len": (1, MAX_MODEL_LEN)})
    cluster, model, coeffs = setup_from_args(args)
    cm = CostModel(cluster, model, coeffs)
    rc, c = cm.rollout, cm.coeffs
    tps = _ints(args.tp, "--tp")
    bad = [t for t in tps if t > cluster.gpus_per_node or model.num_heads % t]
    if bad:
        raise CLIError(
            f"--tp {bad[0]}: a rollout instance must fit in one node ({cluster.gpus_per_node} GPUs) and divide "
            f"the {model.num_heads} attention heads"
        )
    batches = _ints(args.batch, "--batch", high=MAX_TRAJECTORIES_PER_STEP)
    contexts = _ints(args.context, "--context", high=MAX_MODEL_LEN)
    prompts = _ints(args.prefill, "--prefill", high=MAX_MODEL_LEN)
    decode, memory, prefill = [], [], []
    for tp in tps:
        capacity = float(rc.kv_capacity_tokens(tp))
        memory.append(
            {
                "tp": tp,
                "weights_gb_per_gpu": model.weight_bytes / tp / GB,
                "kv_pool_gb_per_gpu": capacity * model.kv_bytes_per_token(tp) / GB,
                "kv_capacity_tokens": int(capacity),  # whole tokens: a fraction of one holds none
                "engine_memory_gb_per_gpu": c.gpu_memory_utilization * cluster.gpu.memory_gb,
            }
        )
        for b in batches:
            for ctx in contexts:
                step = float(rc.decode_step_time(tp, float(b), float(ctx)))
                decode.append(
                    {
                        "tp": tp,
                        "batch": b,
                        "context": ctx,
                        "step_ms": 1e3 * step,
                        "tokens_per_s": b / step,
                        "tokens_per_s_per_gpu": b / step / tp,
                        "fits_kv": b * ctx <= capacity,
                    }
                )
        for n in prompts:
            prefill.append({"tp": tp, "tokens": n, "ms": 1e3 * float(rc.prefill_time(tp, float(n), n / 2.0))})

    batch = BatchStats.uniform(num_sequences=args.train_seqs, length=args.train_len)
    if args.train_layout:
        cfg = _layout(args.train_layout, cm, args.train_seqs)
        time_s = float(cm.training.step_time(cfg.tp, cfg.pp, cfg.dp, cfg.ep, cfg.micro_batch, cfg.recompute, batch))
        mem = float(cm.training.memory_bytes(cfg.tp, cfg.pp, cfg.dp, cfg.ep, cfg.micro_batch, cfg.recompute, batch))
        train = {
            **_train_dict(cfg),
            "time_s": time_s,
            "memory_gb_per_gpu": mem / GB,
            "fits": mem <= 0.95 * cluster.gpu.memory_bytes,
        }
    else:
        best = TrainingSearch(cm, batch).best(cluster.num_gpus)
        if best is None:
            train = {"fits": False, "time_s": None, "gpus": cluster.num_gpus}
        else:
            train = {**_train_dict(best), "time_s": best.time_s, "memory_gb_per_gpu": best.memory_gb, "fits": True}
    train.update(sequences=args.train_seqs, length=args.train_len)
    train_gpus = int(train.get("gpus") or cluster.num_gpus)
    switch = [
        {"tp": tp, **colocated_switch(c, model, cluster.gpu, rollout_tp=tp, train_gpus=train_gpus).to_dict()}
        for tp in tps
    ]
    by_tp = {str(d["tp"]): d["step_ms"] for d in decode if d["batch"] == batches[0] and d["context"] == contexts[0]}
    return {
        "model": model.name,
        "gpu": cluster.gpu.name,
        "coeffs": args.coeffs or "defaults (anchored: docs/cost-model.md)",
        "decode_step_ms": by_tp,
        "decode": decode,
        "prefill": prefill,
        "memory": memory,
        "training": train,
        "colocated_switch": switch,
    }


def _train_dict(cfg) -> dict[str, Any]:
    return {
        "gpus": cfg.num_gpus,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "dp": cfg.dp,
        "ep": cfg.ep,
        "micro_batch": cfg.micro_batch,
        "recompute": cfg.recompute,
    }


def run(args: argparse.Namespace) -> int:
    out = estimate(args)
    if args.json:
        emit_json(out)
        return 0
    print(f"{out['model']} on {out['gpu']}; coefficients: {out['coeffs']}\n")
    rows = [
        [d["tp"], d["batch"], d["context"], d["step_ms"], d["tokens_per_s"], d["tokens_per_s_per_gpu"], d["fits_kv"]]
        for d in out["decode"]
    ]
    print(table(["TP", "batch", "context", "step ms", "tok/s", "tok/s/GPU", "fits KV"], rows, title="Decode step"))
    print()
    rows = [[p["tp"], p["tokens"], p["ms"]] for p in out["prefill"]]
    print(table(["TP", "tokens", "ms"], rows, title="Prefill (batch 1)"))
    print()
    rows = [[m["tp"], m["weights_gb_per_gpu"], m["kv_pool_gb_per_gpu"], m["kv_capacity_tokens"]] for m in out["memory"]]
    print(table(["TP", "weights GB/GPU", "KV pool GB/GPU", "KV tokens"], rows, title="Rollout memory"))
    print()
    rows = [
        [w["tp"], w["sleep_wake_s"], w["offload_s"], w["reshard_s"], w["per_step_s"]] for w in out["colocated_switch"]
    ]
    title = "Colocated switches (verl's hybrid engine; s per switch, reshard once per step)"
    print(table(["TP", "sleep/wake s", "offload/reload s", "reshard s", "per step s"], rows, title=title))
    print()
    t = out["training"]
    if t.get("time_s") is None:
        print(f"Training step: no layout of {t['gpus']} GPUs fits {t['sequences']} x {t['length']} tokens")
        return 0
    layout = f"TP-{t['tp']} x PP-{t['pp']} x DP-{t['dp']}, EP-{t['ep']}, micro-batch {t['micro_batch']}" + (
        ", recompute" if t["recompute"] else ""
    )
    pairs = [
        ("layout", layout),
        ("step s", float(t["time_s"])),
        ("memory GB/GPU", float(t["memory_gb_per_gpu"])),
        ("fits", t["fits"]),
    ]
    print(key_values(pairs, title=f"Training step ({t['sequences']} x {t['length']} tokens on {t['gpus']} GPUs)"))
    return 0
