"""Versioned snapshots of model + optimizer state, packed into contiguous buckets (see :mod:`libra.elastic.pack`).

``version`` is the number of optimizer steps the state has taken. A snapshot holds the model's ``state_dict``
tensors (parameters and buffers, in order) and the optimizer's per-parameter state tensors, packed into buckets
with a checksum each (XXH3-64, see :mod:`libra.elastic.pack`), plus a JSON description (names, shapes, dtypes,
the optimizer's non-tensor state and ``param_groups``). :func:`restore` checks every checksum before it touches
the model, so a partial or corrupted snapshot is rejected, never applied. A snapshot whose buckets were
checksummed as they were written (by :func:`capture`, or by :meth:`~libra.elastic.wire.TcpLink.recv` as they
arrived) carries ``verified=True``, and :func:`restore` does not read them a second time.

:func:`state_digest` is a content hash of model + optimizer (the checksums of a packed copy): two replicas with
equal digests hold bitwise-identical state (up to hash collisions; tests also compare tensors).

A state on one GPU (CPU tensors beside it, such as Adam's step counts, are allowed) is packed by the CUDA path into
pinned host buckets with the same bytes and checksums as the CPU path, and restored into GPU tensors by it; so a
snapshot moves between a GPU replica and a CPU one either way. Mixing GPUs in one state is refused.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from libra.elastic.pack import (
    DEFAULT_BUCKET_BYTES,
    Layout,
    adopt,
    checksums,
    pack_checksummed,
    plan_layout,
    slot_view,
    sub_layout,
    unpack,
)
from libra.elastic.pack_gpu import pack_checksummed_cuda, unpack_cuda
from libra.elastic.wire import Kind, Message

_DTYPES = {
    str(d): d
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


class SnapshotError(ValueError):
    """A snapshot does not fit the model/optimizer it is restored into, or failed its checksum."""


@attrs.frozen(kw_only=True)
class Snapshot:
    version: int
    description: dict = attrs.field(eq=False)
    buckets: tuple[torch.Tensor, ...] = attrs.field(eq=False)
    checksums: tuple[int, ...]
    #: The checksums were computed from these very buffers as they were written (pack or receive), so
    #: :func:`restore` need not verify them again. Constructed snapshots default to False (verified on restore).
    verified: bool = attrs.field(default=False, eq=False)

    @property
    def nbytes(self) -> int:
        return sum(int(b.numel()) for b in self.buckets)

    def to_message(self) -> Message:
        info = {"description": self.description, "checksums": list(self.checksums)}
        return Message(
            kind=Kind.SNAPSHOT,
            step=self.version,
            version=self.version,
            info=info,
            blobs=self.buckets,
            checksums=self.checksums if self.verified else None,
        )

    @classmethod
    def from_message(cls, msg: Message) -> Snapshot:
        if msg.kind != Kind.SNAPSHOT:
            raise SnapshotError(f"expected a SNAPSHOT message, got {msg.kind.name}")
        sums = tuple(msg.info["checksums"])
        return cls(
            version=msg.version,
            description=msg.info["description"],
            buckets=msg.blobs,
            checksums=sums,
            verified=msg.checksums is not None and tuple(msg.checksums) == sums,
        )


def _entry(t: torch.Tensor) -> list:
    return [list(t.shape), str(t.dtype)]


def _collect(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[list[torch.Tensor], dict]:
    tensors: list[torch.Tensor] = []
    model_entries = []
    for name, t in model.state_dict().items():
        if t is None:  # a module's empty extra state (Megatron-core's `_extra_state` without Transformer Engine)
            model_entries.append([name, None, None])
            continue
        if not isinstance(t, torch.Tensor):
            raise SnapshotError(f"model state {name!r} is a {type(t).__name__}, not a tensor: a snapshot holds tensors")
        _check_packable(f"model tensor {name!r}", t)
        model_entries.append([name, *_entry(t)])
        tensors.append(t.detach())
    opt: dict[str, Any] = {"state": [], "param_groups": None}
    if optimizer is not None:
        sd = optimizer.state_dict()
        for pid in sorted(sd["state"]):
            slot = []
            for key in sorted(sd["state"][pid]):
                value = sd["state"][pid][key]
                if isinstance(value, torch.Tensor):
                    _check_packable(f"optimizer state {key!r} of parameter {pid}", value)
                    slot.append([key, "tensor", *_entry(value)])
                    tensors.append(value.detach())
                else:
                    slot.append([key, "value", value])
            opt["state"].append([pid, slot])
        opt["param_groups"] = sd["param_groups"]
        opt["type"] = type(optimizer).__name__
    if len({t.device for t in tensors if t.device.type == "cuda"}) > 1:
        raise SnapshotError("snapshot of a state on several GPUs: snapshot each device's part separately")
    return tensors, {"model": model_entries, "optimizer": opt}


def _check_packable(what: str, t: torch.Tensor) -> None:
    if t.device.type not in ("cpu", "cuda"):
        raise SnapshotError(f"{what} is on {t.device}: only cpu and cuda tensors are packed")
    if str(t.dtype) not in _DTYPES:
        raise SnapshotError(f"{what} is {t.dtype}, which is not supported; supported: {sorted(_DTYPES)}")


def _on_gpu(tensors: Sequence[torch.Tensor]) -> torch.device | None:
    """The GPU a state lives on (None for a CPU state). A GPU state's buckets are pinned host memory, packed by
    the CUDA path (:func:`~libra.elastic.pack_gpu.pack_checksummed_cuda`) with the bytes the CPU path writes."""
    return next((t.device for t in tensors if t.device.type == "cuda"), None)


def _layout(description: dict, nbytes: list[int]) -> Layout:
    return plan_layout(nbytes, bucket_bytes=description["bucket_bytes"])


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The tensors a snapshot of this model and optimizer holds, in its order."""
    return _collect(model, optimizer)[0]


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    backend: str = "auto",
) -> Snapshot:
    """Pack the current model + optimizer state (a copy: training may continue at once)."""
    tensors, description = _collect(model, optimizer)
    description["bucket_bytes"] = bucket_bytes
    return _capture_tensors(tensors, description, version, backend)


