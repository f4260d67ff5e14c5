"""The Ray launcher on a local Ray cluster: placement groups per pool, actors in the right bundles and nodes, a
hybrid worker moved from rollout to training and back through the elastic controller."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import attrs
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
    # Ray's own node start has fixed limits (30 s for the raylet to register; a wait for the metrics agent's port
    # file) that a heavily loaded machine can miss (seen at load average 30 on 2 cores): a failed start is retried.
    for attempt in range(3):
        try:
            ray.init(
                num_cpus=2,
                resources={"libra_node_0": 1, "libra_node_1": 1},
                include_dashboard=False,
                _temp_dir=str(tmp_path_factory.mktemp("ray")),
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}},
            )
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
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


class _Worker:
    """A payload whose `busy(seconds)` keeps the actor's only thread on the CPU, as a long engine call would."""

    def __init__(self, info):
        self.info = info

    def busy(self, seconds: float) -> int:
        import time

        end, spins = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            spins += 1
        return spins


def _worker(info):
    return _Worker(info)


@contextlib.contextmanager
def _cpu_hogs(n: int):
    """`n` busy-loop processes beside the test (a loaded machine), killed on the way out."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_dead_hybrid_replica_is_reported_and_removed_through_the_controller(cluster):
    """A killed hybrid trainer is reported dead (and removed through the controller); a rollout actor that is
    alive but too busy to answer several heartbeats, on a machine loaded by CPU hogs, is not."""
    from libra.adapters.ray_launcher import HealthPolicy, RayLauncher
    from libra.elastic import JoinEvent, JoinState

    policy = HealthPolicy(reply_timeout_s=scaled(1.0), max_missed=6)
    launcher = RayLauncher(placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE, setup_rollout=_worker, health=policy)
    controller = ElasticController(placement=PLACEMENT)
    try:
        launcher.launch()
        for d in controller.borrow("hybrid-0", step=1, why="test"):
            launcher.execute(d)
        assert controller.pairs == {"hybrid-0": "train-0"}
        assert launcher.check_health(controller, step=1) == ()
        with _cpu_hogs(2):
            # busy for 2.5 heartbeat timeouts: it misses 2 or 3 heartbeats, then answers again
            slow = launcher.actors["rollout-tp1-0"].call.remote("busy", 2.5 * policy.reply_timeout_s)
            ray.kill(launcher.actors["hybrid-0"])  # the hybrid trainer replica dies
            dead, most_missed = [], 0
            for _ in range(2 * policy.max_missed):
                dead += launcher.check_health(controller, step=2)
                most_missed = max(most_missed, launcher.missed.get("rollout-tp1-0", 0))
                if dead and ray.wait([slow], timeout=0)[0] and launcher.missed.get("rollout-tp1-0") == 0:
                    break
        assert ray.get(slow) > 0
        assert most_missed >= 1, "the busy actor never missed a heartbeat: the test did not exercise the grace"
        assert [(e.replica, "train_replica" in e.cause) for e in dead] == [("hybrid-0", True)], dead
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


def test_a_worker_that_never_answers_is_dead_after_max_missed_heartbeats(cluster):
    """Grace is bounded: an actor stuck in a call is declared dead after exactly `max_missed` silent heartbeats
    (and fenced: the launcher kills it)."""
    from libra.adapters.ray_launcher import HealthPolicy, RayLauncher

    policy = HealthPolicy(reply_timeout_s=scaled(2.0), max_missed=3)
    launcher = RayLauncher(placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE, setup_rollout=_worker, health=policy)
    try:
        launcher.launch()
        stuck = launcher.actors["rollout-tp1-1"]
        hung = stuck.call.remote("busy", 3600.0)
        rounds = [launcher.check_health(step=s) for s in range(policy.max_missed)]
        assert [[d.replica for d in r] for r in rounds] == [[]] * (policy.max_missed - 1) + [["rollout-tp1-1"]]
        (death,) = rounds[-1]
        assert death.replica == "rollout-tp1-1" and "3 consecutive heartbeats missed" in death.cause
        assert "rollout-tp1-1" not in launcher.actors
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(hung, timeout=scaled(60))  # fenced: the stuck actor was killed
    finally:
        launcher.shutdown()


def test_health_policy_refuses_nonsense() -> None:
    from libra.adapters import UnsupportedConfig
    from libra.adapters.ray_launcher import HealthPolicy

    for bad in ({"reply_timeout_s": 0}, {"reply_timeout_s": float("nan")}, {"max_missed": 0}, {"max_missed": 1.5}):
        with pytest.raises(UnsupportedConfig):
            HealthPolicy(**bad)


def _failing(info):
    raise ValueError(f"no engine for {info.worker}\nsecond line of the cause")


def _pending_groups() -> set[str]:
    return {pg_id for pg_id, row in ray.util.placement_group_table().items() if row["state"] == "PENDING"}


def test_a_pool_no_node_can_hold_is_refused_in_one_line_and_two_launchers_share_a_cluster(cluster):
    """A worker on a node the cluster does not have: one line naming the worker and the resource, and no
    placement group left pending (it used to wait on, under the name the next launcher's first group takes)."""
    from libra.adapters.ray_launcher import PlacementUnavailable, RayLauncher

    far = WorkerPlacement(name="rollout-far", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(28,), pool=Pool.CORE_ROLLOUT)
    before = _pending_groups()
    lost = RayLauncher(placement=Placement(workers=(far,)), gpus_per_node=GPUS_PER_NODE, ready_timeout_s=1.0)
    with pytest.raises(PlacementUnavailable, match=r"rollout-far: \{'libra_node_7': 0.001\}") as exc:
        lost.launch()
    assert "\n" not in str(exc.value)
    assert _pending_groups() == before
    first = RayLauncher(placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE, setup_rollout=_payload)
    other = Placement(workers=(attrs.evolve(PLACEMENT.workers[0], name="train-other"),))
    second = RayLauncher(placement=other, gpus_per_node=GPUS_PER_NODE)
    try:
        assert set(first.launch()) == {w.name for w in PLACEMENT.workers}
        assert set(second.launch()) == {"train-other"}  # its first group used to take the name of first's
    finally:
        first.shutdown()
        second.shutdown()
        lost.shutdown()


def test_a_failing_payload_setup_is_one_line_and_the_worker_can_start_again(cluster):
    from libra.adapters import AdapterError
    from libra.adapters.errors import WorkerNotFound
    from libra.adapters.ray_launcher import RayLauncher

    launcher = RayLauncher(placement=PLACEMENT, gpus_per_node=GPUS_PER_NODE, setup_rollout=_failing)
    start = StartInstance(worker="rollout-tp1-0", tp=1, gpu_ids=(4,), step=0, why="test")
    try:
        with pytest.raises(AdapterError) as exc:
            launcher.execute(start)
        assert str(exc.value) == (
            "setup of rollout_instance 'rollout-tp1-0' failed in its actor: ValueError: no engine for rollout-tp1-0"
        )
        assert "rollout-tp1-0" not in launcher.actors
        launcher.setup[Role.ROLLOUT_INSTANCE] = _payload
        launcher.execute(start)
        assert ray.get(launcher.actors["rollout-tp1-0"].call.remote("get", "built_for")) == "rollout-tp1-0"
        with pytest.raises(WorkerNotFound) as missing:
            launcher.execute(attrs.evolve(start, worker="rollout-nowhere"))
        assert str(missing.value).startswith("worker 'rollout-nowhere' is not in the placement; it holds [")
    finally:
        launcher.shutdown()


def test_a_ray_rollout_backend_refuses_to_start_an_instance_after_shutdown(cluster):
    from libra.adapters import AdapterError
    from libra.adapters.ray_rollout import RayRolloutBackend
    from libra.adapters.types import InstanceSpec

    backend = RayRolloutBackend(model="unused", address="local", host=_payload)  # joins the running Ray
    backend.shutdown()
    backend.shutdown()  # twice: nothing left to stop
    with pytest.raises(AdapterError, match=r"cannot start instance 'late': this RayRolloutBackend was shut down"):
        backend.start_instance(InstanceSpec(name="late"))
    assert ray.is_initialized() and not backend.launcher.actors


def test_a_launcher_without_ray_refuses_instead_of_starting_a_bare_local_ray():
    """Without `ray.init`, a Ray call starts a local Ray that offers no `libra_node_<k>`; the placement group then
    waited out `ready_timeout_s` for a resource nobody offers."""
    code = (
        "from libra.adapters.ray_launcher import RayLauncher\n"
        "from tests.adapters.test_ray_launcher import PLACEMENT\n"
        "try:\n"
        "    RayLauncher(placement=PLACEMENT, gpus_per_node=4, ready_timeout_s=5).launch()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "import ray; print('ray started:', ray.is_initialized())\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=scaled(120))
    assert out.stdout.splitlines() == [
        "AdapterError cannot place worker 'train-0': Ray is not initialised (ray.init first, or shut down)",
        "ray started: False",
    ], out.stdout + out.stderr[-2000:]


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"grace_s": 0}, r"grace_s must be a finite number of seconds > 0, got 0"),
        ({"start_timeout_s": float("nan")}, r"start_timeout_s must be a finite number of seconds > 0, got nan"),
        ({"poll_wait_s": -1}, r"poll_wait_s must be a finite number >= 0, got -1"),
        ({"nodes": 0}, r"nodes must be a whole number >= 1, got 0"),
    ],
)
def test_a_ray_rollout_backend_refuses_options_that_would_kill_or_stall_every_instance(cluster, option, match):
    from libra.adapters import UnsupportedConfig
    from libra.adapters.ray_rollout import RayRolloutBackend

    with pytest.raises(UnsupportedConfig, match=match):
        RayRolloutBackend(model="unused", address="local", host=_payload, **option)
