"""Load a model or a cluster from a YAML or JSON file (keys are the attrs field names).

Input is bounded before it is parsed: a regular file of at most `MAX_FILE_BYTES`, UTF-8 text, nesting that the
parsers can follow; anything else is a one-line SpecError. YAML numbers written like `3e-6` (no dot, which plain
YAML 1.1 reads as a string) load as numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import yaml

from libra.spec.cluster import ClusterSpec
from libra.spec.errors import SpecError
from libra.spec.hardware import GPUSpec, get_gpu
from libra.spec.model import MODEL_PRESETS, ModelSpec, get_model

MAX_FILE_BYTES = 16 << 20  # a model, cluster or coefficients file is a few hundred bytes


class _Loader(yaml.SafeLoader):
    """YAML's safe loader that also reads `3e-6` and `1E9` (exponent without a dot) as floats."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; a one-line SpecError otherwise (devices, FIFOs,
    directories, unreadable /proc files, binary data)."""
    try:
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise SpecError(f"cannot read {path}: it {what}")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise SpecError(f"{path}: larger than {limit >> 20} MiB; not a model, cluster or coefficients file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_mapping(path: Path) -> dict[str, Any]:
    """The mapping at the top of a YAML or JSON file (`.json` is JSON, anything else YAML); SpecError otherwise."""
    text = read_text(path)
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_Loader)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        message = " ".join(str(exc).split())
        raise SpecError(f"{path}: not valid {kind}: {message}") from None
    except RecursionError:
        raise SpecError(f"{path}: not valid {kind}: nested too deeply") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of field names to values")
    return data


def construct(cls: type, data: dict[str, Any], path: Path) -> Any:
    """`cls(**data)`, with a one-line SpecError naming `path`, the class and the field(s) for unknown or missing
    fields (docs/files.md: "FILE: ModelSpec field 'num_layers' missing"), or for a bad call."""
    fields = {f.name for f in attrs.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise SpecError(
            f"{path}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; known: {', '.join(sorted(fields))}"
        )
    missing = [f.name for f in attrs.fields(cls) if f.init and f.default is attrs.NOTHING and f.name not in data]
    if missing:
        raise SpecError(f"{path}: {cls.__name__} {_fields(missing)} missing")
    try:
        return cls(**data)
    except TypeError as exc:
        raise SpecError(f"{path}: {exc}") from None
    except SpecError as exc:  # a value out of range: the field's own message, with the file that holds it
        if str(exc).startswith(f"{path}: "):
            raise
        raise SpecError(f"{path}: {exc}") from None


def _fields(names: list[str]) -> str:
    """The names as a message gives them: "field 'a'" or "fields 'a', 'b'"."""
    return ("field " if len(names) == 1 else "fields ") + ", ".join(repr(n) for n in names)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a YAML/JSON file with ModelSpec fields (a folder is neither: said so, not "unknown
    model")."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") and not path.is_dir():
        data = read_mapping(path)
        data.setdefault("name", path.stem)
        return construct(ModelSpec, data, path)
    try:
        return get_model(name_or_path)  # (a preset, even where a folder of its name lies here)
    except SpecError:
        if not path.is_dir():
            raise
    raise SpecError(
        f"{path}: a folder, not a model file (YAML/JSON of ModelSpec fields, docs/files.md) or a preset name "
        f"({', '.join(MODEL_PRESETS)})"
    )


def load_cluster(path_text: str) -> ClusterSpec:
    """A YAML/JSON file: `gpu` (a preset name or a mapping of GPUSpec fields), `num_nodes`, `gpus_per_node`."""
    path = Path(path_text)
    data = read_mapping(path)
    if "gpu" not in data:
        raise SpecError(f"{path}: ClusterSpec field 'gpu' missing (a preset name or a mapping of GPUSpec fields)")
    gpu = data["gpu"]
    if isinstance(gpu, str):
        data["gpu"] = get_gpu(gpu)
    elif isinstance(gpu, dict):
        data["gpu"] = construct(GPUSpec, gpu, path)
    else:
        raise SpecError(f"{path}: 'gpu' must be a preset name or a mapping of GPU fields")
    return construct(ClusterSpec, data, path)
