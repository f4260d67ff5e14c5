"""The actor side of `libra run --ray` and the connection to Ray.

`EngineHost` is the payload of one rollout actor (a one-instance `VLLMRolloutBackend`); `connect` joins a Ray
cluster or starts a local one, `check_address` fails fast (one line) when Ray is missing or an address is
malformed or unreachable. The driver side is `libra.adapters.ray_rollout.RayRolloutBackend`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from typing import Any

from libra.adapters.errors import AdapterError, RequestFailedError
from libra.adapters.types import EventKind, InstanceSpec, Sampling, StreamEvent, WeightUpdate

# driver environment passed to every actor (engines read these at start)
_ENV_PREFIXES = ("VLLM_", "HF_", "TOKENIZERS_", "OMP_", "LIBRA_")


class RayUnavailable(AdapterError):
    """Ray is not installed, or the cluster at the given address cannot be reached (one line, for the CLI)."""


# -- the actor side ---------------------------------------------------------------------------------------------


class EngineHost:
    """The payload of one rollout actor: a `VLLMRolloutBackend` with the one instance named after the worker.
    Request ids here are the driver's per-turn engine ids. Errors of a submit come back as FAILED events of the next
    poll; a finished or failed request is released at once (the driver keeps the context)."""

    def __init__(self, info: Any, *, model: str, dtype: str, seed: int, engine_options: dict[str, Any]) -> None:
        from libra.adapters.vllm_backend import VLLMRolloutBackend

        self.name = info.worker
        self.backend = VLLMRolloutBackend(
            model=model,
            dtype=dtype,
            seed=seed,
            engine_tp="one",
            sleep_mode="pause",
            engine_options=engine_options,
            failover=lambda *_: None,  # the driver re-queues: a dead engine here means a dead instance
        )
        self.errors: list[StreamEvent] = []
        self.version = -1

    def start(self, spec: InstanceSpec) -> dict[str, Any]:
        import ray

        self.backend.start_instance(spec)
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "engine_pids": list(self.engine_pids()),
        }

    def submit(self, engine_id: str, context: Sequence[int], sampling: Sampling) -> None:
        try:
            self.backend.submit(engine_id, self.name, context, sampling)
        except Exception as exc:  # noqa: BLE001 - reported to the driver as a FAILED event, never lost
            self.abort(engine_id)
            self.errors.append(
                StreamEvent(request_id=engine_id, instance=self.name, kind=EventKind.FAILED, error=f"{exc}")
            )

    def abort(self, engine_id: str) -> None:
        with contextlib.suppress(KeyError, RequestFailedError):
            self.backend.release(engine_id)

    def poll(self) -> tuple[list[StreamEvent], str | None]:
        """(events, None), or (events, cause) when the engine died (the instance is then gone)."""
        events, self.errors = self.errors, []
        events.extend(self.backend.poll())
        for ev in events:
            if ev.kind in (EventKind.FINISHED, EventKind.FAILED):
                self.abort(ev.request_id)
        dead = self.backend.deaths[-1].cause if self.backend.deaths else None
        if dead is None and self.name in self.backend.instances():  # e.g. died under a submit, nothing running
            from libra.adapters.vllm_engine import dead_reason

            dead = dead_reason(self.backend._get(self.name).engine)
        return [e for e in events if e.kind != EventKind.FAILED or dead is None], dead

    def load(self, update: WeightUpdate) -> int:
        if update.version < self.version:
            raise ValueError(f"instance {self.name!r} serves version {self.version}; refusing older {update.version}")
        self.backend.load_weights(update)
        self.version = update.version
        return self.backend.weight_version(self.name)

    def forget(self) -> None:
        self.version = -1
        self.backend.forget_weights()

    def weight_version(self) -> int:
        return self.backend.weight_version(self.name)

    def param_checksum(self, param: str) -> float:
        return self.backend.param_checksum(self.name, param)

    def prompt_ids(self, prompt: Any) -> list[int]:
        return self.backend.prompt_ids(prompt)

    def sleep(self) -> None:
        self.backend.sleep(self.name)

    def wake(self) -> None:
        self.backend.wake(self.name)

    def engine_pids(self) -> tuple[int, ...]:
        return self.backend.engine_pids(self.name) if self.name in self.backend.instances() else ()

    def shutdown(self) -> None:
        self.backend.shutdown()


def check_address(address: str) -> None:
    """Fail fast (`RayUnavailable`, one line) when Ray is not installed or `address` is malformed or unreachable
    (a TCP connect to host:port; "local" and "auto" are checked when joining)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise RayUnavailable("--ray needs Ray, which is not installed here (pip install 'libra[ray]')") from None
    if address not in ("local", "auto"):
        _reachable(address)


def connect(address: str, *, nodes: int, env: dict[str, str] | None = None) -> bool:
    """Join the Ray cluster at `address` ("auto": the one this machine belongs to; "host:port" or
    "ray://host:port"), or start a local one ("local") advertising `libra_node_0 .. nodes-1`. Returns whether it
    started Ray (its caller then shuts it down). Already connected: nothing to do (False)."""
    check_address(address)
    import ray

    if ray.is_initialized():
        return False
    options: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "runtime_env": {"env_vars": dict(env if env is not None else actor_env())},
    }
    if address == "local":
        from libra.adapters.ray_launcher import NODE_RESOURCE

        resources = {NODE_RESOURCE.format(k): 1.0 for k in range(nodes)}
        ray.init(num_cpus=max(1, min(2, os.cpu_count() or 1)), resources=resources, **options)
        return True
    try:
        ray.init(address=address, **options)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ...: one line for the user
        ray.shutdown()
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RayUnavailable(f"cannot join the Ray cluster at {address!r}: {first}") from None
    return False


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise RayUnavailable(f"Ray address {address!r} is not 'auto', 'local', 'host:port' or 'ray://host:port'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc}") from None


def actor_env() -> dict[str, str]:
    """The driver's environment the actors need: this `libra` first on PYTHONPATH, engine and Hub settings."""
    import libra

    root = os.path.dirname(os.path.dirname(os.path.abspath(libra.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
    return {**env, "PYTHONPATH": path}


__all__ = ["EngineHost", "RayUnavailable", "actor_env", "check_address", "connect"]
