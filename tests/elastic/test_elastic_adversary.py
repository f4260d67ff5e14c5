"""Stale, misversioned, misplaced and malformed contributions are skipped, never applied."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import elastic_adversary as A  # noqa: E402
import elastic_harness as H  # noqa: E402

from tests.limits import scaled  # noqa: E402


@pytest.mark.multiproc
@pytest.mark.timeout(scaled(120))
def test_only_current_real_gradients_of_active_replicas_are_applied(tmp_path):
    (out,) = H.run_processes([(A.adversary, ())], tmp=tmp_path, timeout_s=scaled(100))
    by_action = {entry[0]: entry for entry in out["peer_log"]}
    assert [e[0] for e in out["peer_log"]] == A.SCRIPT
    steps = {r["step"]: r for r in out["results"]}
    for action, step, mode, *_ in out["peer_log"]:
        r = steps[step]
        if action == "good" or action == "stale_then_good":
            assert mode == "active" and r["contributed"] == 2 and r["equals_mean_with_peer"], (action, r)
        else:
            assert r["contributed"] == 1 and r["equals_own"], (action, r)
    assert by_action["grad_while_placeholder"][2] == "placeholder"
    accepted, _placeholders, skipped, failures, missed = out["stats"]
    # skipped: wrong version, stale, wrong size, placeholder grad, and the late gradient (stale one step later)
    assert accepted == 2 and skipped == 5 and failures == 1 and missed == 1
    # the late peer was not detached: its only failure is the protocol violation at the end
    assert [s[2] for s in out["states"]].count("failed") == 1
    assert out["states"][-1][2] == "failed" and "protocol" in out["states"][-1][3]
