"""Bodies of the multi-process trainer tests (run in spawned children; importable by name)."""

from __future__ import annotations

import time
from pathlib import Path

import adapter_procs as P

from tests.limits import scaled

HYBRID = "hybrid-0"


def _pace(ex, cap_s: float = 20.0) -> None:
    """Test steps take a millisecond; hold a core step while a join is on its way (the exchange never waits)."""
    deadline = time.monotonic() + scaled(cap_s)
    while ex.joining and not ex.join_message_waiting() and time.monotonic() < deadline:
        time.sleep(0.001)


def _state(module, optimizer) -> dict:
    import copy

    return {"model": copy.deepcopy(module.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}


def _admit_first_hybrid(ex, server) -> None:
    """The hybrid's process starts slower than a test step: wait (up to 120 s, scaled) until it has connected to
    ``server`` and admit its link before the first step."""
    deadline = time.monotonic() + scaled(120)
    while not (links := server.accept_ready()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for link in links:
        ex.admit(link)


def _connect(side_port: int):
    """A hybrid's link to the core's side-channel server, retried until the server listens (up to 120 s, scaled)."""
    from libra.elastic.wire import LinkError, TcpLink

    deadline = time.monotonic() + scaled(120)
    while True:
        try:
            return TcpLink.connect("127.0.0.1", side_port, timeout=scaled(5.0))
        except LinkError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def core_with_hybrid(rank: int, make_trainer, steps: int, port: int, side_port: int) -> dict:
    """A core replica (rank 0 or 1 of a 2-rank world) training with the elastic side channel as its grad hook;
    rank 0 serves the hybrid's join. Rank 0 checks every 3-replica step against one-process 3-replica DP."""
    import torch.distributed as dist

    from libra.adapters.grpo import shard_batch
    from libra.elastic.core import CoreExchange
    from libra.elastic.wire import SideChannelServer

    trainer = make_trainer(rank, port)
    server = SideChannelServer(host="127.0.0.1", port=side_port) if rank == 0 else None
    ex = CoreExchange(
        core_group=dist.group.WORLD,
        core_rank=rank,
        num_core_replicas=2,
        model=trainer.module,
        optimizer=trainer.optimizer,
        timeout_s=scaled(30.0),
    )
    if server is not None:
        _admit_first_hybrid(ex, server)
    before, after, members = {}, {}, {}
    for t in range(steps):
        if sum(n == 3 for n in members.values()) >= 2:
            break
        _pace(ex)
        a = ex.begin_step(t)
        before[t] = _state(trainer.module, trainer.optimizer)
        trainer.train_step(shard_batch(P.data(t), a.shard(P.GLOBAL_BATCH)), grad_hook=ex.reduce)
        after[t] = _state(trainer.module, trainer.optimizer)
        members[t] = a.num_replicas
    ex.remove(HYBRID, step=steps, why="test over")
    ex.close()
    if server is not None:
        server.close()
    worst = 0.0
    for t in (t for t, n in members.items() if n == 3):
        worst = max(worst, P.max_param_diff(after[t]["model"], P.reference_step(before[t], t, 3)["model"]))
    dist.barrier()
    return {"members": members, "worst_3dp_diff": worst, "version": trainer.version}


def hybrid(side_port: int) -> dict:
    import torch

    from libra.adapters.grpo import shard_batch
    from libra.adapters.torch_ddp import TorchDDPTrainer
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica

    trainer = TorchDDPTrainer(
        model=P.make_mlp(seed=7),
        loss_fn=P.mse_loss,
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=P.LR),
    )
    hy = HybridReplica(worker=HYBRID, model=trainer.module, optimizer=trainer.optimizer, timeout_s=scaled(30.0))
    hy.join(_connect(side_port))
    active = 0
    while (a := hy.begin_step()) is not None:
        if a.mode == Mode.ACTIVE:
            active += 1
            batch = shard_batch(P.data(a.step), a.shard(P.GLOBAL_BATCH))
            trainer.train_step(batch, grad_hook=hy.reduce, step=a.step)  # sends its gradient, gets the mean
        else:
            grads = trainer.local_grads()
            for g in grads:
                g.zero_()
            hy.reduce(a.step, grads)
            trainer.optimizer.step()
    return {"active_steps": active}


def ds_trainer(zero_stage: int):
    def make(rank: int, port: int):
        from libra.adapters.deepspeed_trainer import DeepSpeedTrainer, deepspeed_config, init_distributed

        P.init_env(rank, 2, port)
        init_distributed("gloo")
        config = deepspeed_config(zero_stage=zero_stage, micro_batch=P.GLOBAL_BATCH // 2, lr=P.LR, dp=2)
        return DeepSpeedTrainer(model=P.make_mlp(seed=0), config=config, loss_fn=P.mse_loss)

    return make


def ds_refusals(rank: int, port: int) -> dict:
    """What a one-rank DeepSpeed world refuses, each as its error's type and message: a config written for dp = 2,
    a ZeRO stage DeepSpeed does not have, a snapshot of another model."""
    import torch

    from libra.adapters.deepspeed_trainer import DeepSpeedTrainer, deepspeed_config, init_distributed

    P.init_env(rank, 1, port)
    init_distributed("gloo")
    out = {}

    def attempt(key, fn):
        try:
            fn()
            out[key] = "accepted"
        except Exception as exc:  # noqa: BLE001 - the test reads the type and the message
            out[key] = f"{type(exc).__name__}: {exc}"

    def trainer(model, **overrides):
        config = {**deepspeed_config(zero_stage=0, micro_batch=2, lr=P.LR, dp=1), **overrides}
        return DeepSpeedTrainer(model=model, config=config, loss_fn=P.mse_loss)

    wrong_dp = deepspeed_config(zero_stage=0, micro_batch=2, lr=P.LR, dp=2)
    attempt("dp2_in_world1", lambda: DeepSpeedTrainer(model=P.make_mlp(seed=0), config=wrong_dp))
    attempt("stage7", lambda: trainer(P.make_mlp(seed=0), zero_optimization={"stage": 7}))
    other = trainer(torch.nn.Linear(P.IN, P.OUT)).snapshot()
    attempt("foreign_snapshot", lambda: trainer(P.make_mlp(seed=0)).restore(other))
    zeroed = trainer(P.make_mlp(seed=0))  # a hook that returns new (zero) tensors: Adam then moves nothing
    before = {k: v.clone() for k, v in zeroed.module.state_dict().items()}
    zeroed.train_step(
        {k: v[:2] for k, v in P.data(0).items()}, grad_hook=lambda step, grads: [torch.zeros_like(g) for g in grads]
    )
    out["moved_by_zero_hook"] = P.max_param_diff(zeroed.module.state_dict(), before)
    return out


def ds_core(rank: int, steps: int, port: int, side_port: int) -> dict:
    return core_with_hybrid(rank, ds_trainer(0), steps, port, side_port)


def ds_stages(rank: int, port: int, stages: tuple[int, ...], steps: int) -> dict:
    """Plain DeepSpeed steps (its own reduction) at each ZeRO stage, and with an all-reduce grad hook at stages
    0/1, against one-process 2-replica DP."""
    import torch
    import torch.distributed as dist

    from libra.adapters.grpo import shard_batch
    from libra.elastic.grads import shard_bounds

    def mean_hook(step, grads):
        for g in grads:
            dist.all_reduce(g)
            g /= dist.get_world_size()
        return grads

    out = {}
    for stage in stages:
        for hooked in (False, True) if stage <= 1 else (False,):
            trainer = ds_trainer(stage)(rank, port)
            state = {"model": {k: v.clone() for k, v in P.make_mlp(seed=0).state_dict().items()}, "optimizer": None}
            worst = 0.0
            for t in range(steps):
                rows = slice(*shard_bounds(P.GLOBAL_BATCH, rank, 2))
                trainer.train_step(shard_batch(P.data(t), rows), grad_hook=mean_hook if hooked else None)
                state = P.reference_step(state, t, 2)
                got = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}
                worst = max(worst, P.max_param_diff(got, state["model"]))
            out[f"zero{stage}{'+hook' if hooked else ''}"] = worst
            if stage >= 2:  # gradients are reduced inside backward: a hook there must be refused, not ignored
                from libra.adapters import UnsupportedConfig

                try:
                    trainer.train_step(shard_batch(P.data(0), rows), grad_hook=mean_hook)
                    out[f"zero{stage}+hook"] = "accepted"
                except UnsupportedConfig as exc:
                    out[f"zero{stage}+hook"] = f"refused: {exc}"
            del trainer
    weights = ds_trainer(0)(rank, port).export_weights()
    out["export_buckets"] = len(weights.buckets)
    torch.distributed.barrier()
    return out


def ddp_core(rank: int, steps: int, port: int, side_port: int) -> dict:
    def make(rank: int, port: int):
        import torch
        import torch.distributed as dist

        from libra.adapters.torch_ddp import TorchDDPTrainer

        P.init_env(rank, 2, port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        return TorchDDPTrainer(
            model=P.make_mlp(seed=0), loss_fn=P.mse_loss, optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=P.LR)
        )

    return core_with_hybrid(rank, make, steps, port, side_port)


def _megatron_tp2_gpt(seed: int):
    """A two-layer GPT over this process's TP = 2 world (gloo, the CPU shim), without Megatron's optimizer."""
    import torch

    from libra.adapters.megatron_trainer import MegatronTrainer, gpt_config
    from libra.spec import TrainConfig

    train = TrainConfig(num_gpus=2, tp=2, pp=1, dp=1)
    config = gpt_config(train, num_layers=2, hidden_size=64, num_attention_heads=2, cpu_init=True)
    torch.manual_seed(seed)
    return MegatronTrainer(
        train=train,
        config=config,
        vocab_size=128,
        max_sequence_length=32,
        lr=1e-3,
        use_distributed_optimizer=False,
        with_optimizer=False,
        seed=seed,
    )


def megatron_tp2(rank: int, port: int) -> dict:
    """TP=2 on gloo with the test-only CPU shim: groups, sharded GPTModel, Megatron DDP, the gradient hook."""
    import megatron_shim
    import torch
    import torch.distributed as dist

    megatron_shim.install()
    P.init_env(rank, 2, port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from megatron.core import parallel_state as ps

    trainer = _megatron_tp2_gpt(seed=0)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1)}
    loss = trainer.train_step(batch)
    plain = [g.clone() for g in trainer.local_grads()]
    seen = []

    def double(step, grads):
        seen.append((step, [tuple(g.shape) for g in grads]))
        for g in grads:
            g.mul_(2.0)
        return grads

    hooked_loss = trainer.train_step(batch, grad_hook=double, step=41)
    from libra.adapters.megatron_trainer import init_parallel
    from libra.spec import TrainConfig

    try:  # the groups exist for TP = 2: a DP = 2 layout on the same ranks must not be taken as done
        init_parallel(TrainConfig(num_gpus=2, tp=1, pp=1, dp=2))
        relayout = "accepted"
    except Exception as exc:  # noqa: BLE001 - the test reads the type and the message
        relayout = f"{type(exc).__name__}: {exc}"
    init_parallel(TrainConfig(num_gpus=2, tp=2, pp=1, dp=1))  # the layout it has: nothing to do
    worst = max(float((g - 2 * p).abs().max()) for g, p in zip(trainer.local_grads(), plain))
    shapes = {n: tuple(p.shape) for n, p in trainer.module.named_parameters()}
    losses = [0.0, 0.0]
    dist.all_gather_object(losses, loss)
    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "shapes": shapes,
        "losses": losses,
        "hooked_loss": hooked_loss,
        "loss": loss,
        "hook_steps": [s for s, _ in seen],
        "hook_vs_plain": worst,
        "grad_norm": float(sum(float(p.norm()) for p in plain)),
        "relayout": relayout,
    }


