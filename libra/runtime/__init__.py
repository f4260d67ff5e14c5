"""The runtime: a real agentic RL job driven end to end by Libra's decisions (`libra run`).

`Orchestrator(config, out_dir).run()` overlaps rollout and training within `max_staleness`, routes every request
through the router, replans after each step and carries placement changes out on the engines through the elastic
controller, pushes weights after each optimizer step, and records every decision (`run.jsonl`, `trace.jsonl`,
`timeline.png`). The layer sits between `adapters` and `cli`; importing it loads no engine (they load on `run`).
"""

from libra.runtime.config import RunConfig, RunConfigError, config_from_dict, load_config

__all__ = [
    "Orchestrator",
    "RunConfig",
    "RunConfigError",
    "RunSummary",
    "config_from_dict",
    "load_config",
    "make_backend",
]


def __getattr__(name: str):
    if name in ("Orchestrator", "RunSummary"):
        from libra.runtime import orchestrator

        return getattr(orchestrator, name)
    if name == "make_backend":
        from libra.runtime.backend import make_backend

        return make_backend
    raise AttributeError(name)
