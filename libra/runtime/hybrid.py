"""Hybrid replicas inside a run: rollout workers lent to training while the rollout side is idle.

The core trainer of the run (the torch trainer of the orchestrator) becomes the one core replica of a
:class:`~libra.elastic.core.CoreExchange` (a one-rank gloo group of its own, no global process group). A hybrid
worker is a separate process holding the same tiny model (:func:`hybrid_main`); it stands for a rollout worker of
the virtual cluster. :class:`HybridPool` (on the orchestrator's side) decides, before each training step, whether
to lend it (``JoinTraining``: the process connects, sends JOIN, fetches and restores the core's snapshot, ATTACHes,
is a placeholder for one step and becomes active once it holds every reduced gradient) or to hand it back
(``LeaveTraining``: the core detaches it at its next step; the process goes back to waiting). Every decision and
every join-state transition is recorded with source ``elastic``.

The global batch of a step is fixed: with ``R`` replicas contributing, each computes the loss of its shard as
``-sum_shard(m * A * log p) / M`` (``M``: the masked tokens of the whole batch) times ``R``; the exchange's mean over
the ``R`` contributions is then exactly the gradient of the whole batch's loss, and the step's loss is the sum of
the shard parts (the hybrid reports its part over a pipe before it sends its gradient). If a contribution is
missing (the hybrid died, timed out or was late), the core computes that shard itself before its optimizer step,
so no trajectory goes untrained, and detaches any hybrid still attached (it received the partial mean, so its
state no longer equals the core's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libra.runtime.config import HybridSettings
from libra.spec.files import atomic_open

log = logging.getLogger("libra.runtime")

CORE = "train-0"


def shard_part(model: Any, batch: dict[str, Any], tokens: Any) -> Any:
    """``-sum(m * A * log p) / tokens`` over the rows of ``batch``: the shard's part of the whole batch's GRPO loss
    (the parts of all shards add up to :func:`libra.adapters.grpo.policy_loss` of the whole batch)."""
    import torch

    ids, mask, adv = batch["input_ids"], batch["loss_mask"], batch["advantages"]
    logits = model(input_ids=ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return -(logp * mask[:, 1:] * adv[:, None]).sum() / tokens


def batch_tokens(batch: dict[str, Any]) -> Any:
    return batch["loss_mask"][:, 1:].sum().clamp(min=1.0)


# -- the hybrid process -----------------------------------------------------------------------------------------


def hybrid_main(conn: Any, settings: dict[str, Any]) -> None:
    """Body of a hybrid worker process: load the model, lay its state out for a first join (``prepare``), then
    serve ``("join", host, port)`` commands until ``("exit",)``, every stay through one :class:`HybridReplica`, so
    that each join receives its snapshot into the memory the state lives in. Reports over ``conn``: ready,
    join_sent, restored (version, buckets received in place, buckets), loss (step, part), left, failed."""
    import torch
    from transformers import LlamaForCausalLM

    from libra.adapters.torch_ddp import TorchDDPTrainer
    from libra.elastic.hybrid import HybridReplica

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the orchestrator's: it tells this worker to exit
    torch.manual_seed(settings["seed"])
    torch.set_num_threads(1)
    trainer = TorchDDPTrainer(
        model=LlamaForCausalLM.from_pretrained(settings["model_dir"]),
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=settings["lr"]),
    )
    kill_at, current = settings.get("kill_at_step"), {"step": -1}

    def fault(point: str) -> None:
        if point == "fetching":
            conn.send(("join_sent",))
        elif point == "active" and kill_at is not None and current["step"] >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: die mid-step, gradient computed, not sent

    hy = HybridReplica(
        worker=settings["worker"],
        model=trainer.module,
        optimizer=trainer.optimizer,
        timeout_s=settings["timeout_s"],
        max_missed=settings["max_missed"],
        fault=fault,
    )
    # the optimizer's state first (a step of zero gradients; the snapshot replaces it), so that the layout is the
    # core's and the first join receives into the buckets laid out here, touched while the worker waits
    for g in trainer.local_grads():
        g.zero_()
    trainer.optimizer.step()
    hy.prepare()
    try:
        conn.send(("ready", os.getpid()))
        while True:
            cmd = conn.recv()
            if cmd[0] == "exit":
                return
            try:
                conn.send(("left", _serve_join(conn, trainer, hy, current, cmd[1], cmd[2], settings)))
            except (EOFError, BrokenPipeError):
                raise
            except Exception as exc:  # noqa: BLE001 - reported to the orchestrator; the process waits for a new join
                conn.send(("failed", f"{type(exc).__name__}: {exc}"[:300]))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the orchestrator is gone: so is this worker


def _serve_join(
    conn: Any, trainer: Any, hy: Any, current: dict[str, int], host: str, port: int, settings: dict[str, Any]
) -> int:
    """One stay in training: join, train until the core detaches this worker; returns the state version."""
    from libra.adapters.grpo import shard_batch
    from libra.elastic.grads import Mode
    from libra.elastic.wire import TcpLink

    timeout_s = settings["timeout_s"]
    current["step"] = -1
    hy.join(TcpLink.connect(host, port, timeout=timeout_s), snapshot_timeout_s=timeout_s)
    conn.send(("restored", hy.version, *hy.in_place))
    part: dict[str, float] = {}

    def hook(step: int, grads: Any) -> None:
        conn.send(("loss", step, part["part"]))  # before the gradient: the core reads it after its reduce
        hy.reduce(step, grads)

    while (a := hy.begin_step()) is not None:
        current["step"] = a.step
        if a.mode != Mode.ACTIVE:
            grads = trainer.local_grads()
            for g in grads:
                g.zero_()
            hy.reduce(a.step, grads)
            trainer.optimizer.step()
            continue
        data = _load_batch(Path(settings["batch_dir"]), a.step, timeout_s)
        batch = data["batch"]
        trainer.loss_fn = _scaled_loss(data["tokens"], a.num_replicas, part)
        trainer.train_step(shard_batch(batch, a.shard(len(batch["advantages"]))), grad_hook=hook, step=a.step)
    hy.prepare()  # (a copy only where the stay left state outside the buckets: it began at the core's step 0)
    return hy.version


def _scaled_loss(tokens: Any, replicas: int, part: dict[str, float]) -> Callable[[Any, Any], Any]:
    def loss_fn(model: Any, batch: Any) -> Any:
        value = shard_part(model, batch, tokens)
        part["part"] = float(value.detach())
        return value * replicas

    return loss_fn


def _load_batch(batch_dir: Path, step: int, timeout_s: float) -> dict[str, Any]:
    import torch

    path = batch_dir / f"step-{step}.pt"
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no batch for step {step} in {batch_dir} after {timeout_s:.0f} s")
        time.sleep(0.01)
    return torch.load(path, weights_only=False)


# -- the orchestrator's side ------------------------------------------------------------------------------------


class _Worker:
    """One hybrid process and a thread reading its reports."""

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.name = name
        self.exit_timeout_s = settings["timeout_s"]  # a stay ended by the core's LEAVE, then the process's exit
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=hybrid_main, args=(child, settings), name=f"libra-{name}", daemon=True)
        self.proc.start()
        child.close()
        self.inbox: list[tuple] = []
        self.cond = threading.Condition()
        self.eof = False
        self.ready = False
        self.in_session = False  # joined and not yet reported "left" or "failed"
        threading.Thread(target=self._read, name=f"libra-{name}-reader", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                with self.cond:
                    self.eof = True
                    self.cond.notify_all()
                return
            with self.cond:
                self.inbox.append(msg)
                self.cond.notify_all()

    def wait_for(self, kind: str, timeout_s: float, match: Callable[[tuple], bool] = lambda m: True) -> tuple:
        """The next report of ``kind`` (and ``match``); a "failed" report raises unless ``kind`` is "failed"."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for i, msg in enumerate(self.inbox):
                    if (msg[0] == kind or (kind == "end" and msg[0] in ("left", "failed"))) and match(msg):
                        return self.inbox.pop(i)
                    if msg[0] == "failed" and kind != "end":
                        self.inbox.pop(i)
                        raise RuntimeError(f"hybrid {self.name}: {msg[1]}")
                if self.eof:
                    self.proc.join(5.0)
                    raise RuntimeError(f"hybrid {self.name}: process exited (code {self.proc.exitcode})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"hybrid {self.name}: no {kind!r} within {timeout_s:.0f} s")
                self.cond.wait(min(left, 1.0))

    def alive(self) -> bool:
        return self.proc.is_alive()

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(("exit",))
            self.proc.join(self.exit_timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        self.conn.close()


class HybridPool:
    """Lends hybrid workers to the core trainer and carries each step's elastic side out.

    Orchestrator thread: :meth:`decide` (before each training step), :meth:`release_all` (an applied replan),
    :meth:`take_events`, :meth:`close`. Trainer thread: :meth:`core_step` (the core's training step: queued
    leaves, ``begin_step``, its shard, ``reduce``, a missing shard computed here, the optimizer step)."""

    def __init__(
        self,
        settings: HybridSettings,
        *,
        trainer: Any,
        model_dir: str,
        out_dir: Path,
        seed: int,
        lr: float,
        max_staleness: int,
        clock: Any,
        kill_at_step: int | None = None,
    ) -> None:
        import torch.distributed as dist

        from libra.elastic.core import CoreExchange
        from libra.elastic.wire import SideChannelServer

        self.settings, self.trainer, self.clock = settings, trainer, clock
        self.max_staleness = max_staleness
        self.batch_dir = out_dir / "hybrid"
        self.batch_dir.mkdir(parents=True, exist_ok=True)
        self.names = tuple(f"hybrid-{i}" for i in range(settings.workers))
        self._spawn = {
            "model_dir": model_dir,
            "seed": seed,
            "lr": lr,
            "timeout_s": settings.timeout_s,
            # the hybrid waits for the core's next step through a whole rollout (engine restarts included)
            "max_missed": settings.max_missed * 4,
            "batch_dir": str(self.batch_dir),
            "kill_at_step": kill_at_step,
        }
        self.workers: dict[str, _Worker] = {}
        self.lent: dict[str, int] = {}  # worker -> training step at which it was lent
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._leaves: list[tuple[str, str]] = []  # (worker, why), carried out at the core's next step
        self._rollouts: list[tuple[float, float]] = []
        self._last_train: tuple[float, float] | None = None
        self._switch_start: dict[str, float] = {}
        self._active_failed: list[str] = []
        self._lost: dict[str, int] = {}  # worker -> training step at which it was lost
        self._left: dict[str, int] = {}  # worker -> training step at which it was handed back
        self._core_prepared = False  # the core's snapshot buckets laid out (`CoreExchange.prepare`)
        self.server = SideChannelServer(host="127.0.0.1", port=0)
        self.exchange = CoreExchange(
            core_group=dist.ProcessGroupGloo(dist.HashStore(), 0, 1),
            core_rank=0,
            num_core_replicas=1,
            model=trainer.module,
            optimizer=trainer.optimizer,
            timeout_s=settings.timeout_s,
            snapshot_timeout_s=settings.timeout_s,
            max_missed=settings.max_missed,
            server=self.server,
            on_transition=self._on_transition,
        )
        if max_staleness == 0 or settings.min_idle_fraction <= 0:  # lent from step 0: start the processes now
            for name in self.names:
                self._worker(name)

    @classmethod
    def for_run(
        cls, config: Any, trainer: Any, model_dir: str, out: Path, clock: Any, kill_at: int | None
    ) -> HybridPool:
        return cls(
            config.hybrid,
            trainer=trainer,
            model_dir=model_dir,
            out_dir=out,
            seed=config.seed,
            lr=config.lr,
            max_staleness=config.max_staleness,
            clock=clock,
            kill_at_step=kill_at,
        )

    # -- orchestrator thread --------------------------------------------------------------------------------------

    def note_rollout(self, start: float, end: float) -> None:
        self._rollouts.append((start, end))

    def note_train(self, start: float, end: float) -> None:
        self._last_train = (start, end)

    def idle_fraction(self) -> float | None:
        """Share of the last training step during which no rollout ran (max_staleness 0: 1, the rollout always
        waits for training); None before any training step."""
        if self.max_staleness == 0:
            return 1.0
        if self._last_train is None:
            return None
        ts, te = self._last_train
        busy = 0.0
        for rs, re_ in self._rollouts:
            busy += max(0.0, min(te, re_) - max(ts, rs))
        return max(0.0, 1.0 - busy / max(te - ts, 1e-9))

    def decide(self, step: int) -> None:
        """Before training step ``step`` (the trainer is idle): hand back or lend workers."""
        s = self.settings
        idle = self.idle_fraction()
        idle_ok = (idle is None and s.min_idle_fraction <= 0) or (idle is not None and idle >= s.min_idle_fraction)
        for name in self.names:
            if name in self.lent:
                if step - self.lent[name] >= s.lend_steps:
                    self._leave(name, step, f"lent for {s.lend_steps} training steps: back to rollout")
                elif not idle_ok:
                    self._leave(name, step, f"the rollout ran during {1 - (idle or 0):.0%} of the last training step")
            elif idle_ok and step > self._left.get(name, -1) and step - self._lost.get(name, -(10**9)) >= s.lend_steps:
                # a worker handed back serves rollout for at least one step; a lost one rests for lend_steps
                why = (
                    "lent from the first training step (min_idle_fraction 0)"
                    if idle is None
                    else f"rollout idle during {idle:.0%} of the last training step (>= {s.min_idle_fraction:.0%})"
                )
                self._join(name, step, why)

    def release_all(self, step: int, why: str) -> None:
        for name in list(self.lent):
            self._leave(name, step, why)

    def before_train(self, step: int, batch: dict[str, Any]) -> None:
        """Write the step's batch where a lent hybrid reads its shard (atomically)."""
        import torch

        for old in self.batch_dir.glob("step-*.pt"):
            if int(old.stem.split("-")[1]) < step - 1:
                old.unlink(missing_ok=True)
        if not self.lent:
            return
        with atomic_open(self.batch_dir / f"step-{step}.pt", "wb") as f:
            torch.save({"batch": batch, "tokens": batch_tokens(batch)}, f)

    def take_events(self, upto: int) -> list[dict[str, Any]]:
        self._note_restores(upto)
        with self._lock:
            out = [e for e in self._events if e["step"] <= upto]
            self._events = [e for e in self._events if e["step"] > upto]
        return out

    def close(self) -> None:
        # the exchange first: it sends LEAVE to every worker in a stay, which then ends it and reads "exit" (a
        # worker closed first sat in its stay, waiting for the core's next step, until the 10 s join gave up)
        self.exchange.close()
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()
        self.server.close()

    def _note_restores(self, step: int) -> None:
        """A ``HybridRestored`` event for each restore a worker reported since: the snapshot's version and how many
        of its buckets landed in the memory the worker's state already lived in (all of them: no new memory)."""
        for name, worker in list(self.workers.items()):
            with worker.cond:
                restored = [m for m in worker.inbox if m[0] == "restored"]
                worker.inbox[:] = [m for m in worker.inbox if m[0] != "restored"]
            for _, version, in_place, buckets in restored:
                where = (
                    f"into the memory its state lives in ({in_place} of {buckets} buckets)"
                    if in_place == buckets
                    else f"with {buckets - in_place} of {buckets} buckets in new memory"
                )
                why = f"snapshot v{version} restored {where}"
                self._event("HybridRestored", step, name, why, version=version, in_place=in_place, buckets=buckets)

    def _worker(self, name: str) -> _Worker:
        worker = self.workers.get(name)
        if worker is None or not worker.alive():
            worker = self.workers[name] = _Worker(name, {**self._spawn, "worker": name})
        return worker

    def _join(self, name: str, step: int, why: str) -> None:
        start = self.clock.now()
        try:
            with self.clock.span("switching"):
                worker = self._worker(name)
                if not worker.ready:
                    worker.wait_for("ready", self.settings.start_timeout_s)
                    worker.ready = True
                if worker.in_session:  # detached at the core's last step: wait until the process is back
                    worker.wait_for("end", self.settings.timeout_s)
                    worker.in_session = False
                with worker.cond:
                    worker.inbox.clear()  # reports of an earlier stay (a late loss) are stale
                worker.in_session = True
                worker.conn.send(("join", self.server.host, self.server.port))
                worker.wait_for("join_sent", self.settings.timeout_s)
        except (RuntimeError, TimeoutError, OSError) as exc:
            self._event("HybridLost", step, name, f"could not lend it: {exc}")
            self._drop(name)
            return
        self.lent[name] = step
        self._switch_start[name] = start
        self._event("JoinTraining", step, name, why, paired_core=CORE, seconds=round(self.clock.now() - start, 3))

    def _leave(self, name: str, step: int, why: str) -> None:
        self.lent.pop(name, None)
        self._left[name] = step  # not lent again at this step
        with self._lock:
            self._leaves.append((name, why))
        self._event("LeaveTraining", step, name, why, paired_core=CORE)

    def _drop(self, name: str) -> None:
        worker = self.workers.pop(name, None)
        if worker is not None:
            worker.close()

    def _event(self, kind: str, step: int, worker: str, why: str, **fields: Any) -> None:
        entry = {"source": "elastic", "kind": kind, "step": step, "worker": worker, "why": why}
        entry.update(t_s=round(self.clock.now(), 3), **fields)
        log.info("step %d elastic %s %s: %s", step, kind, worker, why)
        with self._lock:
            self._events.append(entry)

    # -- trainer thread -------------------------------------------------------------------------------------------

    def _on_transition(self, t: Any) -> None:
        from libra.elastic.states import JoinState

        fields = {"event": t.event.value, "from": t.src.value, "to": t.dst.value}
        if t.dst in (JoinState.ACTIVE, JoinState.ROLLOUT, JoinState.FAILED) and t.worker in self._switch_start:
            start = self._switch_start.pop(t.worker)  # the timeline: switching from the loan until it trains
            self.clock.mark(t.worker, "switching", start, self.clock.now(), t.step)
        if t.dst == JoinState.FAILED:
            if t.src == JoinState.ACTIVE:
                self._active_failed.append(t.worker)
            worker = self.workers.get(t.worker)
            if worker is not None:
                worker.proc.join(1.0)  # a killed process has closed its socket: it is (about to be) reaped
                if worker.proc.exitcode is not None:
                    fields["process_exit"] = worker.proc.exitcode
            self.lent.pop(t.worker, None)
            self._lost[t.worker] = t.step
            self._event("HybridLost", t.step, t.worker, t.why, **fields)
            return
        self._event("HybridState", t.step, t.worker, t.why, **fields)

    def core_step(self, batch: dict[str, Any], step: int) -> tuple[float, tuple[str, ...]]:
        """The core's training step through the exchange. Returns the loss of the whole batch and the hybrids
        whose gradients went into it."""
        import torch

        from libra.adapters.grpo import shard_batch
        from libra.elastic.grads import shard_bounds
        from libra.elastic.states import JoinState

        ex, trainer = self.exchange, self.trainer
        with self._lock:
            leaves, self._leaves = self._leaves, []
        for name, why in leaves:
            ex.remove(name, step=step, why=why)
        self._active_failed = []
        a = ex.begin_step(step)  # an active hybrid that fails here still holds its replica index
        active = sorted({*ex.workers(JoinState.ACTIVE), *self._active_failed})
        index = {w: 1 + i for i, w in enumerate(active)}
        n = len(batch["advantages"])
        tokens = batch_tokens(batch)
        replicas = a.num_replicas
        parts: dict[str, float] = {}

        def loss_fn(model: Any, b: Any) -> Any:
            value = shard_part(model, b, tokens)
            parts[CORE] = float(value.detach())
            return value * replicas

        def hook(s: int, grads: Any) -> None:
            ex.reduce(s, grads)
            record = ex.records[-1]
            missing = [w for w in active if w not in record.hybrid_contributors]
            if not missing:
                return
            total = [g * record.num_contributed for g in grads]  # the sum of the contributions that came
            for w in missing:  # the core computes the missing shards: every sample of the batch trains
                trainer.optimizer.zero_grad(set_to_none=False)
                rows = slice(*shard_bounds(n, index[w], replicas))
                value = shard_part(trainer.model, shard_batch(batch, rows), tokens)
                (value * replicas).backward()
                parts[f"recovered:{w}"] = float(value.detach())
                for acc, g in zip(total, trainer.local_grads(), strict=True):
                    acc += g
            with torch.no_grad():
                for g, acc in zip(grads, total, strict=True):
                    g.copy_(acc / replicas)
            for w in ex.workers():  # they received the partial mean: their state is no longer the core's
                ex.remove(w, step=s, why=f"the core trained the missing shard(s) of {missing} itself")
            self._event("ShardRecovered", s, ",".join(missing), "contribution missing: the core trained it")

        core_loss_fn, trainer.loss_fn = trainer.loss_fn, loss_fn
        try:
            trainer.train_step(shard_batch(batch, a.shard(n)), grad_hook=hook, step=step)
        finally:
            trainer.loss_fn = core_loss_fn
        if not self._core_prepared and not ex.workers():
            # after the core's first optimizer step (Adam's state exists) and before any join: the first join's
            # snapshot is packed into memory touched now rather than into new pages during the step that reads it
            ex.prepare()
            self._core_prepared = True
        contributors = ex.records[-1].hybrid_contributors
        for w in contributors:
            msg = self.workers[w].wait_for("loss", self.settings.timeout_s, match=lambda m: m[1] == step)
            parts[w] = float(msg[2])
        return sum(parts.values()), tuple(contributors)
