#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the solvers (the training tree, the rollout DP, the global planner, the replan gate,
# the C-MLFQ decision rule) and of the other targets listed below (cost models, workloads, router, simulator,
# runtime), each against its fastest relevant tests (the oracle tests at a reduced instance count). Not part of
# scripts/test.sh: it takes tens of minutes (docs/testing.md has the numbers).
#
#   bash scripts/mutation.sh                 # every target
#   bash scripts/mutation.sh replan          # one file (train_tree, rollout_dp, planner, replan, rollout_cost, cmlfq,
#                                            # priced); workloads: the profile, a step's work, the resampling;
#                                            # router_parts: the default router's experts, budget, size classes, prior, shrinkage;
#                                            # router_core: the router, the baselines, route-eval's metrics;
#                                            # runtime_plan: the runtime's virtual cluster and its records;
#                                            # sim_policies: the simulator's policies and its stages (engine.py, borrow.py);
#                                            # sim_routing: a step's routes, the records and the report's summary;
#                                            # training_cost: the training cost model, the colocated switch, a job
#                                            # elastic_control: the elastic controller, its decisions, the state log
#                                            # elastic_bytes: the snapshot, its packing and the wire format
#                                            # elastic_core: the exchange of the core and the hybrid, the gradients
#                                            # cost_fit: calibrate() and the profile's fit
#                                            # importers: `libra trace import`'s readers of agent logs
#                                            # packing: whether a plan's units pack into nodes, the packed search;
#                                            # trace_values: Turn/Trajectory validation and the writer's checks;
#                                            # size_classes: the learnt size classes (their merge, `absorb`)
#   bash scripts/mutation.sh placement       # the placement solver's five files together
#   LIBRA_MUTATION_ONLY='*absorb*' bash scripts/mutation.sh size_classes   # only the mutants whose names match
#   LIBRA_MUTATION_SAMPLE=60 bash scripts/mutation.sh planner   # a seeded random sample of 60 of its mutants
#   LIBRA_MUTATION_RESUME=1 bash scripts/mutation.sh train_tree  # go on with a stopped run (SIGINT to mutmut run)
#
# Works in build/mutation (a copy of libra/ and tests/ with its own mutmut configuration); prints the kill rate
# and every surviving mutant's diff. LIBRA_ORACLE_INSTANCES (default 60) sizes the oracle tests; MUTMUT_CHILDREN
# (default 2) the parallel workers; LIBRA_MUTATION_SAMPLE=N tests a random sample of N mutants per file (seed
# LIBRA_MUTATION_SEED, default 0) instead of all of them, and the kill rate is then the sample's.
# LIBRA_MUTATION_ONLY='PATTERN ...' (fnmatch patterns on mutant names, e.g. '*_prefill_weights_s*') tests only the
# matching mutants (a sample, if asked for, is drawn among them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=$(command -v python3)
"$python" -c "import mutmut" 2>/dev/null || { echo "mutation.sh: mutmut is not installed (pip install mutmut)" >&2; exit 2; }

