"""C-MLFQ's numeric options go through the shared checks (`libra.spec.checks`): one message shape,
"cmlfq.<option> must be <what>, got <value!r>", for a wrong type and for a value out of range alike, and numpy's
integers are integers everywhere (before, `repay`, `min_count` and `admit_min_count` passed the type check as numpy
integers and were then refused by the range check as "not an integer")."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from libra.scheduling import make_router
from libra.scheduling.cmlfq import CMLFQRouter
from libra.spec import SpecError, parse_buckets

BUCKETS = parse_buckets("2:5000,4:15000,8:inf")


@pytest.mark.parametrize(
    ("option", "value", "what"),
    [
        ("confidence", 0.0, "a finite number > 0 and <= 1"),
        ("confidence", math.inf, "a finite number > 0 and <= 1"),
        ("price", -0.5, r"a number >= 0 \(inf allowed\)"),
        ("admit_margin", 1.5, r"a fraction in \[0, 1\]"),
        ("cost_ratio", math.nan, r"a number >= 0 \(inf allowed\)"),
        ("budget", 1.0, "a finite number > 0 and < 1 or None"),
        ("ceiling", 0.0, "a finite number > 0 and <= 1 or None"),
        ("repay", 0, "an integer >= 1 or None"),
        ("min_count", 0, "an integer >= 1"),
        ("admit_min_count", 2.0, "an integer >= 1 or None"),
        ("shrink", "fast", "a number >= 0 or 'auto'"),
        ("shrink", -1.0, "a number >= 0 or 'auto'"),
        ("seed", 1.5, "an integer"),
        ("rule", "vote", "one of 'mean-p90', 'median', 'probability', 'priced'"),
        ("cold", "warm", "one of 'promote', 'stay', 'budget'"),
        ("beyond", None, "one of 'promote', 'root'"),
    ],
)
def test_an_option_out_of_range_is_one_line_in_the_shared_shape(option, value, what) -> None:
    message = rf"^cmlfq\.{option} must be {what}, got {re.escape(repr(value))}$"
    with pytest.raises(SpecError, match=message):
        make_router("cmlfq", BUCKETS, preset="adaptive", **{"budget": 0.1, option: value})


def test_numpy_integers_are_counts_and_stored_as_ints() -> None:
    router = CMLFQRouter.create(
        BUCKETS,
        preset="adaptive",
        repay=np.int64(3),
        min_count=np.int32(2),
        admit_min_count=np.int64(4),
        ceiling=np.float64(0.5),
    )
    assert (router.repay, router.min_count, router.admit_min_count) == (3, 2, 4)
    assert type(router.repay) is int and type(router.min_count) is int and type(router.admit_min_count) is int


def test_a_price_nothing_pays_is_still_an_option() -> None:
    """`price` and `cost_ratio` took inf before the shared checks (only NaN was refused): they still do."""
    router = CMLFQRouter.create(BUCKETS, preset="adaptive", price=math.inf, cost_ratio=math.inf)
    assert router.price == math.inf and router.cost_ratio == math.inf
