"""The example model, cluster and coefficients files of examples/ (documented in docs/files.md) load through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from libra.cli import main
from libra.planning.cost import CostCoefficients, load_coefficients
from libra.spec import load_cluster, load_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_example_files_load_and_plan(capsys) -> None:
    model = load_model(str(EXAMPLES / "model.yaml"))
    cluster = load_cluster(str(EXAMPLES / "cluster.yaml"))
    assert model.name == "Qwen3-8B" and cluster.num_gpus == 16 and cluster.gpu.memory_gb == 80
    assert load_coefficients(EXAMPLES / "coeffs" / "default.yaml") == CostCoefficients()  # 30e-6 and 9e-6 included
    argv = ["plan", "--json", "--prompts", "64", "--samples", "4"]
    argv += ["--model", str(EXAMPLES / "model.yaml"), "--cluster", str(EXAMPLES / "cluster.yaml")]
    argv += ["--coeffs", str(EXAMPLES / "coeffs" / "default.yaml")]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "Qwen3-8B" and out["cluster"]["gpus"] == 16
    assert out["makespan_s"] >= out["lower_bound_s"] > 0