declare -A files=(
  [train_tree]=libra/planning/train_tree.py
  [rollout_dp]=libra/planning/rollout_dp.py
  [planner]=libra/planning/planner.py
  [replan]=libra/planning/replan.py
  [rollout_cost]=libra/planning/cost/rollout.py
  [workloads]="libra/workloads/profile.py libra/sim/workload.py libra/sim/manyturn.py"
  [router_parts]="libra/scheduling/experts.py libra/scheduling/budget.py libra/scheduling/size_classes.py libra/scheduling/probability.py libra/scheduling/shrinkage.py"
  [sim_policies]="libra/sim/policies.py libra/sim/engine.py libra/sim/borrow.py"
  [sim_routing]="libra/sim/routing.py libra/sim/records.py libra/sim/report.py"
  [training_cost]="libra/planning/cost/training.py libra/planning/cost/switch.py libra/sim/training.py"
  [runtime_plan]="libra/runtime/virtual.py libra/runtime/records.py"
  [elastic_control]="libra/elastic/controller.py libra/elastic/decisions.py libra/elastic/states.py"
  [elastic_bytes]="libra/elastic/snapshot.py libra/elastic/pack.py libra/elastic/wire.py"
  [elastic_core]="libra/elastic/core.py libra/elastic/hybrid.py libra/elastic/grads.py"
  [cost_fit]="libra/planning/cost/calibrate.py libra/planning/cost/profile_fit.py"
  [importers]="libra/workloads/importers/common.py libra/workloads/importers/openai_chat.py libra/workloads/importers/chat_messages.py libra/workloads/importers/swe_agents.py libra/workloads/importers/verl_rollouts.py libra/workloads/importers/dialects.py libra/workloads/importers/frameworks.py libra/workloads/importers/atif.py libra/workloads/importers/gemini_cli.py libra/workloads/importers/inspect_logs.py libra/workloads/importers/__init__.py"
  [router_core]="libra/scheduling/router.py libra/scheduling/baselines.py libra/scheduling/evaluate.py"
  [cmlfq]=libra/scheduling/cmlfq.py
  [priced]=libra/scheduling/priced.py
  [packing]=libra/planning/packing.py
  [trace_values]=libra/workloads/trace.py
  [size_classes]=libra/scheduling/size_classes.py
  [placement]="libra/planning/placement/model.py libra/planning/placement/patterns.py libra/planning/placement/assign.py libra/planning/placement/problem.py libra/planning/placement/place.py"
)
declare -A tests=(
  [train_tree]="tests/planning/test_train_tree.py tests/planning/test_train_tree_layouts.py tests/planning/test_mutation_train_tree.py"
  [rollout_dp]="tests/planning/test_rollout_and_planner.py tests/planning/test_rollout_bounds.py tests/planning/test_rollout_table.py tests/planning/test_mutation_rollout_dp.py tests/planning/test_chain_mutants.py tests/planning/test_chain_of_range.py tests/planning/test_paced_chain.py tests/planning/test_chain_hull.py"
  [planner]="tests/planning/test_rollout_and_planner.py tests/planning/test_planner_details.py tests/planning/test_mutation_planner.py tests/planning/test_packing_worked.py tests/planning/test_packing.py tests/planning/test_chain_mutants.py tests/planning/test_chain_of_range.py tests/planning/test_paced_chain.py tests/planning/test_chain_hull.py"
  [packing]="tests/planning/test_packing_worked.py tests/planning/test_packing.py"
  [trace_values]="tests/workloads/test_trace_checks_worked.py tests/workloads/test_trace_values.py tests/workloads/test_api_edges.py tests/workloads/test_trusted_turns.py"
  [size_classes]="tests/scheduling/test_tree.py tests/scheduling/test_router_parts.py tests/scheduling/test_size_classes_absorb.py"
  [replan]="tests/planning/test_replan.py tests/planning/test_rollout_and_planner.py"
  [rollout_cost]="tests/planning/test_cost.py tests/planning/test_cost_anchors.py tests/planning/test_cost_moe.py tests/planning/test_instance_time_shared.py tests/planning/test_tool_tail.py tests/sim/test_slice_native.py::test_the_kernel_prefill_and_decode_step_are_the_cost_models tests/sim/test_prefill_weight_share.py tests/planning/test_chain_mutants.py tests/planning/test_chain_of_range.py tests/planning/test_paced_chain.py tests/planning/test_chain_hull.py"  # not the golden plans: they fail on any change, right or wrong
  [workloads]="tests/sim/test_step_work_details.py tests/workloads/test_trace_loader.py tests/planning/test_tool_tail.py tests/sim/test_resampled.py tests/sim/test_many_turn.py tests/sim/test_real_steps.py tests/sim/test_step_arrays.py"
  [router_parts]="tests/scheduling/test_router_parts.py tests/scheduling/test_adaptive.py tests/scheduling/test_states.py tests/scheduling/test_router.py tests/scheduling/test_published_path.py tests/scheduling/test_step_end_history.py tests/scheduling/test_step_end_mutants.py"
  [sim_policies]="tests/sim/test_engine_stages.py tests/sim/test_simulator.py tests/sim/test_measured_replan.py tests/sim/test_idle_bounds.py tests/sim/test_fidelity.py tests/sim/test_measured_broadcast.py tests/sim/test_switch_mutants.py tests/sim/test_borrow_pays.py tests/sim/test_borrow_mutants.py"  # not the golden reports: they fail on any change, right or wrong
  [training_cost]="tests/planning/test_training_terms.py tests/planning/test_cost.py tests/planning/test_cost_moe.py tests/planning/test_cost_anchors.py tests/planning/test_switch.py tests/planning/test_cost_profile_fit.py tests/sim/test_engine_stages.py tests/sim/test_simulator.py"  # not the golden plans
  [sim_routing]="tests/sim/test_report_summary.py tests/sim/test_report_plots.py tests/sim/test_engine_stages.py tests/sim/test_simulator.py tests/sim/test_idle_bounds.py tests/sim/test_rollout.py tests/sim/test_replay_native.py tests/sim/test_step_arrays.py tests/sim/test_fidelity.py tests/cli/test_simulate_cli.py tests/sim/test_plan_vs_sim.py tests/sim/test_switch_mutants.py"
  [elastic_control]="tests/elastic/test_controller_worked.py tests/elastic/test_elastic_controller.py tests/elastic/test_elastic_states.py"
  [elastic_bytes]="tests/elastic/test_bytes_worked.py tests/elastic/test_elastic_pack.py tests/elastic/test_elastic_snapshot.py tests/elastic/test_elastic_wire.py"
  [elastic_core]="tests/elastic/test_exchange_worked.py tests/elastic/test_elastic_overlap.py tests/elastic/test_elastic_grace.py tests/elastic/test_elastic_model_parallel.py tests/elastic/test_elastic_multiproc_dist.py tests/elastic/test_elastic_wire.py"
  [cost_fit]="tests/planning/test_cost_fit_worked.py tests/planning/test_cost_profile_fit.py tests/planning/test_cost.py"
  [importers]="tests/workloads/test_import_worked.py tests/workloads/test_importers.py tests/workloads/test_import_frameworks.py tests/workloads/test_import_gemini_cli.py tests/workloads/test_import_atif.py tests/workloads/test_import_dialects.py tests/workloads/test_import_inspect.py tests/cli/test_trace_cli.py"
  [runtime_plan]="tests/runtime/test_virtual_details.py tests/runtime/test_virtual.py tests/runtime/test_records.py tests/runtime/test_config.py"
  [router_core]="tests/scheduling/test_replay_worked.py tests/scheduling/test_router.py tests/scheduling/test_route_decision.py tests/scheduling/test_router_copy.py tests/scheduling/test_evaluate.py tests/scheduling/test_adaptive.py tests/cli/test_route_eval_cli.py"
  [cmlfq]="tests/scheduling/test_router.py tests/scheduling/test_cmlfq_decisions.py tests/scheduling/test_golden.py"  # test_evaluate.py: 200 s per mutant
  [priced]="tests/scheduling/test_router.py tests/scheduling/test_cmlfq_decisions.py tests/scheduling/test_golden.py tests/scheduling/test_fast_paths.py tests/scheduling/test_priced_exits.py"
  [placement]="tests/planning/test_placement_errors.py tests/planning/test_placement_moves.py tests/planning/test_placement_oracle.py tests/planning/test_placement_properties.py tests/planning/test_mutation_placement.py"
)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(train_tree rollout_dp planner replan rollout_cost workloads router_parts router_core runtime_plan elastic_control elastic_bytes elastic_core cost_fit importers sim_policies sim_routing training_cost cmlfq priced placement packing trace_values size_classes)

