"""Plan -> verl 0.9.1 configuration: Hydra overrides for the `separate_async` trainer, the router YAML and the
agent-loop YAML. Pure Python: this module imports no verl, so `libra plan --emit verl` runs in any environment.

verl reads the trainer's GPUs from `trainer.{nnodes,n_gpus_per_node}` and the rollout's from
`actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}`; it derives the actor's data parallelism as
`n_gpus // (tp * pp * cp)` and the number of rollout replicas as `n_gpus // rollout_tp` (a floor division: leftover
GPUs are dropped without a word). It also asserts a few batch rules (`train_batch_size = parameter_sync_step *
ppo_mini_batch_size`, the global batch divisible by DP x micro-batch). Libra checks all of that before writing and
refuses, with one line, a plan that verl would run differently from what the planner decided.

A plan with one rollout bucket runs on verl's own `separate_async` trainer; a plan with several buckets (mixed TP
degrees, or one degree split by length) runs on `libra_separate_async` (`libra.adapters.verl.trainer`), which builds
one server manager per bucket. Buckets, their
GPUs and node layout travel in `actor_rollout_ref.rollout.custom.libra` (verl's extension point for custom
configuration), which the router and the Libra trainer read back.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import yaml

from libra.spec import Bucket, ClusterSpec, Plan, RLSettings, SpecError
from libra.spec.checks import is_whole
from libra.spec.files import atomic_open

VERL_VERSION = "0.9.1"
STRATEGIES = ("megatron", "fsdp")
ROUTER_CLASS = "libra.adapters.verl.balancer.LibraLoadBalancer"
AGENT_LOOP_NAME = "libra_tool_agent"
AGENT_LOOP_CLASS = "libra.adapters.verl.agent_loop.LibraToolAgentLoop"
TRAINER_SINGLE_TP = "separate_async"
TRAINER_MIXED_TP = "libra_separate_async"
ROUTER_FILE = "libra_router.yaml"
AGENT_LOOP_FILE = "libra_agent_loops.yaml"
OVERRIDES_FILE = "overrides.txt"
# LibraLoadBalancer maps each server to its bucket through `get_rollout_config()`, which in verl 0.9.1 only the vLLM
# server has (its SGLang and TensorRT-LLM servers do not)
ROLLOUT_ENGINES = ("vllm",)
# advantage estimators that make verl start a critic (`need_critic`), a second trained model the plan has no GPUs for
CRITIC_ESTIMATORS = ("gae",)


class VerlConfigError(SpecError):
    """A plan that verl would run differently from what the planner decided (one line, says why)."""


@attrs.frozen(kw_only=True)
class NodeLayout:
    """`nnodes` nodes with `gpus_per_node` GPUs each, as verl's `nnodes` / `n_gpus_per_node` pairs say it."""

    nnodes: int
    gpus_per_node: int

    @property
    def num_gpus(self) -> int:
        return self.nnodes * self.gpus_per_node


@attrs.frozen(kw_only=True)
class VerlBucket:
    """One rollout bucket as verl runs it: `replicas` servers of degree `tp` on `layout`, serving contexts up to
    `max_tokens` (None: open-ended)."""

    index: int
    tp: int
    replicas: int
    max_tokens: int | None
    layout: NodeLayout

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "tp": self.tp,
            "replicas": self.replicas,
            "max_tokens": self.max_tokens,
            "nnodes": self.layout.nnodes,
            "n_gpus_per_node": self.layout.gpus_per_node,
        }


