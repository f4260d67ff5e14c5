"""`libra_separate_async`: verl 0.9.1's `separate_async` trainer with one rollout server manager per Libra bucket.

verl gives a rollout pool one TP degree (`LLMServerManager` starts `n_gpus // tp` replicas of it). A Libra plan may
mix degrees (e.g. 4 x TP-1 for short requests, 3 x TP-4 for long ones), so this trainer starts one manager per
bucket, each from a copy of the rollout config with that bucket's TP, node layout and `custom.libra.bucket` index
(the servers report it through `get_rollout_config()`), and puts one `LibraLoadBalancer` over all their servers,
the pattern verl uses for several teacher models. Everything else (checkpoint engine over all replicas, weight
sync, the fully-async client) is verl's. At each step end the balancer's router learns from the step's finished
trajectories (`end_step`).

Imports verl: load it only where verl is installed (the `verl.plugins` entry point does, on `import verl`).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import ray
from omegaconf import DictConfig, open_dict
from verl.checkpoint_engine import CheckpointEngineManager
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode, PPOTrainerSeparateAsync
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerManager

from libra.adapters.verl.config import TRAINER_MIXED_TP, VerlConfigError

logger = logging.getLogger(__name__)


def libra_buckets(config: DictConfig) -> list[dict[str, Any]]:
    """The buckets `libra plan --emit verl` wrote under `actor_rollout_ref.rollout.custom.libra.buckets`."""
    custom = config.actor_rollout_ref.rollout.get("custom") or {}
    buckets = (custom.get("libra") or {}).get("buckets")
    if not buckets:
        raise VerlConfigError(
            f"trainer mode {TRAINER_MIXED_TP} needs actor_rollout_ref.rollout.custom.libra.buckets "
            "(write the overrides with `libra plan --emit verl`)"
        )
    return [dict(b) for b in buckets]


def bucket_config(config: DictConfig, bucket: dict[str, Any]) -> DictConfig:
    """A copy of the trainer config whose rollout section describes one bucket: its TP, its `nnodes x
    n_gpus_per_node` and `custom.libra.bucket` (how its servers tell the balancer which bucket they serve)."""
    cfg = copy.deepcopy(config)
    with open_dict(cfg):
        r = cfg.actor_rollout_ref.rollout
        r.tensor_model_parallel_size = int(bucket["tp"])
        r.nnodes = int(bucket["nnodes"])
        r.n_gpus_per_node = int(bucket["n_gpus_per_node"])
        if r.get("custom") is None:
            r.custom = {}
        libra = dict(r.custom.get("libra") or {})
        libra["bucket"] = int(bucket["index"])
        r.custom.libra = libra
    replicas = r.nnodes * r.n_gpus_per_node // r.tensor_model_parallel_size
    if replicas != int(bucket["replicas"]):
        raise VerlConfigError(
            f"bucket {bucket['index']}: verl would start {replicas} replicas, the plan {bucket['replicas']}"
        )
    return cfg


async def build_bucket_managers(
    config: DictConfig, *, start_rank: int = 0, manager_cls: type = LLMServerManager
) -> tuple[list, LLMServerManager]:
    """One `LLMServerManager` per bucket (replica ranks consecutive from `start_rank`), and one manager over all
    their replicas whose load balancer (from `rollout.router_config_path`) routes across every bucket."""
    managers = []
    rank = start_rank
    for bucket in libra_buckets(config):
        manager = manager_cls(config=bucket_config(config, bucket), start_rank=rank)
        await manager._initialize_llm_servers()
        rank += len(manager.rollout_replicas)
        managers.append(manager)
    combined = manager_cls(config=config, start_rank=start_rank)
    combined.rollout_replicas = [r for m in managers for r in m.rollout_replicas]
    combined.server_handles = [h for m in managers for h in m.server_handles]
    combined.server_addresses = [a for m in managers for a in m.server_addresses]
    await combined._init_global_load_balancer()
    return managers, combined


@register_trainer(TRAINER_MIXED_TP)
class LibraSeparateAsyncTrainer(PPOTrainerSeparateAsync):
    """`separate_async` whose standalone rollout is one server manager per Libra bucket behind one balancer."""

    def __init__(self, config: DictConfig) -> None:
        libra_buckets(config)  # refuse early, with one line, a config that lacks them
        super().__init__(config)

    def _setup(self) -> None:
        # PPOTrainerSeparateAsync._setup, with the one-TP standalone manager replaced by the per-bucket ones
        PPOTrainer._setup(self)
        hybrid_num_replicas = len(self.llm_server_manager.rollout_replicas)
        from verl.utils.ray_utils import auto_await

        @auto_await
        async def build():
            return await build_bucket_managers(self.config, start_rank=hybrid_num_replicas)

        self.bucket_server_managers, self.standalone_server_manager = build()
        rollout_config = self.config.actor_rollout_ref.rollout
        if rollout_config.prometheus.enable:  # every bucket's manager wrote only its own servers: all of them, last
            from verl.workers.rollout.utils import update_prometheus_config

            addresses = self.llm_server_manager.server_addresses + self.standalone_server_manager.server_addresses
            update_prometheus_config(rollout_config.prometheus, addresses, rollout_config.name)
        checkpoint_engine_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.rollout.checkpoint_engine)
        self.standalone_checkpoint_manager = CheckpointEngineManager(
            config=checkpoint_engine_config,
            actor_wg=self.actor_rollout_wg,
            replicas=self.standalone_server_manager.get_replicas(),
        )
        if self._enable_hybrid_replicas:
            self.current_mode = HybridEngineMode.ROLLOUT
            self.add_replicas_to_balancer()
        else:
            self.current_mode = HybridEngineMode.TRAINER

    def on_step_end(self) -> None:
        super().on_step_end()
        balancer = self.standalone_server_manager.global_load_balancer
        if hasattr(balancer, "end_step"):
            counts = ray.get(balancer.end_step.remote())
            logger.info("[libra] router step end: %s", counts)