total_killed=0
total_all=0
for target in "${targets[@]}"; do
  [ -n "${files[$target]:-}" ] || { echo "mutation.sh: unknown target $target" >&2; exit 2; }
  work=$root/build/mutation/$target
  if [ -n "${LIBRA_MUTATION_RESUME:-}" ] && [ -d "$work/mutants" ]; then
    # resume: keep the copy and mutmut's results (mutants/*.meta); only mutants without a verdict are run
    echo "== $target: resuming in $work" >&2
  else
    rm -rf "$work"
    mkdir -p "$work"
    cp -r "$root/libra" "$root/tests" "$root/examples" "$root/data" "$root/ext" "$work/"  # the coefficients and corpus tests read; ext: the C++ sources the elastic tests build
    find "$work" -name __pycache__ -prune -exec rm -rf {} +
    test_list=$(printf '"%s", ' ${tests[$target]})
    source_list=$(printf '"%s", ' ${files[$target]})
    cat >"$work/pyproject.toml" <<TOML
[tool.mutmut]
source_paths = [${source_list%, }]
pytest_add_cli_args_test_selection = [${test_list%, }]
also_copy = ["libra", "tests", "examples", "data", "ext"]
pytest_add_cli_args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark"]

[tool.pytest.ini_options]
pythonpath = ["."]
filterwarnings = ["ignore::DeprecationWarning"]
markers = ["slow: slow", "multiproc: multiproc"]
TOML
  fi
  echo "== $target: mutating ${files[$target]} against ${tests[$target]}" >&2
  (
    cd "$work"
    # OMP_NUM_THREADS=1: mutmut forks a child per mutant from a parent that ran the tests once; a child of a parent
    # whose OpenMP pool (torch) had started hangs in its first parallel op (the elastic targets timed out, not failed)
    export LIBRA_ORACLE_INSTANCES=${LIBRA_ORACLE_INSTANCES:-60} PYTHONPATH=$work OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    names=()
    if [ -n "${LIBRA_MUTATION_SAMPLE:-}" ] || [ -n "${LIBRA_MUTATION_ONLY:-}" ]; then
      # generate the mutants and collect the test statistics (the filter matches nothing, so nothing runs yet)
      "$python" -m mutmut run --max-children 1 "no-such-mutant" >"$work/generate.log" 2>&1 || true
      # one sample over the mutants of every file of the target (a one-file target samples as before)
      # (narrowed first to the names LIBRA_MUTATION_ONLY's fnmatch patterns match)
      mapfile -t names < <(LIBRA_MUTATION_ONLY="${LIBRA_MUTATION_ONLY:-}" "$python" - "${LIBRA_MUTATION_SAMPLE:-0}" "${LIBRA_MUTATION_SEED:-0}" ${files[$target]} <<'PY'
import fnmatch, json, os, random, sys
keys = sorted(k for path in sys.argv[3:] for k in json.load(open(f"mutants/{path}.meta"))["exit_code_by_key"])
patterns = os.environ["LIBRA_MUTATION_ONLY"].split()
keys = [k for k in keys if not patterns or any(fnmatch.fnmatch(k, p) for p in patterns)]
n = int(sys.argv[1]) or len(keys)
for name in sorted(random.Random(int(sys.argv[2])).sample(keys, min(n, len(keys)))):
    print(name)
PY
      )
      [ ${#names[@]} -gt 0 ] || { echo "mutation.sh: no mutant of $target matches '${LIBRA_MUTATION_ONLY:-}'" >&2; exit 2; }
      echo "   sample: ${#names[@]} mutants (seed ${LIBRA_MUTATION_SEED:-0}; only '${LIBRA_MUTATION_ONLY:-*}')" >&2
    fi
    "$python" -m mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "${names[@]}" >>"$work/run.log" 2>&1 || true
    "$python" -m mutmut results --all true >"$work/results.txt" 2>&1 || "$python" -m mutmut results >"$work/results.txt" 2>&1
    { grep -E ': (survived|no tests|timeout|suspicious)' "$work/results.txt" || true; } | awk -F: '{print $1}' | while read -r name; do
      echo "--- $name"
      "$python" -m mutmut show "$name" 2>/dev/null || true
    done >"$work/survivors.txt"
  )
  killed=$(grep -c ': killed' "$work/results.txt" || true)
  all=$(grep -cE ': (killed|survived|no tests|timeout|suspicious|segfault|skipped|caught by type check)' "$work/results.txt" || true)
  generated=$(grep -c '__mutmut_' "$work/results.txt" || true)
  echo "$target: $killed of $all mutants killed ($generated generated); survivors in $work/survivors.txt"
  total_killed=$((total_killed + killed))
  total_all=$((total_all + all))
done
echo "total: $total_killed of $total_all mutants killed"
