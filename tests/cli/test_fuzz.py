"""Bad input over the CLI and the loaders: 200 seeded cases (tests/cli/fuzz_cases.py), each in a forked child with a
time limit (tests.limits.scaled) and a memory limit (RLIMIT_AS). Every case must end in a result (exit 0) or ONE
error line (exit 2): no traceback, no `internal error`, no crash, no hang, no allocation past the limit.
`scripts/fuzz_cli.py` runs the same generator at a larger scale (docs/testing.md has its table)."""

from __future__ import annotations

import collections

import pytest

from tests.cli.fuzz_cases import cases, memory_limit, run_case
from tests.limits import scaled

CASES = 200


@pytest.mark.slow  # about one second per case
def test_bad_input_never_breaks_the_cli_contract(tmp_path) -> None:
    import libra.cli  # noqa: F401 - imported once in the parent; every child starts from it

    limit = memory_limit(3.0)
    verdicts: collections.Counter = collections.Counter()
    broken = []
    for i, case in enumerate(cases(seed=20261201, count=CASES)):
        outcome = run_case(case, tmp_path / str(i), timeout_s=scaled(60.0), memory_bytes=limit)
        verdicts[outcome.verdict] += 1
        if outcome.verdict not in ("ok", "error", "usage"):
            broken.append(f"{outcome.verdict}: libra {' '.join(case.argv)}: {outcome.stderr.strip()[-300:]}")
    print(f"fuzz: {dict(verdicts)}")
    assert not broken, "\n".join(broken)
    assert verdicts["error"] + verdicts["usage"] >= CASES // 2  # most cases are bad input, not results


def test_the_fuzz_runner_sees_a_traceback_and_a_hang(tmp_path, monkeypatch) -> None:
    """The runner's verdicts are real: a crashing and a hanging command are caught as such."""
    from tests.cli import fuzz_cases

    def explode(argv):
        raise RuntimeError("boom")

    def spin(argv):
        while True:
            pass

    limit = memory_limit(1.0)
    case = fuzz_cases.Case("plan", ("plan",))
    monkeypatch.setattr("libra.cli.main", explode)
    assert run_case(case, tmp_path / "a", timeout_s=scaled(30.0), memory_bytes=limit).verdict == "traceback"
    monkeypatch.setattr("libra.cli.main", spin)
    assert run_case(case, tmp_path / "b", timeout_s=1.0, memory_bytes=limit).verdict == "hang"
