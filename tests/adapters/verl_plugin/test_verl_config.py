"""`emit_verl_config` against verl 0.9.1 itself: Hydra compose of verl's own trainer config with the emitted
overrides, `validate_config`, `omega_conf_to_dataclass` of the actor, rollout and router sections, and the trainer
constructor (`separate_async` or `libra_separate_async`). Where it stops on CPU: `trainer.init()` asks Ray for the
trainer's and rollout's GPU resource pools, which a CPU machine does not have; everything before it runs here.

Plans: six from Libra's planner (Megatron actors; 8 to 64 GPUs, one TP and mixed TP, MoE with EP) and four
data-parallel plans for FSDP actors (the planner's training tree prefers PP, so FSDP-shaped plans are written out).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import verl
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.adapters.verl import VerlConfigError, emit_verl_config
from libra.adapters.verl.balancer import buckets_from_yaml
from libra.planning import GlobalPlanner, PlannerOptions
from libra.spec import ClusterSpec, InstanceGroup, Plan, RLSettings, RolloutConfig, TrainConfig, get_gpu, get_model
from libra.workloads import profile_from_trajectories
from libra.workloads.generators import WorkloadGenerator

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")

# (model, GPUs, GPUs per node, workload, prompts, samples, max length, routing) -> a planner plan (Megatron)
PLANNED = [
    ("Qwen3-14B", 48, 8, "r2e-gym", 512, 16, 40960, "start-small"),
    ("Qwen3-14B", 48, 8, "search-r1", 512, 16, 40960, "start-small"),
    ("Qwen3-14B", 16, 8, "r2e-gym", 512, 16, 40960, "start-small"),
    ("Qwen3-14B", 24, 8, "search-r1", 512, 16, 40960, "start-small"),
    ("Qwen3-4B", 8, 8, "search-r1", 64, 8, 16384, "start-small"),
    ("Qwen3-30B-A3B", 64, 8, "r2e-gym", 256, 8, 16384, "final-length"),
]


def _planned(model, gpus, gpn, workload, prompts, samples, max_len, routing):
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=gpn)
    rl = RLSettings(num_prompts=prompts, samples_per_prompt=samples, max_model_len=max_len)
    gen = WorkloadGenerator(workload, seed=0, num_prompts=prompts, samples_per_prompt=samples, max_model_len=max_len)
    profile = profile_from_trajectories(gen.step(0), name=workload, requests_per_step=rl.global_batch)
    planner = GlobalPlanner(cluster=cluster, model=get_model(model), rl=rl, options=PlannerOptions(routing=routing))
    return planner.plan(profile), cluster, rl


def _dp_plan(train_gpus, groups, *, gpus_per_node=8, micro_batch=2, recompute=True, prompts=64, samples=8):
    """A data-parallel training layout (what an FSDP actor runs) beside rollout groups [(tp, count, max_tokens)]."""
    rollout_gpus = sum(tp * count for tp, count, _ in groups)
    total = train_gpus + rollout_gpus
    cluster = ClusterSpec.from_total(
        gpu=get_gpu("A800-80GB"), num_gpus=math.ceil(total / gpus_per_node) * gpus_per_node, gpus_per_node=gpus_per_node
    )
    train = TrainConfig(num_gpus=train_gpus, tp=1, pp=1, dp=train_gpus, micro_batch=micro_batch, recompute=recompute)
    instances = tuple(InstanceGroup(tp=tp, count=count, max_tokens=limit) for tp, count, limit in groups)
    plan = Plan(
        train=train, rollout=RolloutConfig(num_gpus=rollout_gpus, time_s=1.0, instances=instances), makespan_s=1.0
    )
    return plan, cluster, RLSettings(num_prompts=prompts, samples_per_prompt=samples, max_model_len=16384)


FSDP_PLANS = [
    ((8, [(2, 4, math.inf)]), {}),
    ((16, [(1, 4, 3000.0), (4, 3, math.inf)]), {}),
    ((4, [(1, 2, 2000.0), (2, 1, 8000.0), (4, 1, math.inf)]), {"micro_batch": 1, "recompute": False}),
    ((32, [(8, 2, math.inf)]), {"prompts": 128}),
]


def _cases():
    for args in PLANNED:
        yield f"megatron-{args[0]}-{args[1]}gpus-{args[3]}", "megatron", args, None
    for (train_gpus, groups), kw in FSDP_PLANS:
        yield f"fsdp-{train_gpus}train-{len(groups)}buckets", "fsdp", None, (train_gpus, groups, kw)


@pytest.fixture(scope="module")
def hydra_dir():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        yield
    GlobalHydra.instance().clear()


def test_import_verl_registers_libra_through_the_entry_point():
    # nothing here imports libra.adapters.verl.plugin: `import verl` did, through the verl.plugins entry point
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    assert "libra_separate_async" in TRAINER_REGISTRY and "libra_tool_agent" in _agent_loop_registry


def test_verl_accepts_the_emitted_config_for_ten_plans(hydra_dir, tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    seen = {"megatron": 0, "fsdp": 0, "mixed": 0, "single": 0}
    gpu_counts = set()
    for name, strategy, planned, handmade in _cases():
        if planned is not None:
            plan, cluster, rl = _planned(*planned)
        else:
            train_gpus, groups, kw = handmade
            plan, cluster, rl = _dp_plan(train_gpus, groups, **kw)
        out = tmp_path / name
        vc = emit_verl_config(plan, cluster=cluster, rl=rl, model_path=str(tmp_path), strategy=strategy, config_dir=out)
        vc.write(out)
        overrides = (out / "overrides.txt").read_text().split()
        cfg = compose(config_name=vc.config_name, overrides=overrides)

        # verl's own checks and dataclasses
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        # what verl derives equals what the planner decided
        t = plan.train
        n_train = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        assert n_train == t.num_gpus, name
        if strategy == "megatron":
            mp = actor.megatron.tensor_model_parallel_size * actor.megatron.pipeline_model_parallel_size
            assert (n_train // mp, actor.megatron.expert_model_parallel_size) == (t.dp, t.ep), name
            assert (actor.megatron.override_transformer_config.get("recompute_granularity") == "full") == t.recompute
        else:
            assert actor.strategy == "fsdp" and cfg.actor_rollout_ref.model.enable_gradient_checkpointing == t.recompute
        assert actor.ppo_micro_batch_size_per_gpu == t.micro_batch
        assert cfg.data.train_batch_size == (
            cfg.trainer.v1.separate_async.parameter_sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        )
        n_rollout = rollout.nnodes * rollout.n_gpus_per_node
        assert n_rollout == plan.rollout.num_gpus, name
        buckets = rollout.custom["libra"]["buckets"]
        assert sorted((b["tp"], b["replicas"]) for b in buckets) == sorted(
            (g.tp, g.count) for g in plan.rollout.instances
        )
        for b in buckets:  # each bucket's verl pool: replicas fit a node, floor division loses nothing
            assert b["n_gpus_per_node"] % b["tp"] == 0 and b["n_gpus_per_node"] <= cluster.gpus_per_node
            assert b["nnodes"] * b["n_gpus_per_node"] // b["tp"] == b["replicas"]
            assert b["nnodes"] * b["n_gpus_per_node"] % b["tp"] == 0
        if len(buckets) == 1:
            assert n_rollout // rollout.tensor_model_parallel_size == buckets[0]["replicas"]
        router_yaml = yaml.safe_load(Path(cfg.actor_rollout_ref.rollout.router_config_path).read_text())
        assert [b.tp for b in buckets_from_yaml(router_yaml)] == [b["tp"] for b in buckets]

        # the trainer verl's main would build (its constructor; init() needs the GPU resource pools)
        trainer_cls = get_trainer_cls(cfg.trainer.v1.trainer_mode)
        trainer = trainer_cls(config=cfg)
        assert trainer._enable_hybrid_replicas is False
        seen[strategy] += 1
        seen["mixed" if len(buckets) > 1 else "single"] += 1
        gpu_counts.add(plan.num_gpus)
    assert seen["megatron"] >= 5 and seen["fsdp"] >= 4 and seen["mixed"] >= 3 and seen["single"] >= 3, seen
    assert len(gpu_counts) >= 5, gpu_counts


def test_plans_verl_would_mangle_are_refused_with_one_line(tmp_path):
    bad = []
    plan, cluster, rl = _dp_plan(8, [(2, 4, math.inf)])
    # leftover rollout GPUs: verl's floor division would drop them
    idle = Plan(
        train=plan.train,
        rollout=RolloutConfig(num_gpus=9, time_s=1.0, instances=plan.rollout.instances),
        makespan_s=1.0,
    )
    big = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=24, gpus_per_node=8)
    bad.append((idle, big, rl, "megatron", "idle"))
    # TP/PP on FSDP
    tp_plan = Plan(train=TrainConfig(num_gpus=8, tp=2, pp=1, dp=4), rollout=plan.rollout, makespan_s=1.0)
    bad.append((tp_plan, cluster, rl, "fsdp", "data-parallel only"))
    # a batch that DP x micro-batch does not divide
    odd = Plan(train=TrainConfig(num_gpus=6, tp=1, pp=1, dp=6, micro_batch=4), rollout=plan.rollout, makespan_s=1.0)
    bad.append((odd, cluster, RLSettings(num_prompts=10, samples_per_prompt=4), "megatron", "divisible"))
    # a TP-8 replica on 4-GPU nodes
    small = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=24, gpus_per_node=4)
    wide = Plan(
        train=plan.train,
        rollout=RolloutConfig(num_gpus=8, time_s=1.0, instances=(InstanceGroup(tp=8, count=1, max_tokens=math.inf),)),
        makespan_s=1.0,
    )
    bad.append((wide, small, rl, "megatron", "does not fit a node"))
    # a rollout pool that cannot be nnodes x n_gpus_per_node with whole replicas per node: 3 x TP-2 on 4-GPU nodes
    three = Plan(
        train=TrainConfig(num_gpus=4, tp=1, pp=1, dp=4),
        rollout=RolloutConfig(num_gpus=6, time_s=1.0, instances=(InstanceGroup(tp=2, count=3, max_tokens=math.inf),)),
        makespan_s=1.0,
    )
    small12 = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=12, gpus_per_node=4)
    assert emit_verl_config(three, cluster=small12, rl=rl, model_path="m").buckets[0].layout.gpus_per_node == 2
    for p, c, r, strategy, words in bad:
        with pytest.raises(VerlConfigError) as err:
            emit_verl_config(p, cluster=c, rl=r, model_path="m", strategy=strategy)
        message = str(err.value)
        assert "\n" not in message and words in message, message


# characters Hydra's override grammar reads otherwise, or not at all, in a bare value: `,` (a sweep), `~`, brackets,
# quotes, `=`, `#`, `$` / `${` (an interpolation), backslashes, non-ASCII letters, spaces at the ends
ODD_CHARS = list("ab/.:-_ ,'\"\\$}{()[]=~#+äé01e\t@%*?|!<>;&")


def test_paths_with_characters_hydra_reads_otherwise_reach_verl_unchanged(hydra_dir, tmp_path):
    from verl.workers.rollout.router import _load_router_yaml

    plan, cluster, rl = _dp_plan(8, [(2, 4, math.inf)])
    out = tmp_path / "run, ~José's [cfg] ${x}"
    model_path = "~/models/Qwen3,v2 (ä)'s \\${HOME}\\"
    vc = emit_verl_config(plan, cluster=cluster, rl=rl, model_path=model_path, strategy="fsdp", config_dir=out)
    vc.write(out)
    cfg = compose(config_name=vc.config_name, overrides=(out / "overrides.txt").read_text().splitlines())
    rollout = cfg.actor_rollout_ref.rollout
    assert cfg.actor_rollout_ref.model.path == model_path
    assert rollout.router_config_path == str(out.resolve() / "libra_router.yaml")
    assert rollout.agent.agent_loop_config_path == str(out.resolve() / "libra_agent_loops.yaml")
    assert _load_router_yaml(rollout.router_config_path)["router_class"].endswith("LibraLoadBalancer")


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(ODD_CHARS), min_size=1, max_size=16))
def test_hydra_quoting_reads_back_every_string(text):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from libra.adapters.verl.config import _hydra_str

    override = OverridesParser.create().parse_override("a.b=" + _hydra_str(text))
    assert not override.is_sweep_override(), _hydra_str(text)
    value = OmegaConf.create({"a": {"b": override.value()}}).a.b  # interpolations resolved, as verl reads it
    assert value == text, _hydra_str(text)