@attrs.frozen(kw_only=True)
class VerlConfig:
    """Everything `libra plan --emit verl` writes. `overrides` are Hydra overrides for verl's `config_name`
    (`ppo_megatron_trainer` or `ppo_trainer`); `router` and `agent_loops` are the YAML files they point to."""

    config_name: str
    overrides: tuple[str, ...]
    router: dict[str, Any]
    agent_loops: list[dict[str, Any]]
    buckets: tuple[VerlBucket, ...]
    trainer_mode: str
    train_layout: NodeLayout
    rollout_layout: NodeLayout
    config_dir: Path | None = None  # where the overrides say the router and agent-loop YAML lie

    def command(self) -> str:
        """The verl launch command these overrides belong to."""
        return f"python -m verl.trainer.main_ppo --config-name {self.config_name} " + " ".join(
            _shell_quote(o) for o in self.overrides
        )

    def write(self, out_dir: str | Path | None = None) -> list[Path]:
        """Write overrides.txt, the router and agent-loop YAML, run_verl.sh and libra_verl.json into `out_dir`
        (default: the `config_dir` the overrides name) as one set: a failure leaves none of them changed. Returns the
        paths. A directory other than `config_dir` is refused: the overrides would name router and agent-loop files
        that are not there."""
        if out_dir is None and self.config_dir is None:
            raise VerlConfigError("write() needs out_dir: this config names no config_dir")
        out = Path(out_dir) if out_dir is not None else Path(self.config_dir or ".")
        if self.config_dir is not None and out.resolve() != self.config_dir:
            raise VerlConfigError(
                f"the overrides name router and agent-loop files in {self.config_dir}, not in {out.resolve()}: "
                "pass config_dir=out_dir to emit_verl_config"
            )
        out.mkdir(parents=True, exist_ok=True)
        files = {
            OVERRIDES_FILE: "\n".join(self.overrides) + "\n",
            ROUTER_FILE: yaml.safe_dump(self.router, sort_keys=False),
            AGENT_LOOP_FILE: yaml.safe_dump(self.agent_loops, sort_keys=False),
            "run_verl.sh": "#!/usr/bin/env bash\n# verl "
            + VERL_VERSION
            + " launch for this Libra plan (written by `libra plan --emit verl`)\nset -euo pipefail\n"
            + self.command()
            + ' "$@"\n',
            "libra_verl.json": json.dumps(self.summary(), indent=2) + "\n",
        }
        paths = [out / name for name in files]
        for path in paths:  # a rename over a directory would fail after the files before it were replaced
            if path.is_dir():
                raise VerlConfigError(f"cannot write {path}: a directory is in the way")
        # every file is written beside its path first and all are renamed at the end: a failed write (a full disk)
        # leaves the old set whole, never new overrides beside an old router YAML
        with contextlib.ExitStack() as stack:
            for path, text in zip(paths, files.values()):
                stack.enter_context(atomic_open(path, executable=path.name.endswith(".sh"))).write(text)
        return paths

    def summary(self) -> dict[str, Any]:
        return {
            "verl_version": VERL_VERSION,
            "config_name": self.config_name,
            "trainer_mode": self.trainer_mode,
            "train": {"nnodes": self.train_layout.nnodes, "n_gpus_per_node": self.train_layout.gpus_per_node},
            "rollout": {"nnodes": self.rollout_layout.nnodes, "n_gpus_per_node": self.rollout_layout.gpus_per_node},
            "buckets": [b.to_dict() for b in self.buckets],
            "overrides": list(self.overrides),
        }


# what Hydra's override grammar reads back as this very string without quotes: a subset of its unquoted characters
# (no `\`, no `$` of interpolations, no `+`), unless the word reads as a number, a bool, null, inf or nan
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./:@%*?|-]+")
_HYDRA_NOT_STRING = re.compile(r"[-+]?[0-9_.]*([eE][-+]?[0-9_]+)?|(?i:[-+]?(inf|nan)|null|true|false)")


