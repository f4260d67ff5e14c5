"""Request routing for rollout: tool-return states, the causal prefix tree, the C-MLFQ router, baseline routers
and routing evaluation. Pure Python: any RL framework's rollout loop can call it.

    router = make_router("cmlfq", parse_buckets("2:5000,4:15000,8:inf"))   # the adaptive preset; preset=NAME
    d = router.admit(rid, prompt_id="p-17", prompt_tokens=512)            # RouteDecision(bucket=0, ...)
    d = router.on_tool_return(rid, tool="search", tool_tokens=1800, status="ok", context_tokens=2600)
    if d.migrate: ...                                                      # move rid to bucket d.bucket
    router.finish(rid, trajectory); router.end_step()                     # at the step boundary
"""

from libra.scheduling.baselines import FCFSRouter, MLFQRouter, OracleRouter, PredictorRouter
from libra.scheduling.cmlfq import CMLFQ_PRESETS, DEFAULT_PRESET, CMLFQRouter
from libra.scheduling.evaluate import RouteEvalResult, as_agent_log, compare, replay
from libra.scheduling.router import RouteDecision, Router, make_router, register_router, router_names
from libra.scheduling.states import DEFAULT_SIZE_EDGES, StateCodec, ToolReturnState
from libra.scheduling.tree import NodeStats, PrefixTree

POLICIES: tuple[str, ...] = ("cmlfq", "mlfq", "predictor", "oracle", "fcfs")

__all__ = [
    "CMLFQ_PRESETS",
    "DEFAULT_PRESET",
    "DEFAULT_SIZE_EDGES",
    "POLICIES",
    "CMLFQRouter",
    "FCFSRouter",
    "MLFQRouter",
    "NodeStats",
    "OracleRouter",
    "PredictorRouter",
    "PrefixTree",
    "RouteDecision",
    "RouteEvalResult",
    "Router",
    "StateCodec",
    "ToolReturnState",
    "as_agent_log",
    "compare",
    "make_router",
    "register_router",
    "replay",
    "router_names",
]
