"""`LibraSeparateAsyncTrainer._setup` past what a CPU machine can build: verl's own setup, the per-bucket server
managers and the checkpoint engine are stand-ins (they need GPUs); what is checked is Libra's part of it."""

from __future__ import annotations

from types import SimpleNamespace

from omegaconf import OmegaConf
from verl.workers.rollout import utils as rollout_utils

from libra.adapters.verl import trainer as trainer_mod


def test_prometheus_is_told_of_every_bucket_s_servers_and_the_hybrid_ones(monkeypatch) -> None:
    """Each bucket's server manager writes Prometheus's targets with its own servers only (the last bucket won);
    verl's `separate_async` writes them once more with all of them, and so must the per-bucket trainer."""
    written = []
    monkeypatch.setattr(rollout_utils, "update_prometheus_config", lambda cfg, addrs, name: written.append(addrs))
    monkeypatch.setattr(trainer_mod.PPOTrainer, "_setup", lambda self: None)
    monkeypatch.setattr(trainer_mod, "omega_conf_to_dataclass", lambda cfg: cfg)
    monkeypatch.setattr(trainer_mod, "CheckpointEngineManager", lambda **kw: SimpleNamespace(**kw))
    combined = SimpleNamespace(server_addresses=["b0:1", "b1:1", "b1:2"], get_replicas=lambda: [])

    async def build(config, *, start_rank):
        return [SimpleNamespace(), SimpleNamespace()], combined

    monkeypatch.setattr(trainer_mod, "build_bucket_managers", build)
    t = object.__new__(trainer_mod.LibraSeparateAsyncTrainer)
    t.config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "vllm", "prometheus": {"enable": True}, "checkpoint_engine": {}}}}
    )
    t.llm_server_manager = SimpleNamespace(rollout_replicas=["h"], server_addresses=["h:1"])
    t.actor_rollout_wg = None
    t._enable_hybrid_replicas = False
    t._setup()
    assert written == [["h:1", "b0:1", "b1:1", "b1:2"]]
    assert t.standalone_server_manager is combined
