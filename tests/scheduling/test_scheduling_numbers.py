"""Scheduling numbers are read as `libra.spec.checks` reads them: numpy integers are counts, NaN is no size-class edge,
a bool is no number; errors stay one-line SpecErrors. (The router's own counts are Python ints by contract, and
refuse numpy integers with a hint to convert: tests/scheduling/test_router.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from libra.scheduling.states import StateCodec, ToolReturnState
from libra.scheduling.tree import PrefixTree
from libra.spec import SpecError


@pytest.mark.parametrize("edges", [(500, math.nan), (math.nan,), (500, True), (-1, 5)])
def test_size_class_edges_refuse_nan_and_bools(edges) -> None:
    # before: NaN passed (nan <= 0 is false), and bisect put every tool return past it
    with pytest.raises(SpecError, match=r"^size-class edges must be positive numbers, got "):
        StateCodec(size_edges=edges)


def test_numpy_edges_are_plain_numbers_in_the_codec_state() -> None:
    codec = StateCodec(size_edges=np.array([500, 5000]))
    assert codec.size_edges == (500, 5000) and json.loads(json.dumps(codec.config()))["size_edges"] == [500, 5000]
    assert StateCodec(size_edges=(np.float32(8.5), math.inf)).size_edges == (8.5, math.inf)  # type: ignore[arg-type]


def test_numpy_integers_are_size_classes_and_token_counts() -> None:
    # before: "ToolReturnState.size_class must be an integer >= 0, got np.int64(1)"
    assert ToolReturnState("search", np.int64(1), "ok").key() == "search|1|ok"  # type: ignore[arg-type]
    assert StateCodec().size_class(np.int64(600)) == 1  # type: ignore[arg-type]
    for bad in (True, -1, 2.0):
        with pytest.raises(SpecError, match=r"^tool_tokens must be a non-negative integer, got "):
            StateCodec().size_class(bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"^ToolReturnState\.size_class must be an integer >= 0, got True$"):
        ToolReturnState("search", True, "ok")


def test_prefix_tree_sizes_take_numpy_integers() -> None:
    # before: "PrefixTree.window must be an integer >= 1, got np.int64(50)"
    tree = PrefixTree(window=np.int64(50), max_nodes=np.int32(1000), max_depth=np.uint8(4))  # type: ignore[arg-type]
    assert (tree.window, tree.max_nodes, tree.max_depth) == (50, 1000, 4) and type(tree.window) is int
    with pytest.raises(SpecError, match=r"^PrefixTree\.window must be an integer >= 1, got True$"):
        PrefixTree(window=True)