def _hydra_str(text: str) -> str:
    """`text` as a Hydra override value that reads back as exactly `text` (a quoted string where it must be: a
    path with a comma, `~`, brackets, quotes, `$` or non-ASCII letters otherwise fails or changes in Hydra)."""
    if any(c in text for c in "\n\r\0"):
        raise VerlConfigError(f"{text!r} cannot be a line of {OVERRIDES_FILE}")
    if _HYDRA_PLAIN.fullmatch(text) and not _HYDRA_NOT_STRING.fullmatch(text):
        return text
    # inside '...': \' is a quote and \${ a literal `${` (not an interpolation); backslashes are literal except a
    # run of them before a quote, a `${` or the closing quote, which is doubled
    body = re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1) * 2, text)
    body = body.replace("'", "\\'").replace("${", "\\${")
    return "'" + body + "'"


def _shell_quote(text: str) -> str:
    safe = all(c.isalnum() or c in "._-/=+:," for c in text)
    return text if safe else "'" + text.replace("'", "'\\''") + "'"


def node_layout(num_gpus: int, *, gpus_per_node: int, multiple_of: int, what: str) -> NodeLayout:
    """The fewest equal nodes holding `num_gpus`, each with at most `gpus_per_node` GPUs and a multiple of
    `multiple_of` (so a TP group never spans nodes). verl describes a pool only as `nnodes x n_gpus_per_node`."""
    if num_gpus < 1:
        raise VerlConfigError(f"{what}: needs at least one GPU, the plan gives {num_gpus}")
    for nnodes in range(math.ceil(num_gpus / gpus_per_node), num_gpus + 1):
        if num_gpus % nnodes:
            continue
        per_node = num_gpus // nnodes
        if per_node <= gpus_per_node and per_node % multiple_of == 0:
            return NodeLayout(nnodes=nnodes, gpus_per_node=per_node)
    raise VerlConfigError(
        f"{what}: {num_gpus} GPUs cannot be written as nnodes x n_gpus_per_node with at most {gpus_per_node} "
        f"per node and a multiple of {multiple_of} per node (a TP-{multiple_of} replica must fit in one node)"
    )


def _rollout_buckets(plan: Plan, cluster: ClusterSpec) -> tuple[VerlBucket, ...]:
    groups = sorted(plan.rollout.instances, key=lambda g: g.max_tokens)
    used = sum(g.num_gpus for g in groups)
    if used != plan.rollout.num_gpus:
        raise VerlConfigError(
            f"the plan's rollout buckets use {used} of its {plan.rollout.num_gpus} rollout GPUs; verl would start "
            f"replicas on all {plan.rollout.num_gpus} (floor division by TP), so Libra refuses a plan with idle "
            "rollout GPUs"
        )
    out = []
    for i, g in enumerate(groups):
        if g.tp > cluster.gpus_per_node:
            raise VerlConfigError(f"bucket {i}: a TP-{g.tp} replica does not fit a node of {cluster.gpus_per_node}")
        layout = node_layout(g.num_gpus, gpus_per_node=cluster.gpus_per_node, multiple_of=g.tp, what=f"bucket {i}")
        if layout.num_gpus // g.tp != g.count:
            raise VerlConfigError(
                f"bucket {i}: verl would start {layout.num_gpus // g.tp} replicas, the plan {g.count}"
            )
        limit = None if i == len(groups) - 1 or math.isinf(g.max_tokens) else int(g.max_tokens)
        out.append(VerlBucket(index=i, tp=g.tp, replicas=g.count, max_tokens=limit, layout=layout))
    return tuple(out)