class PendingCapture:
    """:func:`capture` running on a background thread, so the copy overlaps the training step.

    Taken at a step boundary (after ``optimizer.step()`` of the previous step, before the next one): the model's
    buffers (BatchNorm statistics and the like, which a forward pass changes) are copied at once, on the calling
    thread; parameters and optimizer state are packed in the background. The caller must not change parameters or
    optimizer state until :meth:`wait_copied` returns (the elastic core waits at the end of ``reduce``, before the
    caller's ``optimizer.step()``), which is what the step protocol already guarantees. ``out``: buckets of an earlier
    snapshot to overwrite (ignored if the sizes differ), see :func:`~libra.elastic.pack.pack_checksummed`.

    A state on a GPU is packed on a CUDA stream of its own, which first waits for everything the calling thread's
    current stream had enqueued when the capture was taken (the last ``optimizer.step()``): the gather kernels and
    device-to-host copies run beside the next forward/backward, which reads the parameters but does not write
    them, and only the hashing of the landed buckets takes a CPU thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        version: int,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        backend: str = "auto",
        out: Sequence[torch.Tensor] | None = None,
    ) -> None:
        tensors, description = _collect(model, optimizer)
        params = {p.data_ptr() for p in model.parameters()}
        count = sum(1 for _, shape, _ in description["model"] if shape is not None)  # the model's tensors
        tensors = [t.clone() if i < count and t.data_ptr() not in params else t for i, t in enumerate(tensors)]
        description["bucket_bytes"] = bucket_bytes
        self.version = version
        layout = _layout(description, [t.numel() * t.element_size() for t in tensors])
        self.nbytes = layout.total_bytes
        if out is not None and [int(b.numel()) for b in out] != list(layout.bucket_sizes):
            out = None  # the state's shapes changed: new buckets
        self._args: tuple | None = (tensors, description, version, backend, out)
        self._device = _on_gpu(tensors)
        self._ready: torch.cuda.Event | None = None
        if self._device is not None:  # the pack's stream starts where the caller's stream is now
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(self._device))
        self._snapshot: Snapshot | None = None
        self._error: BaseException | None = None
        self._copied = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        threading.Thread(target=self._run, daemon=True, name=f"libra-capture-v{version}").start()

    def _run(self) -> None:
        try:
            assert self._args is not None  # set in __init__, cleared only here
            tensors, description, version, backend, out = self._args
            if self._ready is None:
                self._snapshot = _capture_tensors(tensors, description, version, backend, out)
            else:
                stream = torch.cuda.Stream(self._device)
                stream.wait_event(self._ready)
                with torch.cuda.stream(stream):
                    self._snapshot = _capture_tensors(
                        tensors, description, version, backend, out, on_copied=self._copied.set
                    )
        except BaseException as exc:  # reported by wait()
            self._error = exc
        finally:
            self._args = None
            self._copied.set()
            with self._lock:
                self._done.set()
                callbacks, self._callbacks = self._callbacks, []
            for fn in callbacks:
                fn()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the snapshot is packed (or its packing failed): on the packing thread, or at once on
        the calling thread if that has already happened. ``fn`` must not raise."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def done(self) -> bool:
        return self._done.is_set()

    def wait_copied(self, timeout: float | None = None) -> None:
        """Return once the state's bytes are all in the snapshot's buckets, so that the caller may change the
        parameters and optimizer state; raises what the packing raised, or TimeoutError. For a state on a GPU that
        is when the last device-to-host copy has landed, while the checksums may still be computed; on the CPU the
        copy and its checksum are one pass, so it is when :meth:`wait` would return."""
        if not self._copied.wait(timeout):
            raise TimeoutError(f"snapshot v{self.version} not copied within {timeout}s")
        if self._error is not None:
            raise self._error

    def wait(self, timeout: float | None = None) -> Snapshot:
        """The snapshot, once packed; raises what the packing raised, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"snapshot v{self.version} not packed within {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._snapshot is not None
        return self._snapshot


