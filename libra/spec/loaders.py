"""Load a model or a cluster from a YAML or JSON file (keys are the attrs field names)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import yaml

from libra.spec.cluster import ClusterSpec
from libra.spec.errors import SpecError
from libra.spec.hardware import GPUSpec, get_gpu
from libra.spec.model import ModelSpec, get_model


def read_mapping(path: Path) -> dict[str, Any]:
    """The mapping at the top of a YAML or JSON file (`.json` is JSON, anything else YAML); SpecError otherwise."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of field names to values")
    return data


def construct(cls: type, data: dict[str, Any], path: Path) -> Any:
    """`cls(**data)`, with a one-line SpecError naming `path` for unknown fields or a bad call."""
    fields = {f.name for f in attrs.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise SpecError(
            f"{path}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; known: {', '.join(sorted(fields))}"
        )
    try:
        return cls(**data)
    except TypeError as exc:
        raise SpecError(f"{path}: {exc}") from None


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name, or a YAML/JSON file with ModelSpec fields."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json"):
        data = read_mapping(path)
        data.setdefault("name", path.stem)
        return construct(ModelSpec, data, path)
    return get_model(name_or_path)


def load_cluster(path_text: str) -> ClusterSpec:
    """A YAML/JSON file: `gpu` (a preset name or a mapping of GPUSpec fields), `num_nodes`, `gpus_per_node`."""
    path = Path(path_text)
    data = read_mapping(path)
    gpu = data.get("gpu")
    if isinstance(gpu, str):
        data["gpu"] = get_gpu(gpu)
    elif isinstance(gpu, dict):
        data["gpu"] = construct(GPUSpec, gpu, path)
    else:
        raise SpecError(f"{path}: 'gpu' must be a preset name or a mapping of GPU fields")
    return construct(ClusterSpec, data, path)