def _check_batch(plan: Plan, rl: RLSettings, *, strategy: str, parameter_sync_step: int) -> int:
    """verl's batch rules for this plan; returns `ppo_mini_batch_size` (in prompts)."""
    t = plan.train
    if rl.num_prompts % parameter_sync_step:
        raise VerlConfigError(
            f"verl asserts train_batch_size = parameter_sync_step * ppo_mini_batch_size: {rl.num_prompts} prompts "
            f"are not a multiple of parameter_sync_step {parameter_sync_step}"
        )
    mini = rl.num_prompts // parameter_sync_step
    sequences = mini * rl.samples_per_prompt
    # verl: megatron needs the global batch divisible by DP x micro-batch, FSDP by the GPU count (each GPU is a
    # data-parallel rank); every mini-batch is split over DP ranks and then into micro-batches.
    minimal = t.dp * t.micro_batch if strategy == "megatron" else t.num_gpus
    if (rl.global_batch % minimal) or (sequences % (t.dp * t.micro_batch)):
        raise VerlConfigError(
            f"verl needs the batch ({rl.global_batch} sequences, mini-batches of {sequences}) divisible by "
            f"DP {t.dp} x micro-batch {t.micro_batch}"
            + (f" and by the {t.num_gpus} FSDP ranks" if strategy == "fsdp" else "")
        )
    return mini


