"""`RoutedRollout.run` with requests that fail, on a scripted backend (engines cannot fail on cue): a failed request
is aborted in the router (it learns nothing from it, and its books are empty after the rollout); one that failed
before its first turn ended has no trajectory (the trace schema wants a turn), instead of an exception that
stopped the whole rollout."""

from __future__ import annotations

from libra.adapters.routing import RoutedRollout
from libra.adapters.types import Sampling
from libra.scheduling import make_router
from libra.spec import Bucket
from tests.runtime.test_rollout_contracts import _Scripted


class _Learning:
    """The fcfs router, with what it was told to learn written down."""

    def __init__(self) -> None:
        self.inner = make_router("fcfs", (Bucket(tp=1, max_tokens=float("inf")),))
        self.finished: list[str] = []
        self.aborted: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def finish(self, request_id, trajectory) -> None:
        self.finished.append(request_id)
        self.inner.finish(request_id, trajectory)

    def abort(self, request_id) -> None:
        self.aborted.append(request_id)
        self.inner.abort(request_id)


def test_requests_that_fail_before_their_first_turn_ends_are_aborted_and_have_no_trajectory() -> None:
    backend = _Scripted(length=3, names=("i0", "i1"))
    router = _Learning()
    rollout = RoutedRollout(backend=backend, router=router, bucket_instances={0: ("i0", "i1")})
    prompts = {f"r{k}": (f"p{k}", [5, 6, 7]) for k in range(4)}
    backend.die("i0")  # at the first poll: the requests it holds fail before any turn ends
    results = rollout.run(prompts, sampling=Sampling(max_tokens=8), tool=lambda *a: None, max_turns=1)
    failed = sorted(rid for rid, r in results.items() if r.error is not None)
    ok = sorted(rid for rid, r in results.items() if r.error is None)
    assert failed and ok and sorted(failed + ok) == sorted(prompts)
    assert all(results[rid].trajectory is None for rid in failed)
    assert all(results[rid].trajectory.turns[0].gen_tokens == 3 for rid in ok)
    assert sorted(router.aborted) == failed and sorted(router.finished) == ok
    assert router.num_active == 0 and router.context_in_flight == 0
