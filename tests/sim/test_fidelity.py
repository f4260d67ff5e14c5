"""The time-slice approximation and the elastic pool, checked against finer runs and against the pool switched off."""

import attrs
import pytest
from conftest import small_scenario

from libra.sim import ReconfigCosts, simulate
from libra.sim.routing import CausalRouting
from libra.spec import SpecError, parse_buckets


def test_default_slices_are_close_to_ten_times_finer():
    """The default 300 slices per rollout against 3,000 (measured here: about 2 % slower; docs/sim.md)."""
    names = ["static-uniform", "libra-cmlfq"]
    coarse = simulate(small_scenario(slices=300, prompts=32, samples=16), num_steps=2, policies=names).summary()
    fine = simulate(small_scenario(slices=3000, prompts=32, samples=16), num_steps=2, policies=names).summary()
    for n in names:
        assert coarse[n]["throughput_tok_s"] == pytest.approx(fine[n]["throughput_tok_s"], rel=0.04)
        assert coarse[n]["throughput_tok_s"] <= fine[n]["throughput_tok_s"] * 1.005  # coarse slices only lose time


def test_elastic_pool_only_lends_and_borrows_when_on():
    sc = small_scenario(gpus=32, prompts=32)
    report = simulate(sc, num_steps=4, policies=["libra-cmlfq", "libra"]).summary()
    assert report["libra-cmlfq"]["lent_gpu_s"] == 0 and report["libra-cmlfq"]["borrowed_gpu_s"] == 0
    # free switches: the pool can only help (the same plans, the same routes, idle GPUs put to work)
    free = attrs.evolve(sc, costs=ReconfigCosts(to_rollout_s=0.0, snapshot_s=0.0, restore_s=0.0, channel_setup_s=0.0))
    both = simulate(free, num_steps=4, policies=["libra-cmlfq", "libra"]).summary()
    assert both["libra"]["lent_gpu_s"] + both["libra"]["borrowed_gpu_s"] > 0
    assert both["libra"]["wall_s"] <= both["libra-cmlfq"]["wall_s"] * 1.001


def test_causal_routing_never_reads_the_future():
    sc = small_scenario()
    routing = CausalRouting()
    w0, w1 = sc.source.step(0), sc.source.step(1)
    buckets = parse_buckets("1:2000,2:8000,4:inf")
    routing.routes(w0, buckets)
    routing.learn(w0)
    with pytest.raises(SpecError, match="future"):
        routing.routes(w0, buckets)
    with pytest.raises(SpecError, match="already learned"):
        routing.learn(w0)
    r1 = routing.routes(w1, buckets)
    assert r1.bucket.min() >= 0 and r1.bucket.max() < len(buckets)
