"""The planner's predicted rollout time against the simulator's, for the planner's own step-0 plans.

    python examples/plan_vs_sim.py                     # the three workloads, 48 x A800, Qwen3-14B, 512 x 16
    python examples/plan_vs_sim.py --workloads r2e-gym --coeffs examples/coeffs/fast_tp.yaml
    python examples/plan_vs_sim.py --corpus            # every real source of data/corpus (and held-out/)
    python examples/plan_vs_sim.py --trace a.jsonl --prompts 2048   # a step of 2,048 prompt groups drawn from it
    python examples/plan_vs_sim.py --corpus --seed 1   # another draw of each step (resampling, tool latencies)
    python examples/plan_vs_sim.py --steal off         # idle instances take nothing from busy ones' queues

For each workload: plan on step 0's profile under each routing model (`start-small`, the default, and
`final-length`, perfect routing), then run step 0 alone through the simulator's timed rollout on the plan's
instances under the routing the plan assumes (`start-small`: overflow routing, start in the smallest bucket and move
up when the context outgrows it; `final-length`: `final` routing, each request on the bucket of its final context
from the start, nothing moves), and the same for colocated's 24 x TP-2. A `final-length` plan is also run under
overflow routing (the row `final-length, overflow routing`): what the plan does when routing is not perfect.
docs/sim.md (item 3 of "Why the simulated picture differs") has the table this prints; `tests/sim/test_fidelity.py`
checks that the default plans agree within 15 %, `tests/sim/test_final_routing.py` the final-length plans under
`final` routing. With `--trace` or `--corpus` the step is drawn from a trace instead (`WorkSource.resampled`:
`--prompts` prompt groups, default the trace's own count; docs/sim.md, "The planner against the simulator on real
agents").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs
from tqdm import tqdm

from libra.planning import GlobalPlanner, PlannerOptions
from libra.planning.cost import CostCoefficients, load_coefficients
from libra.sim.engine import SimOptions, profile_of, rollout_slice_s
from libra.sim.rollout import STEAL_MODES, Instances, RolloutRun
from libra.sim.routing import routes_for
from libra.sim.workload import StepWork, WorkSource, trace_name
from libra.spec import Bucket, ClusterSpec, InstanceGroup, RLSettings, SpecError, get_gpu, get_model
from libra.workloads.corpus import DEFAULT_CORPUS, load_manifest
from libra.workloads.trace import TraceError

# the simulator's routing mode (`libra.sim.routing`) that each of the planner's routing models assumes
SIM_ROUTING = {"start-small": "overflow", "final-length": "final"}
IMPERFECT = ", overflow routing"  # the row of a final-length plan run under overflow routing


@attrs.frozen(kw_only=True)
class Agreement:
    workload: str
    routing: str  # the planner's routing model (`IMPERFECT` added when run under overflow routing), or "colocated"
    instances: tuple[InstanceGroup, ...]
    predicted_s: float
    simulated_s: float

    @property
    def error(self) -> float:
        return self.simulated_s / self.predicted_s - 1.0

    @property
    def layout(self) -> str:
        return " + ".join(f"{g.count} x TP-{g.tp}" for g in self.instances)


def simulated_rollout(
    planner: GlobalPlanner,
    work: StepWork,
    groups: tuple[InstanceGroup, ...],
    *,
    routing: str = "overflow",
    steal: str = "all",
) -> float:
    """Seconds the timed rollout takes to serve `work` on `groups` from time 0, requests routed by the simulator's
    `routing` mode (`overflow` or `final`; one bucket: `single`), idle instances stealing as `steal` says (the
    simulator's `SimOptions.steal`). The time slice is the simulator's own (`SimOptions`' defaults: the step's
    rollout floor from its work alone over 300, within the minimum and maximum slice), not one from the
    prediction: the simulated time moves by a few per cent with the slice (docs/sim.md), and a check must not move
    with what it checks."""
    buckets = tuple(Bucket(tp=g.tp, max_tokens=g.max_tokens) for g in groups)
    routes = routes_for("single" if len(buckets) == 1 else routing, work, buckets, None)
    tps = [g.tp for g in groups for _ in range(g.count)]
    home = [b for b, g in enumerate(groups) for _ in range(g.count)]
    inst, options = Instances(tps, home, [0.0] * len(tps)), SimOptions()
    run = RolloutRun(
        planner.cost_model,
        work,
        routes,
        inst,
        start=0.0,
        min_slice_s=rollout_slice_s(planner.cost_model, work, inst, options),
        max_slice_s=options.max_slice_s,
        steal=steal,
    )
    run.run_to_end()
    return run.end_time


def agreements(
    workload: str,
    *,
    gpus: int = 48,
    prompts: int | None = 512,
    samples: int = 16,
    coeffs: CostCoefficients | None = None,
    routings: tuple[str, ...] = ("start-small", "final-length"),
    colocated_tp: int = 2,
    trace: str | Path | None = None,
    seed: int = 0,
    steal: str = "all",
) -> list[Agreement]:
    """`workload` names a synthetic workload, or with `trace` the trace's rows; `prompts` None with a trace: as many
    prompt groups as its first step. `seed` draws the step (the generator's, or the trace's resampling and the
    tool latencies it does not record). `steal`: what an idle instance takes from busy ones' queues (`all`, the
    simulator's default; `off` keeps every request on the instances its routing gives it, as the planner's
    `final-length` model assumes)."""
    cluster = ClusterSpec.from_total(gpu=get_gpu("A800-80GB"), num_gpus=gpus, gpus_per_node=8)
    model = get_model("Qwen3-14B")
    if trace is not None:
        work = WorkSource.resampled(trace, num_steps=1, num_prompts=prompts, seed=seed).step(0)
        rl = RLSettings(num_prompts=work.num_requests, samples_per_prompt=1)
    else:
        prompts = 512 if prompts is None else prompts
        rl = RLSettings(num_prompts=prompts, samples_per_prompt=samples)
        work = WorkSource.from_generator(
            workload, seed=seed, num_prompts=prompts, samples_per_prompt=samples, max_model_len=rl.max_model_len
        ).step(0)
    profile = profile_of([work], workload, rl.global_batch)
    out = []
    for routing in routings:
        planner = GlobalPlanner(
            cluster=cluster, model=model, rl=rl, coeffs=coeffs, options=PlannerOptions(routing=routing)
        )
        plan = planner.plan(profile)
        groups = plan.rollout.instances
        own = SIM_ROUTING[routing]
        for mode in (own, "overflow") if own != "overflow" else (own,):
            out.append(
                Agreement(
                    workload=workload,
                    routing=routing if mode == own else routing + IMPERFECT,
                    instances=groups,
                    predicted_s=plan.rollout.time_s,
                    simulated_s=simulated_rollout(planner, work, groups, routing=mode, steal=steal),
                )
            )
    planner = GlobalPlanner(cluster=cluster, model=model, rl=rl, coeffs=coeffs)
    groups = (InstanceGroup(tp=colocated_tp, count=gpus // colocated_tp, max_tokens=float("inf")),)
    predicted = planner.rollout_time(groups, profile)
    out.append(
        Agreement(
            workload=workload,
            routing="colocated",
            instances=groups,
            predicted_s=predicted,
            simulated_s=simulated_rollout(planner, work, groups, steal=steal),
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="r2e-gym,search-r1,dapo-math", help="comma-separated workload names")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default 512; a trace's own count)")
    p.add_argument("--coeffs", metavar="FILE", help="YAML/JSON file of cost-model coefficients")
    p.add_argument("--seed", type=int, default=0, help="the draw of each step (default 0, the docs' tables)")
    p.add_argument(
        "--steal",
        default="all",
        choices=STEAL_MODES,
        help="what an idle instance takes from busy ones' queues (the simulator's --steal; default all)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", nargs="+", metavar="FILE", help="draw the step from these traces instead")
    src.add_argument("--corpus", action="store_true", help="every source of data/corpus and data/corpus/held-out")
    args = p.parse_args(argv)
    try:
        coeffs = load_coefficients(args.coeffs) if args.coeffs else None
        if args.corpus:
            roots = (DEFAULT_CORPUS, DEFAULT_CORPUS / "held-out")
            args.trace = [root / src["file"] for root in roots for src in load_manifest(root)["sources"]]
        if args.trace:
            rows = []
            for path in tqdm(args.trace, desc="traces", leave=False):
                rows += agreements(
                    trace_name(path), prompts=args.prompts, coeffs=coeffs, trace=path, seed=args.seed, steal=args.steal
                )
        else:
            prompts = 512 if args.prompts is None else args.prompts
            rows = [
                a
                for w in args.workloads.split(",")
                for a in agreements(w, prompts=prompts, coeffs=coeffs, seed=args.seed, steal=args.steal)
            ]
    except (SpecError, TraceError) as exc:
        print(f"plan_vs_sim: error: {exc}", file=sys.stderr)
        return 2
    print("| workload | routing model | rollout instances | predicted s | simulated s | simulated / predicted |")
    print("|---|---|---|---:|---:|---:|")
    for a in rows:
        print(
            f"| {a.workload} | {a.routing} | {a.layout} | {a.predicted_s:,.0f} | {a.simulated_s:,.0f} | "
            f"{100 * a.error:+.0f} % |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
