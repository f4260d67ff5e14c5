"""The workload generators read counts as `libra.spec.checks` does: numpy integers are counts (kept as Python
ints), a bool is none, and the error stays a one-line SpecError."""

from __future__ import annotations

import numpy as np
import pytest

from libra.spec import SpecError
from libra.workloads.generators import WorkloadGenerator, generate


def test_numpy_integers_are_sizes_seeds_and_steps() -> None:
    # before: "num_prompts must be an integer >= 1, got np.int64(2)" (a numpy step was taken, a numpy size not)
    gen = WorkloadGenerator("search-r1", seed=np.int64(3), num_prompts=np.int64(2), samples_per_prompt=np.int32(2))  # type: ignore[arg-type]
    assert (gen.num_prompts, gen.samples_per_prompt) == (2, 2) and type(gen.num_prompts) is int
    plain = WorkloadGenerator("search-r1", seed=3, num_prompts=2, samples_per_prompt=2)
    assert gen.step(1) == plain.step(1)
    sizes = {"num_steps": np.int64(2), "start_step": np.int64(1)}
    made = generate("search-r1", seed=3, num_prompts=2, samples_per_prompt=2, **sizes)  # type: ignore[arg-type]
    assert made == plain.step(1) + plain.step(2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_prompts": True}, "^num_prompts must be an integer >= 1, got True$"),
        ({"num_prompts": np.float64(2.0)}, r"^num_prompts must be an integer >= 1, got np.float64\(2.0\)$"),
        ({"seed": True}, "^seed must be a non-negative integer, got True$"),
        ({"seed": np.int64(-1)}, r"^seed must be a non-negative integer, got np.int64\(-1\)$"),
    ],
)
def test_bad_counts_are_one_line_spec_errors(kwargs, message) -> None:
    with pytest.raises(SpecError, match=message):
        WorkloadGenerator("search-r1", **{"seed": 0, **kwargs})
