import os

import pytest
from hypothesis import settings

# Hypothesis' default per-example deadline (200 ms) is a wall-clock assertion: on a loaded CI machine it fails
# properties for speed alone (seen: test_water_fill_places_every_request_and_levels_the_load at 257 ms, load 15).
# Speed belongs in benchmarks/, so no example has a deadline.
settings.register_profile("libra", deadline=None)
settings.load_profile("libra")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# With LIBRA_REQUIRE_ENGINES=1 (scripts/test.sh sets it) a test skipped because an engine or the C++ extension is
# missing fails instead: a broken install must not leave CI green. Skips for a missing GPU stay skips.
_REQUIRED_SKIP_MARKERS = ("could not import", "C++ extension not built", "No module named")


def _engines_required() -> bool:
    return os.environ.get("LIBRA_REQUIRE_ENGINES", "0") not in ("", "0", "false", "no")


def _turn_required_skip_into_failure(report) -> None:
    if not (report.skipped and _engines_required()):
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(marker in reason for marker in _REQUIRED_SKIP_MARKERS):
        report.outcome = "failed"
        report.longrepr = f"required engine or extension missing (LIBRA_REQUIRE_ENGINES=1): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _turn_required_skip_into_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _turn_required_skip_into_failure(outcome.get_result())


# Every test gets a ceiling, so a hang fails that one test with a traceback instead of eating CI's whole budget
# (a hung engine test once ran CI past 90 minutes with no output). Tests that set their own @pytest.mark.timeout keep
# it. The ceiling is generous: it bounds a wait, it never decides a pass (tests/limits.py).
_DEFAULT_TEST_CEILING_S = 300.0
_SLOW_TEST_CEILING_S = 600.0


def _scaled(seconds: float) -> float:
    # tests/limits.py loaded by path: in .venv-verl the name `tests` is verl's own package in site-packages
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_libra_test_limits", Path(__file__).with_name("limits.py"))
    assert spec is not None and spec.loader is not None
    limits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(limits)
    return float(limits.scaled(seconds))


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError("pytest-timeout is required (scripts/test.sh installs it): every test needs a ceiling")
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        ceiling = _SLOW_TEST_CEILING_S if item.get_closest_marker("slow") is not None else _DEFAULT_TEST_CEILING_S
        item.add_marker(pytest.mark.timeout(_scaled(ceiling), method="signal"))
