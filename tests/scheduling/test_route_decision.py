"""`router._decision` builds the value `RouteDecision(...)` builds (each slot set by its descriptor; issue 16, 5a)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.scheduling.router import RouteDecision, _decision

# every field a value of its own, so that a setter bound to another field shows
_ids = st.one_of(st.integers(), st.text(max_size=8), st.tuples(st.integers(), st.text(max_size=4)))


@settings(max_examples=200, deadline=None)
@given(
    request_id=_ids,
    bucket=st.integers(0, 7),
    migrate=st.booleans(),
    from_bucket=st.none() | st.integers(0, 7),
    migrated_tokens=st.integers(0, 10**6),
    reason=st.sampled_from(["admit", "stay", "tool-return", "overflow", "promote", "predicted"]),
)
def test_decision_is_the_value_the_attrs_init_builds(
    request_id, bucket, migrate, from_bucket, migrated_tokens, reason
) -> None:
    fields = {
        "request_id": request_id,
        "bucket": bucket,
        "migrate": migrate,
        "from_bucket": from_bucket,
        "migrated_tokens": migrated_tokens,
        "reason": reason,
    }
    fast = _decision(request_id, bucket, migrate, from_bucket, migrated_tokens, reason)
    built = RouteDecision(**fields)
    assert type(fast) is RouteDecision
    assert attrs.asdict(fast, recurse=False) == fields == attrs.asdict(built, recurse=False)
    assert fast == built
    assert hash(fast) == hash(built)
    assert repr(fast) == repr(built)


def test_decision_is_frozen_and_every_field_is_set() -> None:
    d = _decision("r", 2, True, 1, 300, "tool-return")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        d.bucket = 3  # type: ignore[misc]
    # (a slot left unset would raise AttributeError here)
    assert [getattr(d, f.name) for f in attrs.fields(RouteDecision)] == ["r", 2, True, 1, 300, "tool-return"]
