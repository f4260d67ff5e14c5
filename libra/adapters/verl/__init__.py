"""verl 0.9.1 integration (the `verl` extra; verl lives in its own environment, see docs/verl.md).

Pure modules (import anywhere, no verl):
- `libra.adapters.verl.config`   — `emit_verl_config(plan, ...)`: Hydra overrides, router and agent-loop YAML
- `libra.adapters.verl.traces`   — a verl batch's trajectories as Libra trace JSONL
- `libra.adapters.verl.balancer` — `LibraLoadBalancer`, verl's `RequestLoadBalancer` over Libra's router (Ray
  imported only when servers are added)

Modules that import verl (load them where verl is installed; the `verl.plugins` entry point does):
- `libra.adapters.verl.agent_loop` — `LibraToolAgentLoop` (`libra_tool_agent`)
- `libra.adapters.verl.trainer`    — `libra_separate_async`, one server manager per rollout bucket
- `libra.adapters.verl.plugin`     — registers both with verl on `import verl`
"""

from libra.adapters.verl.config import VERL_VERSION, VerlConfig, VerlConfigError, emit_verl_config
from libra.adapters.verl.traces import export_batch, trace_record, write_batches, write_trace

__all__ = [
    "VERL_VERSION",
    "VerlConfig",
    "VerlConfigError",
    "emit_verl_config",
    "export_batch",
    "trace_record",
    "write_batches",
    "write_trace",
]