def megatron_tp2_pool(
    proc: int, world_ports: tuple[int, int], side_ports: tuple[int, int], steps: int, signal_dir: str
) -> dict:
    """A Megatron-core GPT with TP = 2 as the core replica (processes 0 and 1, one gloo world) and another as a
    hybrid replica (processes 2 and 3, a world of their own), on the test-only CPU shim. Each core rank runs a
    CoreExchange for its coordinate (its data-parallel group of one, the replica's model-parallel group) with
    Megatron's gradient buffers as the hook's gradients; each hybrid rank joins the core rank of its coordinate
    over TCP under one worker name and trains its shard of the batch. torch's Adam steps on the gradient buffers
    (Megatron's own optimizers allocate on CUDA). The hybrid's rank at coordinate 1 restores its snapshot only
    after the rank at coordinate 0 has stepped once as a placeholder (a file in ``signal_dir``), so the two ranks
    attach at different boundaries and the coordinates must agree to promote them together."""
    import megatron_shim
    import torch
    import torch.distributed as dist

    megatron_shim.install()
    core, coord = proc < 2, proc % 2
    P.init_env(coord, 2, world_ports[proc // 2])
    dist.init_process_group("gloo", rank=coord, world_size=2)
    from megatron.core import parallel_state as ps

    from libra.adapters.grpo import shard_batch
    from libra.elastic.core import CoreExchange
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.snapshot import state_digest
    from libra.elastic.wire import SideChannelServer

    trainer = _megatron_tp2_gpt(seed=0 if core else 5)
    params = [p for p in trainer.module.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)

    def batch(t: int, rows: slice) -> dict:
        tokens = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(t))
        return shard_batch({"tokens": tokens, "labels": torch.roll(tokens, -1, 1)}, rows)

    def optimizer_step() -> None:
        for p in params:
            p.grad = p.main_grad
        opt.step()

    digests, modes, losses = {}, {}, {}
    if core:
        ex = CoreExchange(
            core_group=ps.get_data_parallel_group(),
            core_rank=0,
            num_core_replicas=1,
            model=trainer.module,
            optimizer=opt,
            timeout_s=scaled(30.0),
            model_parallel_group=ps.get_model_parallel_group(),
        )
        server = SideChannelServer(host="127.0.0.1", port=side_ports[coord])
        _admit_first_hybrid(ex, server)
        for t in range(steps):
            _pace(ex, cap_s=20.0 if coord == 0 else 0.2)  # coordinate 1's rank restores late: step on meanwhile
            a = ex.begin_step(t)
            losses[t] = trainer.train_step(batch(t, a.shard(4)), grad_hook=ex.reduce, step=t)
            optimizer_step()
            digests[t] = list(state_digest(trainer.module, opt))
        ex.remove(HYBRID, step=steps, why="test over")
        counted = [[r.step, r.num_contributed] for r in ex.records]
        ex.close()
        server.close()
    else:
        signal = Path(signal_dir) / "placeholder-step-done"

        def late_restore(point: str) -> None:
            if point == "restoring" and coord == 1:
                deadline = time.monotonic() + scaled(120)
                while not signal.exists():
                    assert time.monotonic() < deadline, "coordinate 0's hybrid rank never stepped as a placeholder"
                    time.sleep(0.02)

        hy = HybridReplica(
            worker=HYBRID, model=trainer.module, optimizer=opt, timeout_s=scaled(30.0), fault=late_restore
        )
        hy.join(_connect(side_ports[coord]), snapshot_timeout_s=scaled(60))
        while (a := hy.begin_step()) is not None:
            modes[a.step] = a.mode.value
            if a.mode == Mode.ACTIVE:  # the forward and backward pass with its TP peer, the hook sends the gradient
                losses[a.step] = trainer.train_step(batch(a.step, a.shard(4)), grad_hook=hy.reduce, step=a.step)
            else:
                trainer.model.zero_grad_buffer()
                hy.reduce(a.step, trainer.local_grads())
            optimizer_step()
            digests[a.step] = list(state_digest(trainer.module, opt))
            if a.mode == Mode.PLACEHOLDER:
                signal.touch()
        counted = []
    dist.barrier()
    dist.destroy_process_group()
    return {"core": core, "digests": digests, "modes": modes, "losses": losses, "counted": counted}
