"""`LibraToolAgentLoop`: verl 0.9.1's `ToolAgentLoop` that tells Libra's balancer what its router needs.

verl records no tool status (a failing tool becomes text in the context). This loop classifies every tool call as
ok / error / timeout (an exception or verl's own error texts are errors; a call past `tool_timeout_s` is a timeout
and returns a short text instead of hanging the trajectory), and after each tool turn reports
(tool, tool tokens, status, context tokens) to the `LibraLoadBalancer` actor, which routes the next turn. At the
end it puts the trajectory in Libra's trace schema into `extra_fields["libra_trace"]` (it flows into the batch's
`non_tensor_batch`; `libra.adapters.verl.traces` writes it out as trace JSONL) and hands it to the balancer.

Registered for verl as `libra_tool_agent` (the agent-loop YAML written by `libra plan --emit verl`, and the
`verl.plugins` entry point). Imports verl: load it only where verl is installed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.tools.schemas import ToolResponse

from libra.adapters.verl.config import check_tool_timeout
from libra.adapters.verl.traces import STATUS_RANK, trace_record

logger = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT_S = 600.0
# verl's ToolAgentLoop._call_tool turns these failures into text; they are errors, not tool output
_VERL_ERROR_PREFIXES = ("Error executing tool", "Unknown function", "Invalid JSON in arguments")


def tool_timeout_of(libra: Any) -> float:
    """`custom.libra.tool_timeout_s` of the rollout config (written by `emit_verl_config`, or by hand), checked:
    absent is the default; null, zero, negative or not a number is one VerlConfigError line."""
    raw = libra.get("tool_timeout_s", DEFAULT_TOOL_TIMEOUT_S) if hasattr(libra, "get") else DEFAULT_TOOL_TIMEOUT_S
    return check_tool_timeout(raw, "actor_rollout_ref.rollout.custom.libra.tool_timeout_s")


@register("libra_tool_agent")
class LibraToolAgentLoop(ToolAgentLoop):
    """ToolAgentLoop + tool statuses, per-turn reports to the Libra balancer and a Libra trace in extra_fields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        custom = self.rollout_config.get("custom") or {}
        libra = custom.get("libra", {}) if hasattr(custom, "get") else {}
        self.tool_timeout_s = tool_timeout_of(libra)
        self._turns: list[dict[str, Any]] = []
        self._statuses: list[tuple[str, str]] = []
        self._prompt_tokens = 0
        self._decisions: list[dict[str, Any]] = []
        self._request_id = ""
        self._prompt_id = ""

    # -- the balancer: an actor whose extra methods we call (verl's client only knows the protocol) ---------------
    @property
    def _balancer(self) -> Any:
        balancer = getattr(self.server_manager, "_load_balancer", None)
        if balancer is None or not hasattr(balancer, "report_tool_return"):
            return None  # not behind a LibraLoadBalancer: trajectories still get their trace
        return balancer

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        self._prompt_id = str(kwargs.get("uid", kwargs.get("index", "")))
        try:
            output = await super().run(sampling_params, **kwargs)
        except BaseException:
            # verl's v1 trainers log a failed trajectory and go on: without this it would stay in the router's
            # books (in flight, admitted) for the rest of the run
            if self._balancer is not None and self._request_id:
                try:
                    await self._balancer.report_abort.remote(self._request_id)
                except Exception as exc:  # the trajectory's own error is the one to raise
                    logger.warning("libra_tool_agent: could not report the abort of %s: %s", self._request_id, exc)
            raise
        record = trace_record(
            prompt_id=self._prompt_id,
            prompt_tokens=self._prompt_tokens,
            turns=self._turns,
            extra={"source": "verl", "request_id": self._request_id, "decisions": self._decisions},
        )
        output.extra_fields["libra_trace"] = record
        if self._balancer is not None:
            await self._balancer.report_finish.remote(self._request_id, record)
        return output

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        state = await super()._handle_pending_state(agent_data, sampling_params)
        self._request_id = agent_data.request_id
        self._prompt_tokens = len(agent_data.prompt_ids)
        if self._balancer is not None:
            d = await self._balancer.report_start.remote(agent_data.request_id, self._prompt_id, self._prompt_tokens)
            self._decisions.append({"turn": 0, **d})
        return state

    async def _handle_generating_state(
        self, agent_data: AgentData, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        self._turns.append(
            {"gen_tokens": len(agent_data.response_ids), "tool": None, "tool_status": None, "tool_tokens": 0}
        )
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        before = len(agent_data.prompt_ids)
        self._statuses = []
        state = await super()._handle_processing_tools_state(agent_data)
        tool_tokens = len(agent_data.prompt_ids) - before if state != AgentState.TERMINATED else 0
        names = [name for name, _ in self._statuses] or [c.name for c in agent_data.tool_calls] or ["tool"]
        status = max((s for _, s in self._statuses), key=STATUS_RANK.__getitem__, default="error")
        tool = "+".join(dict.fromkeys(names))
        turn = self._turns[-1]
        turn.update(tool=tool, tool_status=status, tool_tokens=tool_tokens)
        if self._balancer is not None:
            d = await self._balancer.report_tool_return.remote(
                agent_data.request_id, tool, tool_tokens, status, len(agent_data.prompt_ids)
            )
            self._decisions.append({"turn": len(self._turns), **d})
        return state

    async def _call_tool(self, tool_call: Any, tools_kwargs: dict[str, Any], agent_data: AgentData) -> tuple:
        start = time.monotonic()
        try:
            response, reward, res = await asyncio.wait_for(
                super()._call_tool(tool_call, tools_kwargs, agent_data), timeout=self.tool_timeout_s
            )
        except TimeoutError:
            self._statuses.append((tool_call.name, "timeout"))
            text = f"Tool '{tool_call.name}' timed out after {time.monotonic() - start:.0f} s"
            return ToolResponse(text=text), 0.0, {}
        text = response.text or ""
        status = "error" if text.startswith(_VERL_ERROR_PREFIXES) else "ok"
        if isinstance(res, dict) and res.get("libra_status") in STATUS_RANK:
            status = res["libra_status"]  # a tool may say it itself
        self._statuses.append((tool_call.name, status))
        return response, reward, res
