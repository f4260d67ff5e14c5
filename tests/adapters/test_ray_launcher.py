"""The Ray launcher on a local Ray cluster: placement groups per pool, actors in the right bundles and nodes, a
hybrid worker moved from rollout to training and back through the elastic controller."""

from __future__ import annotations

import os

import pytest

from libra.elastic import CancelJoin, ElasticController, JoinTraining, StartInstance, StopInstance
from libra.spec import Placement, Pool, Role, WorkerPlacement
from tests.limits import scaled

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(240))]

GPUS_PER_NODE = 4
PLACEMENT = Placement(
    workers=(
        WorkerPlacement(name="train-0", role=Role.TRAIN_REPLICA, tp=2, gpu_ids=(0, 1), pool=Pool.CORE_TRAIN),
        WorkerPlacement(name="train-1", role=Role.TRAIN_REPLICA, tp=2, gpu_ids=(2, 3), pool=Pool.CORE_TRAIN),
        WorkerPlacement(name="rollout-tp1-0", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(4,), pool=Pool.CORE_ROLLOUT),
        WorkerPlacement(name="rollout-tp1-1", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(5,), pool=Pool.CORE_ROLLOUT),
        WorkerPlacement(name="hybrid-0", role=Role.ROLLOUT_INSTANCE, tp=2, gpu_ids=(6, 7), pool=Pool.HYBRID),
    )
)


def _payload(info):
    return {"built_for": info.worker, "role": info.role.value}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    here = os.path.dirname(os.path.abspath(__file__))  # actors unpickle `_payload` from this module
    ray.init(
        num_cpus=2,
        resources={"libra_node_0": 1, "libra_node_1": 1},
        include_dashboard=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}},
    )
    yield
    ray.shutdown()


def test_launch_places_every_worker_in_its_pool_bundle_and_node(cluster):
    from libra.adapters.ray_launcher import RayLauncher

    launcher = RayLauncher(
        placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE, setup_rollout=_payload, setup_trainer=_payload
    )
    try:
        infos = launcher.launch()
        assert set(infos) == {w.name for w in PLACEMENT.workers}
        seen = launcher.describe()
        groups = {}
        for w in PLACEMENT.workers:
            got = seen[w.name]
            assert got["info"]["role"] == w.role and got["info"]["pool"] == w.pool
            node = w.gpu_ids[0] // GPUS_PER_NODE
            assert got["info"]["node"] == node
            # Ray reports the bundle's resources under names tagged with the bundle index and group id
            assigned = "".join(got["assigned"])
            assert f"libra_node_{node}" in assigned, got["assigned"]
            groups.setdefault(w.pool, set()).add(got["info"]["placement_group"])
            table = ray.util.placement_group_table()[got["info"]["placement_group"]]
            assert table["bundles"][got["info"]["bundle_index"]] == {f"libra_node_{node}": 0.001}
            assert ray.get(launcher.actors[w.name].call.remote("get", "built_for")) == w.name
        assert all(len(g) == 1 for g in groups.values()) and len({next(iter(g)) for g in groups.values()}) == 3
    finally:
        launcher.shutdown()


def test_plan_change_moves_hybrid_actor_between_rollout_and_training(cluster):
    from libra.adapters.ray_launcher import RayLauncher

    launcher = RayLauncher(
        placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE, setup_rollout=_payload, setup_trainer=_payload
    )
    controller = ElasticController(placement=PLACEMENT)
    try:
        launcher.launch()
        before = launcher.describe()["hybrid-0"]
        borrowed = Placement(
            workers=tuple(
                WorkerPlacement(name=w.name, role=Role.TRAIN_REPLICA, tp=w.tp, gpu_ids=w.gpu_ids, pool=w.pool)
                if w.name == "hybrid-0"
                else w
                for w in PLACEMENT.workers
            )
        )
        decisions = launcher.apply_plan(controller, borrowed, step=3, why="rollout finished early")
        assert [type(d) for d in decisions] == [StopInstance, JoinTraining]
        during = launcher.describe()["hybrid-0"]
        assert during["info"]["role"] == Role.TRAIN_REPLICA and during["pid"] != before["pid"]
        assert (during["info"]["placement_group"], during["info"]["bundle_index"]) == (
            before["info"]["placement_group"],
            before["info"]["bundle_index"],
        )  # same GPUs, new role
        assert ray.get(launcher.actors["hybrid-0"].call.remote("get", "role")) == "train_replica"
        decisions = launcher.apply_plan(controller, PLACEMENT, step=4, why="training done")
        # the join never reported progress (no trainer payload ran a side channel here): it is cancelled
        assert [type(d) for d in decisions] == [CancelJoin, StartInstance]
        after = launcher.describe()["hybrid-0"]
        assert after["info"]["role"] == Role.ROLLOUT_INSTANCE
        assert any("started train_replica hybrid-0" in line for line in launcher.log)
    finally:
        launcher.shutdown()


def test_dead_hybrid_replica_is_reported_and_removed_through_the_controller(cluster):
    from libra.adapters.ray_launcher import RayLauncher
    from libra.elastic import JoinEvent, JoinState

    launcher = RayLauncher(placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE)
    controller = ElasticController(placement=PLACEMENT)
    try:
        launcher.launch()
        for d in controller.borrow("hybrid-0", step=1, why="test"):
            launcher.execute(d)
        assert controller.pairs == {"hybrid-0": "train-0"}
        ray.kill(launcher.actors["hybrid-0"])  # the hybrid trainer replica dies
        dead = launcher.check_health(controller, step=2)
        assert [(e.replica, "train_replica" in e.cause) for e in dead] == [("hybrid-0", True)]
        assert "hybrid-0" not in launcher.actors and set(launcher.actors) == {w.name for w in PLACEMENT.workers} - {
            "hybrid-0"
        }
        assert controller.states.state("hybrid-0") == JoinState.FAILED and "hybrid-0" not in controller.pairs
        for d in controller.on_event("hybrid-0", JoinEvent.RECOVER, step=3, why="restarted"):
            launcher.execute(d)  # back to rollout in its own bundle
        assert launcher.infos["hybrid-0"].role == Role.ROLLOUT_INSTANCE
        assert launcher.check_health(controller, step=3) == ()
    finally:
        launcher.shutdown()
