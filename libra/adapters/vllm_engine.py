"""Engine-level helpers of the vLLM backend: platform sleep support, liveness, a step that cannot hang on a dead
engine, shutdown. They touch vLLM client internals (`engine_core.resources`, `outputs_queue`) behind `getattr`
guards, because vLLM 0.32 has no public liveness API for a synchronous `LLMEngine`."""

from __future__ import annotations

import contextlib
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


def guarded_step(engine: Any, check_s: float = 0.5) -> list[Any]:
    """`engine.step()`, which must not block forever on a dead engine.

    vLLM 0.32's synchronous client waits on its output queue; when the engine-core process dies, its monitor shuts
    the client down without waking that wait. A watchdog thread checks the process while the step runs and, if it
    died, puts vLLM's own `EngineDeadError` into the queue so that the step raises it."""
    import threading

    queue = getattr(engine.engine_core, "outputs_queue", None)
    if queue is None:  # in-process engine core: a death raises directly
        return engine.step()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(check_s):
            reason = dead_reason(engine)
            if reason is not None:
                from vllm.v1.engine.exceptions import EngineDeadError

                queue.put_nowait(EngineDeadError(reason))
                return

    watchdog = threading.Thread(target=watch, name="libra-vllm-watchdog", daemon=True)
    watchdog.start()
    try:
        return engine.step()
    finally:
        done.set()
        watchdog.join()


def shutdown(engine: Any) -> None:
    if engine is None:
        return
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        with contextlib.suppress(Exception):  # a dead engine may fail to shut down cleanly; it is gone anyway
            core.shutdown()
