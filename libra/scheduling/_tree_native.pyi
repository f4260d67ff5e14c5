# The optional C extension built from ext/scheduling/tree_native.c (setup.py); libra/scheduling/node.py falls back
# to its Python reference when it is not built.
from typing import Any

def bind(node_type: type, /) -> None: ...
def refresh_all(nodes: list, limit: int, at50: tuple[int, ...], at90: tuple[int, ...], incremental: int, /) -> None: ...
def learn(
    batch: list,
    paths: list,
    step: int,
    touched: list,
    entries: list,
    agnostic: object,
    prompts: dict,
    sizes: dict,
    /,
) -> Any: ...
def learn_agnostic(batch: list, paths: list, step: int, touched: list, entries: list, agnostic: object, /) -> Any: ...
def evict(index: dict, excess: int, root_children: dict, /) -> Any: ...
def distinct_prefixes(paths: list, /) -> int: ...
def replay(
    trajectories: Any,
    agnostic: object,
    prompts: dict,
    codec: object,
    statuses: tuple[str, ...],
    limits: tuple[float, ...],
    min_count: int,
    agnostic_fallback: bool,
    overflow: bool,
    predicted: bool,
    cost_ratio: float,
    nseg: Any,
    gen_ctx: Any,
    tool_ctx: Any,
    tool_end: Any,
    turn_of: Any,
    bucket: Any,
    carried: Any,
    /,
) -> Any: ...