def _capture_tensors(
    tensors: list[torch.Tensor],
    description: dict,
    version: int,
    backend: str,
    out: Sequence[torch.Tensor] | None = None,
    on_copied: Callable[[], None] | None = None,
) -> Snapshot:
    layout = _layout(description, [t.numel() * t.element_size() for t in tensors])
    if _on_gpu(tensors) is None:
        buckets, sums = pack_checksummed(tensors, layout, backend=backend, out=out if backend == "auto" else None)
    elif backend == "auto":
        pinned = out is not None and all(b.is_pinned() or not b.numel() for b in out)
        buckets, sums = pack_checksummed_cuda(tensors, layout, out=out if pinned else None, on_copied=on_copied)
    else:  # the reference: each tensor copied to the CPU, then packed there
        buckets, sums = pack_checksummed([t.cpu() for t in tensors], layout, backend=backend)
    return Snapshot(
        version=version, description=description, buckets=tuple(buckets), checksums=tuple(sums), verified=True
    )


def restore(
    snapshot: Snapshot,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    backend: str = "auto",
    share_buckets: bool = False,
) -> None:
    """Overwrite model (in place) and optimizer state with the snapshot, after verifying every bucket checksum
    (unless the snapshot is ``verified``).

    ``share_buckets=True``: nothing is copied. The model's parameters and buffers are rebound to their slots of
    the snapshot's buckets (:func:`~libra.elastic.pack.adopt`: the same ``Parameter`` objects, so the optimizer and
    the modules keep them), and the optimizer's new state tensors are views into the buckets. Only for buckets
    nobody else reuses, such as the fresh ones a received snapshot arrives in; the model's old memory is released."""
    if len(snapshot.buckets) != len(snapshot.checksums):
        raise SnapshotError(f"{len(snapshot.buckets)} buckets but {len(snapshot.checksums)} checksums")
    if not snapshot.verified:
        for i, (got, want) in enumerate(zip(checksums(snapshot.buckets), snapshot.checksums, strict=True)):
            if got != want:
                raise SnapshotError(f"snapshot v{snapshot.version}: bucket {i} fails its checksum")
    desc = snapshot.description
    state = model.state_dict(keep_vars=True)
    targets: list[torch.Tensor] = []
    for name, shape, dtype in desc["model"]:
        t = state.get(name)
        if shape is None:  # an empty extra state: nothing to restore, as long as the model's is empty too
            if t is not None:
                raise SnapshotError(f"model state {name!r}: the snapshot's is empty, the model's is {type(t).__name__}")
            continue
        if t is None or list(t.shape) != shape or str(t.dtype) != dtype:
            have = None if t is None else _entry(t)
            raise SnapshotError(f"model tensor {name!r}: snapshot has {[shape, dtype]}, model has {have}")
        targets.append(t)
    _check_optimizer_fits(desc["optimizer"], optimizer)
    opt_specs: list[tuple[list[int], torch.dtype]] = []
    for _pid, slot in desc["optimizer"]["state"]:
        for _key, kind, *rest in slot:
            if kind == "tensor":
                opt_specs.append((rest[0], _DTYPES[rest[1]]))
    nbytes = [t.numel() * t.element_size() for t in targets]
    nbytes += [math.prod(shape) * torch.empty(0, dtype=dtype).element_size() for shape, dtype in opt_specs]
    layout = _layout(desc, nbytes)
    if layout.bucket_sizes != tuple(int(b.numel()) for b in snapshot.buckets):
        raise SnapshotError(f"bucket sizes {[int(b.numel()) for b in snapshot.buckets]} != {layout.bucket_sizes}")
    first = len(targets)
    if share_buckets:
        # The module's own parameters and buffers are rebound to their slots; a state_dict entry that is not one
        # of them (made by a hook, say) is copied into, since rebinding it would not reach the model.
        own = {id(t) for t in (*model.parameters(), *model.buffers())}
        adopted = [i for i, t in enumerate(targets) if id(t) in own and t.device.type == "cpu"]
        opt_tensors = [
            slot_view(snapshot.buckets, layout, first + i, shape, dtype) for i, (shape, dtype) in enumerate(opt_specs)
        ]
        copied = sorted(set(range(first)) - set(adopted))
    else:
        adopted = []
        opt_tensors = _reusable_state(optimizer, desc["optimizer"]["state"], opt_specs)
        copied = list(range(first + len(opt_specs)))
    opt_state: dict[int, dict[str, Any]] = {}
    made = iter(opt_tensors)
    for pid, slot in desc["optimizer"]["state"]:
        opt_state[int(pid)] = {key: next(made) if kind == "tensor" else rest[0] for key, kind, *rest in slot}
    dests = [*targets, *opt_tensors]
    staging = [
        dests[i] if dests[i].is_contiguous() else torch.empty_like(dests[i], memory_format=torch.contiguous_format)
        for i in copied
    ]
    on_cpu = [k for k, t in enumerate(staging) if t.device.type == "cpu"]
    on_gpu = [k for k, t in enumerate(staging) if t.device.type == "cuda"]
    if len(on_cpu) + len(on_gpu) != len(copied):
        other = next(s.device for s in staging if s.device.type not in ("cpu", "cuda"))
        raise SnapshotError(f"restore into {other} tensors: only cpu and cuda tensors are restored")
    with torch.no_grad():
        unpack(
            snapshot.buckets,
            [staging[k] for k in on_cpu],
            sub_layout(layout, [copied[k] for k in on_cpu]),
            backend=backend,
        )
        if on_gpu:
            gpu_layout = sub_layout(layout, [copied[k] for k in on_gpu])
            gpu_staging = [staging[k] for k in on_gpu]
            if backend == "auto":
                unpack_cuda(snapshot.buckets, gpu_staging, gpu_layout)
            else:  # the reference: unpacked on the CPU, then copied to the GPU
                cpu_copies = [torch.empty_like(t, device="cpu") for t in gpu_staging]
                unpack(snapshot.buckets, cpu_copies, gpu_layout, backend=backend)
                for t, c in zip(gpu_staging, cpu_copies, strict=True):
                    t.copy_(c)
        for i, s in zip(copied, staging, strict=True):
            if s is not dests[i]:
                dests[i].copy_(s)
        adopt(snapshot.buckets, [targets[i] for i in adopted], sub_layout(layout, adopted))
    if optimizer is not None and desc["optimizer"]["param_groups"] is not None:
        optimizer.load_state_dict({"state": opt_state, "param_groups": desc["optimizer"]["param_groups"]})