def emit_verl_config(
    plan: Plan,
    *,
    cluster: ClusterSpec,
    rl: RLSettings,
    model_path: str,
    strategy: str = "megatron",
    router_policy: str = "cmlfq",
    router_options: dict[str, Any] | None = None,
    parameter_sync_step: int = 1,
    max_prompt_tokens: int = 2048,
    config_dir: str | Path = ".",
    checkpoint_backend: str = "nccl",
    tool_timeout_s: float = 600.0,
    adv_estimator: str = "grpo",
    rollout_engine: str = "vllm",
) -> VerlConfig:
    """The verl 0.9.1 configuration that runs `plan` on `cluster`: `separate_async` with Megatron or FSDP actors.

    `config_dir` is where the router and agent-loop YAML will lie (the overrides name them by absolute path);
    `adv_estimator` is verl's advantage estimator: GRPO by default, which needs no critic (the planner plans one
    trained model; a critic would need GPUs of its own). `tool_timeout_s` is how long `LibraToolAgentLoop` lets a
    tool call run before reporting it as a timeout; `rollout_engine` is verl's `rollout.name`.
    Raises `VerlConfigError` (one line) for a plan verl would run differently: idle or mis-summed rollout GPUs,
    a replica or a TP group that does not fit a node, a derived DP other than the plan's, a batch verl refuses, a
    TP/PP/EP layout on FSDP; and for an argument of the wrong type or range, a router policy or option Libra's
    router refuses, a rollout engine other than vLLM or an estimator that needs a critic."""
    _check_arguments(
        model_path=model_path,
        strategy=strategy,
        parameter_sync_step=parameter_sync_step,
        max_prompt_tokens=max_prompt_tokens,
        max_model_len=rl.max_model_len,
        tool_timeout_s=tool_timeout_s,
        rollout_engine=rollout_engine,
        adv_estimator=adv_estimator,
        checkpoint_backend=checkpoint_backend,
    )
    t = plan.train
    if plan.num_gpus > cluster.num_gpus:
        raise VerlConfigError(f"the plan uses {plan.num_gpus} GPUs, the cluster has {cluster.num_gpus}")
    if strategy == "fsdp" and (t.tp, t.pp, t.ep) != (1, 1, 1):
        raise VerlConfigError(
            f"verl's FSDP actor is data-parallel only; the plan trains with TP {t.tp} x PP {t.pp} x EP {t.ep}: "
            "use strategy megatron"
        )
    if t.tp > cluster.gpus_per_node:
        raise VerlConfigError(f"a training TP group of {t.tp} does not fit a node of {cluster.gpus_per_node}")
    train_layout = node_layout(t.num_gpus, gpus_per_node=cluster.gpus_per_node, multiple_of=t.tp, what="training")
    derived_dp = train_layout.num_gpus // (t.tp * t.pp)
    if derived_dp != t.dp:
        raise VerlConfigError(
            f"verl would derive DP {derived_dp} from {train_layout.num_gpus} GPUs, the plan has {t.dp}"
        )
    buckets = _rollout_buckets(plan, cluster)
    router_options = _check_router(router_policy, router_options, buckets)
    mini = _check_batch(plan, rl, strategy=strategy, parameter_sync_step=parameter_sync_step)
    max_tp = max(b.tp for b in buckets)
    rollout_layout = node_layout(
        plan.rollout.num_gpus,
        gpus_per_node=cluster.gpus_per_node,
        multiple_of=max_tp if len(buckets) == 1 else 1,
        what="rollout",
    )
    mixed = len(buckets) > 1
    trainer_mode = TRAINER_MIXED_TP if mixed else TRAINER_SINGLE_TP
    config_dir = Path(config_dir).resolve()
    ar = "actor_rollout_ref"
    o: list[str] = [
        f"trainer.v1.trainer_mode={trainer_mode}",
        f"trainer.v1.separate_async.parameter_sync_step={parameter_sync_step}",
        f"algorithm.adv_estimator={_hydra_str(adv_estimator)}",
        f"trainer.nnodes={train_layout.nnodes}",
        f"trainer.n_gpus_per_node={train_layout.gpus_per_node}",
        f"{ar}.hybrid_engine=False",
        f"{ar}.model.path={_hydra_str(model_path)}",
        f"data.train_batch_size={rl.num_prompts}",
        f"data.max_prompt_length={max_prompt_tokens}",
        f"data.max_response_length={rl.max_model_len - max_prompt_tokens}",
        f"{ar}.actor.ppo_mini_batch_size={mini}",
        f"{ar}.actor.ppo_micro_batch_size_per_gpu={t.micro_batch}",
        f"{ar}.actor.use_dynamic_bsz=False",
        f"{ar}.rollout.log_prob_micro_batch_size_per_gpu={t.micro_batch}",
        f"{ar}.ref.log_prob_micro_batch_size_per_gpu={t.micro_batch}",
        f"{ar}.rollout.name={rollout_engine}",
        f"{ar}.rollout.n={rl.samples_per_prompt}",
        f"{ar}.rollout.nnodes={rollout_layout.nnodes}",
        f"{ar}.rollout.n_gpus_per_node={rollout_layout.gpus_per_node}",
        f"{ar}.rollout.tensor_model_parallel_size={buckets[0].tp if not mixed else max_tp}",
        f"{ar}.rollout.checkpoint_engine.backend={_hydra_str(checkpoint_backend)}",
        f"{ar}.rollout.router_config_path={_hydra_str(str(config_dir / ROUTER_FILE))}",
        f"{ar}.rollout.agent.agent_loop_config_path={_hydra_str(str(config_dir / AGENT_LOOP_FILE))}",
        f"{ar}.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
    ]
    if strategy == "megatron":
        m = f"{ar}.actor.megatron"
        o += [
            f"{m}.tensor_model_parallel_size={t.tp}",
            f"{m}.pipeline_model_parallel_size={t.pp}",
            f"{m}.expert_model_parallel_size={t.ep}",
            f"{m}.context_parallel_size=1",
        ]
        if t.recompute:
            tc = f"{m}.override_transformer_config"
            o += [f"{tc}.recompute_granularity=full", f"{tc}.recompute_method=uniform", f"{tc}.recompute_num_layers=1"]
    else:
        o += [f"{ar}.actor.strategy=fsdp", f"{ar}.model.enable_gradient_checkpointing={t.recompute}"]
    custom = {
        "libra": {
            "trainer_mode": trainer_mode,
            "tool_timeout_s": tool_timeout_s,
            "buckets": [b.to_dict() for b in buckets],
            "train": {"tp": t.tp, "pp": t.pp, "dp": t.dp, "ep": t.ep, "micro_batch": t.micro_batch},
        }
    }
    o.append(f"+{ar}.rollout.custom={_hydra_value(custom)}")
    router = {
        "router_class": ROUTER_CLASS,
        "policy": router_policy,
        "options": router_options,
        "buckets": [{"tp": b.tp, "max_tokens": b.max_tokens} for b in buckets],
    }
    agent_loops = [{"name": AGENT_LOOP_NAME, "_target_": AGENT_LOOP_CLASS}]
    return VerlConfig(
        config_name="ppo_megatron_trainer" if strategy == "megatron" else "ppo_trainer",
        overrides=tuple(o),
        router=router,
        agent_loops=agent_loops,
        buckets=buckets,
        trainer_mode=trainer_mode,
        train_layout=train_layout,
        rollout_layout=rollout_layout,
        config_dir=config_dir,
    )


