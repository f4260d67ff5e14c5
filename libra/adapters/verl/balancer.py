"""`LibraLoadBalancer`: verl 0.9.1's `RequestLoadBalancer` with Libra's router (C-MLFQ by default) inside.

verl builds it from the router YAML (`rollout.router_config_path`, key `router_class`) as one Ray actor shared by
every `AgentLoopWorker`: `get_router_handle` calls `LibraLoadBalancer(servers, yaml_config)`. Every turn of a
trajectory acquires a server with the same request id and resends the whole context, so a trajectory may change
server between turns at the cost of one prefill; within a turn it never moves.

- Servers are mapped to buckets from their own `get_rollout_config()`: `custom.libra.bucket` when the Libra trainer
  set it (mixed TP), else the bucket of the server's `tensor_model_parallel_size`.
- A new request id is admitted through the router (`report_start` from `LibraToolAgentLoop` carries the prompt's
  token count; a plain verl agent loop is admitted at its first acquire with 0 tokens).
- Each tool return (`report_tool_return`: tool, tokens, ok/error/timeout, context) goes to the router; when the
  router moves the request, the next turn acquires a server of the new bucket (least loaded there).
- Otherwise a trajectory sticks to its server; a server removed mid-run (elastic lending) sends the next turn to the
  least-loaded server of the same bucket, or of the nearest bucket that still has servers.
- `report_finish` hands the finished trajectory (Libra trace schema) to the router; `end_step` (the trainer's step
  end) lets the router learn from them. `report_abort` takes a failed trajectory off the router's books.

Only request ids and token counts cross the RPC (`require_acquire_fields` is empty): never the prompt's token ids.
The router's decisions are plain values; `get_status()["libra"]` counts them for logs and tests.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from libra.spec import Bucket, SpecError
from libra.workloads.trace import TraceError, parse_line

logger = logging.getLogger(__name__)

STICKY_CACHE_SIZE = 100_000
_SOURCE = Path("<verl agent loop>")


def buckets_from_yaml(config: Any) -> tuple[Bucket, ...]:
    """The router YAML's `buckets` ([{tp, max_tokens (null = open-ended, the last bucket only)}]) as Libra buckets.
    A malformed list raises SpecError in one line naming the bucket and the field."""
    raw = config.get("buckets") if isinstance(config, dict) else None
    if not raw:
        raise SpecError("router YAML: 'buckets' is missing or empty (write it with `libra plan --emit verl`)")
    if not isinstance(raw, list):
        raise SpecError(f"router YAML: 'buckets' must be a list of {{tp, max_tokens}}, got {type(raw).__name__}")
    out = []
    for i, b in enumerate(raw):
        if not isinstance(b, dict):
            raise SpecError(f"router YAML: buckets[{i}] must be a mapping {{tp, max_tokens}}, got {b!r}")
        tp, limit = b.get("tp"), b.get("max_tokens")
        if not isinstance(tp, int) or isinstance(tp, bool):
            raise SpecError(f"router YAML: buckets[{i}].tp must be an integer, got {tp!r}")
        last = i == len(raw) - 1
        if limit is None and not last:
            raise SpecError(f"router YAML: buckets[{i}].max_tokens is null, but only the last bucket is open-ended")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)):
            raise SpecError(f"router YAML: buckets[{i}].max_tokens must be a number of tokens or null, got {limit!r}")
        out.append(Bucket(tp=tp, max_tokens=float("inf") if limit is None or last else limit))
    return tuple(out)


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


class LibraLoadBalancer:
    """verl `RequestLoadBalancer` routing with a Libra `Router`. Plain class: verl wraps it with `ray.remote`."""

    def __init__(self, servers: dict[str, Any], config: dict[str, Any]) -> None:
        from libra.scheduling import make_router

        if not isinstance(config, dict):
            raise SpecError(f"router YAML must be a mapping (router_class, policy, options, buckets), got {config!r}")
        self.config = dict(config)
        self.buckets = buckets_from_yaml(self.config)
        options = self.config.get("options") or {}
        if not isinstance(options, dict):
            raise SpecError(f"router YAML: 'options' must be a mapping of the policy's options, got {options!r}")
        self.router = make_router(self.config.get("policy", "cmlfq"), self.buckets, **options)
        self._servers: dict[str, Any] = {}
        self._bucket_of_server: dict[str, int] = {}
        self._inflight: dict[str, int] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._admitted: set[str] = set()
        self._last_server: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.add_servers(servers)

    # -- verl's RequestLoadBalancer protocol ---------------------------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return []  # token counts come from the agent loop (report_*), never the prompt's ids

    def require_release_fields(self) -> list[str]:
        return []

    def acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        if not self._inflight:
            raise RuntimeError("No available servers in load balancer")
        if request_id not in self._admitted:
            self._admit(request_id, prompt_id=request_id, prompt_tokens=0)
        bucket = self.router.bucket_of(request_id)
        server_id = self._sticky.get(request_id)
        if server_id is None or server_id not in self._inflight or self._bucket_of_server[server_id] != bucket:
            server_id = self._least_loaded(self._serving_bucket(bucket))
            previous = self._last_server.get(request_id)
            if previous is not None and previous != server_id:
                self.counts["server_moves"] += 1
            self._sticky[request_id] = server_id
            if len(self._sticky) > STICKY_CACHE_SIZE:
                evicted, _ = self._sticky.popitem(last=False)
                self._last_server.pop(evicted, None)
        self._sticky.move_to_end(request_id)
        self._last_server[request_id] = server_id
        self._inflight[server_id] += 1
        self.counts["acquires"] += 1
        self.counts[f"acquires_bucket_{self._bucket_of_server[server_id]}"] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def add_servers(self, servers: dict[str, Any]) -> None:
        if not servers:
            return
        configs = self._rollout_configs(list(servers.values()))
        # every server's bucket first: a server that fits none is refused before any of them is registered
        buckets = {sid: self._bucket_for_server(sid, cfg) for sid, cfg in zip(servers, configs)}
        for sid, handle in servers.items():
            self._servers[sid] = handle
            self._bucket_of_server[sid] = buckets[sid]
            self._inflight[sid] = 0
        logger.info("LibraLoadBalancer: added %d servers, buckets %s", len(servers), self._bucket_of_server)

    def remove_servers(self, server_ids: list[str]) -> None:
        for sid in server_ids:
            self._servers.pop(sid, None)
            self._inflight.pop(sid, None)
            self._bucket_of_server.pop(sid, None)

    def get_all_servers(self) -> list[str]:
        return list(self._inflight)

    def get_inflight_count(self, server_id: str) -> int:
        return self._inflight.get(server_id, 0)

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    def clear_sticky_cache(self) -> dict:
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_status(self) -> dict:
        return {
            "servers": dict(self._inflight),
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(self._inflight),
            "registered_handles": list(self._servers),
            "libra": {
                "server_buckets": dict(self._bucket_of_server),
                "requests_in_flight": self.router.num_active,
                "counts": dict(self.counts),
            },
        }

    # -- what LibraToolAgentLoop and the trainer report -------------------------------------------------------
    def report_start(self, request_id: str, prompt_id: str, prompt_tokens: int) -> dict:
        """A trajectory starts: admit it through the router with its prompt's token count."""
        if request_id in self._admitted:
            return {"bucket": self.router.bucket_of(request_id), "reason": "already admitted"}
        d = self._admit(request_id, prompt_id=str(prompt_id), prompt_tokens=int(prompt_tokens))
        return {"bucket": d.bucket, "reason": d.reason}

    def report_tool_return(
        self, request_id: str, tool: str, tool_tokens: int, status: str, context_tokens: int
    ) -> dict:
        """A tool call of the trajectory returned; the router may move its next turn to another bucket."""
        if request_id not in self._admitted:
            self._admit(request_id, prompt_id=request_id, prompt_tokens=max(int(context_tokens) - tool_tokens, 0))
        d = self.router.on_tool_return(
            request_id, tool=tool, tool_tokens=int(tool_tokens), status=status, context_tokens=int(context_tokens)
        )
        self.counts[f"tool_{status}"] += 1
        if d.migrate:
            self.counts["migrations"] += 1
            self.counts["migrated_tokens"] += d.migrated_tokens  # the next acquire leaves the old bucket's server
        return {
            "bucket": d.bucket,
            "migrate": d.migrate,
            "from_bucket": d.from_bucket,
            "migrated_tokens": d.migrated_tokens,
            "reason": d.reason,
        }

    def report_finish(self, request_id: str, trajectory: dict[str, Any]) -> None:
        """The trajectory finished (a dict in Libra's trace schema); the router keeps it for `end_step`."""
        self._sticky.pop(request_id, None)
        self._last_server.pop(request_id, None)
        if request_id not in self._admitted:
            return
        self._admitted.discard(request_id)
        try:
            traj = parse_line(json.dumps(trajectory), _SOURCE, 1)
        except TraceError as exc:  # the request still leaves the router, unlearnt
            logger.warning("LibraLoadBalancer: trajectory of %s not learnt from: %s", request_id, exc)
            self.router.abort(request_id)
            self.counts["unparsed"] += 1
            return
        self.router.finish(request_id, traj)
        self.counts["finished"] += 1

    def report_abort(self, request_id: str) -> None:
        """The trajectory failed (its agent loop raised; verl's v1 trainers drop the prompt's group and go on): it
        leaves the router's books without teaching the router anything."""
        self._sticky.pop(request_id, None)
        self._last_server.pop(request_id, None)
        if request_id not in self._admitted:
            return
        self._admitted.discard(request_id)
        self.router.abort(request_id)
        self.counts["aborted"] += 1

    def end_step(self) -> dict:
        """Step boundary (the trainer's step end): the router learns from the trajectories finished since the last
        one. Returns the counts so far."""
        self.router.end_step()
        self.counts["steps"] += 1
        return dict(self.counts)

    # -- internals -----------------------------------------------------------------------------------------------
    def _rollout_configs(self, handles: list[Any]) -> list[Any]:
        """Each server's `get_rollout_config()` (its TP, and `custom.libra.bucket` under the Libra trainer)."""
        import ray

        return ray.get([handle.get_rollout_config.remote() for handle in handles])

    def _admit(self, request_id: str, *, prompt_id: str, prompt_tokens: int):
        d = self.router.admit(request_id, prompt_id=prompt_id, prompt_tokens=prompt_tokens)
        self._admitted.add(request_id)
        self.counts["admitted"] += 1
        self.counts[f"admitted_bucket_{d.bucket}"] += 1
        return d

    def _bucket_for_server(self, server_id: str, cfg: Any) -> int:
        custom = _field(cfg, "custom") or {}
        libra = custom.get("libra", {}) if isinstance(custom, dict) else {}
        if "bucket" in libra:
            index = libra["bucket"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.buckets):
                raise SpecError(
                    f"server {server_id} says bucket {index!r} (custom.libra.bucket); the router YAML has buckets "
                    f"0 to {len(self.buckets) - 1}"
                )
            return index
        tp = _field(cfg, "tensor_model_parallel_size", 1)
        for i, b in enumerate(self.buckets):
            if b.tp == tp:
                return i
        raise SpecError(
            f"server {server_id}: a TP-{tp} server matches no bucket of the router YAML "
            f"({[b.tp for b in self.buckets]}); regenerate it with `libra plan --emit verl`"
        )

    def _serving_bucket(self, bucket: int) -> int:
        """`bucket` if it has servers, else the nearest one that has (larger first: it holds longer contexts)."""
        have = set(self._bucket_of_server.values())
        if bucket in have:
            return bucket
        order = sorted(have, key=lambda b: (abs(b - bucket), b < bucket))
        self.counts["bucket_fallbacks"] += 1
        return order[0]

    def _least_loaded(self, bucket: int) -> str:
        candidates = [sid for sid, b in self._bucket_of_server.items() if b == bucket]
        return min(candidates, key=lambda sid: self._inflight[sid])