def _check_optimizer_fits(saved: dict, optimizer: torch.optim.Optimizer | None) -> None:
    """The snapshot's optimizer state must load into ``optimizer`` (same type, parameter groups of the same sizes):
    checked before anything is written, since ``load_state_dict`` comes last and would refuse it (or fail on the
    first step) with the model already overwritten. Snapshots from before the type was recorded are not checked
    for it."""
    if optimizer is None or saved["param_groups"] is None:
        return
    kind = saved.get("type")
    if kind is not None and kind != type(optimizer).__name__:
        raise SnapshotError(f"optimizer: the snapshot's is {kind}, the one restored into is {type(optimizer).__name__}")
    have = [len(g["params"]) for g in optimizer.param_groups]
    want = [len(g["params"]) for g in saved["param_groups"]]
    if have != want:
        raise SnapshotError(
            f"optimizer: the snapshot's parameter groups hold {want} parameters, the optimizer's {have}"
        )


def _reusable_state(
    optimizer: torch.optim.Optimizer | None, saved: list, specs: list[tuple[list[int], torch.dtype]]
) -> list[torch.Tensor]:
    """Targets for the optimizer's state tensors: the optimizer's own tensor where it already holds one of the
    same key, shape and dtype (overwritten in place after verification: memory already mapped, no page faults),
    else a new one."""
    current = optimizer.state_dict()["state"] if optimizer is not None else {}
    out: list[torch.Tensor] = []
    specs_iter = iter(specs)
    for pid, slot in saved:
        have = current.get(int(pid), {})
        for key, kind, *_ in slot:
            if kind != "tensor":
                continue
            shape, dtype = next(specs_iter)
            t = have.get(key)
            fits = isinstance(t, torch.Tensor) and t.device.type in ("cpu", "cuda") and t.is_contiguous()
            if fits and list(t.shape) == list(shape) and t.dtype == dtype and not _aliases(t, out):
                out.append(t)
            else:
                out.append(torch.empty(shape, dtype=dtype))
    return out


def _aliases(t: torch.Tensor, others: list[torch.Tensor]) -> bool:
    """Whether ``t`` shares memory with a tensor already chosen (two state entries must not land in one tensor)."""
    ptr = t.untyped_storage().data_ptr()
    return t.numel() > 0 and any(o.numel() > 0 and o.untyped_storage().data_ptr() == ptr for o in others)


def state_digest(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *, backend: str = "auto"
) -> tuple[int, ...]:
    """The checksum of every bucket of a packed copy of model + optimizer state."""
    return capture(model, optimizer, version=0, backend=backend).checksums