def _check_arguments(
    *,
    model_path: Any,
    strategy: Any,
    parameter_sync_step: Any,
    max_prompt_tokens: Any,
    max_model_len: int,
    tool_timeout_s: Any,
    rollout_engine: Any,
    adv_estimator: Any,
    checkpoint_backend: Any,
) -> None:
    """emit_verl_config's arguments: each wrong one is refused with one line naming it, before anything is derived."""
    if strategy not in STRATEGIES:
        raise VerlConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    for name, value in (
        ("model_path", model_path),
        ("adv_estimator", adv_estimator),
        ("checkpoint_backend", checkpoint_backend),
    ):
        if not isinstance(value, str) or not value.strip() or any(c in value for c in "\n\r\0"):
            raise VerlConfigError(f"{name} must be a non-empty string on one line, got {value!r}")
    if not is_whole(parameter_sync_step) or parameter_sync_step < 1:
        raise VerlConfigError(f"parameter_sync_step must be an integer >= 1, got {parameter_sync_step!r}")
    if not is_whole(max_prompt_tokens) or not 0 < max_prompt_tokens < max_model_len:
        raise VerlConfigError(
            f"max_prompt_tokens must be an integer in (0, {max_model_len}) (below rl.max_model_len), "
            f"got {max_prompt_tokens!r}"
        )
    check_tool_timeout(tool_timeout_s)
    if rollout_engine not in ROLLOUT_ENGINES:
        raise VerlConfigError(
            f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, got {rollout_engine!r}: LibraLoadBalancer "
            "reads each server's bucket from get_rollout_config(), which only verl's vLLM server has"
        )
    if adv_estimator in CRITIC_ESTIMATORS:
        raise VerlConfigError(
            f"adv_estimator {adv_estimator!r} makes verl train a critic, which the plan has no GPUs for; "
            "use a critic-free estimator such as grpo"
        )


def check_tool_timeout(tool_timeout_s: Any, where: str = "tool_timeout_s") -> float:
    """How long a tool call may run before it counts as a timeout: a finite number of seconds > 0 (a negative one
    made every call time out at once), else one VerlConfigError line naming `where`."""
    if (
        isinstance(tool_timeout_s, bool)
        or not isinstance(tool_timeout_s, int | float)
        or not 0 < tool_timeout_s < math.inf
    ):
        raise VerlConfigError(f"{where} must be a finite number of seconds > 0, got {tool_timeout_s!r}")
    return float(tool_timeout_s)


def _check_router(policy: Any, options: Any, buckets: tuple[VerlBucket, ...]) -> dict[str, Any]:
    """Build the router the balancer will build from the router YAML, so that a policy or option it refuses is
    refused here, in one line, rather than in verl's balancer actor at the first rollout. Returns the options."""
    from libra.scheduling import make_router  # pure, but not needed to import this module

    if options is not None and not isinstance(options, dict):
        raise VerlConfigError(f"router_options must be a dict of the policy's options, got {options!r}")
    options = dict(options or {})
    specs = tuple(Bucket(tp=b.tp, max_tokens=math.inf if b.max_tokens is None else b.max_tokens) for b in buckets)
    try:
        make_router(policy, specs, **options)
    except SpecError as exc:
        raise VerlConfigError(f"router: {exc}") from None
    return options


def _hydra_value(value: Any) -> str:
    """A Hydra override value (its grammar: `{k:v,...}`, `[a,b]`, `null`, bare words and numbers)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
