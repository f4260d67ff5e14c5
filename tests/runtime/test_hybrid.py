"""Hybrid replicas of the runtime without engines: the run's core trainer (the tiny Llama, torch) with a real hybrid
process joined through the side channel (TCP, gloo), on synthetic GRPO batches (random token ids, random masks and
advantages). Per-step losses equal those of the trainer alone (the fixed global batch: the mean over replicas is the
whole batch's gradient); a hybrid SIGKILLed mid-step costs nothing (the core trains its shard, the step completes);
a hung training step is reported by the trainer thread's bounded wait."""

from __future__ import annotations

import threading
import time

import pytest

from libra.runtime.config import HybridSettings
from tests.limits import scaled


def _trainer(model_dir: str):
    import torch
    from transformers import LlamaForCausalLM

    from libra.adapters.torch_ddp import TorchDDPTrainer

    torch.manual_seed(0)
    return TorchDDPTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=1e-3),
    )


def _batches(steps: int, rows: int = 6, width: int = 24) -> list[dict]:
    """Synthetic GRPO batches: random ids of the tiny vocabulary, a generated-token mask, random advantages."""
    import torch

    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        ids = torch.randint(4, 200, (rows, width), generator=gen)
        mask = (torch.rand((rows, width), generator=gen) > 0.4).float()
        mask[:, :3] = 0.0
        out.append({"input_ids": ids, "loss_mask": mask, "advantages": torch.randn(rows, generator=gen)})
    return out


class _Clock:
    def __init__(self) -> None:
        import time

        self._t0 = time.perf_counter()
        self.spans: list = []

    def now(self) -> float:
        import time

        return time.perf_counter() - self._t0

    def span(self, _category: str):
        import contextlib

        return contextlib.nullcontext()

    def mark(self, *span) -> None:
        self.spans.append(span)


def _pace(exchange) -> None:
    """These steps take a fraction of a second (a run has a rollout between them): hold a step while a join is on
    its way, so that each join takes the same steps every time (the exchange itself never waits)."""
    deadline = time.monotonic() + scaled(60)
    while exchange.joining and not exchange.join_message_waiting() and time.monotonic() < deadline:
        time.sleep(0.005)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from libra.adapters.tiny_model import build_tiny_model

    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(str(path), seed=0)
    return str(path)


def _run(
    model_dir: str,
    out,
    batches: list[dict],
    *,
    lend_steps: int,
    kill_at: int | None,
    first_lend: int = 0,
    probe=lambda step, pool: None,
) -> tuple[list, list, list]:
    """The core with one hybrid lent from step ``first_lend`` (max_staleness 0: the rollout always waits for
    training); ``probe(step, pool)`` after each step."""
    from libra.runtime.hybrid import HybridPool

    trainer, clock = _trainer(model_dir), _Clock()
    settings = HybridSettings(workers=1, lend_steps=lend_steps, timeout_s=scaled(60.0), start_timeout_s=scaled(300))
    pool = HybridPool(
        settings,
        trainer=trainer,
        model_dir=model_dir,
        out_dir=out,
        seed=0,
        lr=1e-3,
        max_staleness=0,
        clock=clock,
        kill_at_step=kill_at,
    )
    losses, events, contributors = [], [], []
    try:
        for step, batch in enumerate(batches):
            _pace(pool.exchange)
            if step >= first_lend:
                pool.decide(step)
            pool.before_train(step, batch)
            loss, hybrids = pool.core_step(batch, step)
            assert trainer.version == step + 1  # one optimizer step per training step, hybrids or not
            losses.append(loss)
            contributors.append(hybrids)
            events += pool.take_events(step)
            probe(step, pool)
    finally:
        pool.close()
    return losses, events, contributors


def test_a_hybrid_joins_leaves_rejoins_and_is_killed_and_every_loss_stays_the_cores(model_dir, tmp_path) -> None:
    # lent at step 0 (JOIN -> snapshot -> ATTACH read at step 1, which makes it active), handed back after 3
    # training steps (detached at step 3), lent again at step 4 (active 5), SIGKILLed in step 6 after computing its
    # gradient and before sending it; step 7 trains on the core alone
    steps = 8
    batches = _batches(steps)
    alone = _trainer(model_dir)
    plain = [alone.train_step(b) for b in batches]

    losses, events, contributors = _run(model_dir, tmp_path, batches, lend_steps=3, kill_at=6)
    # the fixed global batch: the mean over replicas is the whole batch's gradient, so every loss (and the weights
    # that produce the next one) equals the trainer's alone; the dead hybrid's shard was trained by the core
    assert losses == pytest.approx(plain, abs=1e-6)
    assert all(e["source"] == "elastic" and e["worker"] == "hybrid-0" for e in events)
    joins = [e["step"] for e in events if e["kind"] == "JoinTraining"]
    leaves = [e["step"] for e in events if e["kind"] == "LeaveTraining"]
    active = [e["step"] for e in events if e["kind"] == "HybridState" and e["to"] == "active"]
    assert joins == [0, 4] and leaves == [3] and active == [1, 5]
    assert [e["step"] for e in events if e["kind"] == "HybridState" and e["to"] == "rollout"] == [3]
    assert [bool(c) for c in contributors] == [False, True, True, False, False, True, False, False]
    lost = [e for e in events if e["kind"] == "HybridLost"]
    assert len(lost) == 1 and lost[0]["step"] == 6 and lost[0]["from"] == "active"
    assert lost[0].get("process_exit") == -9  # SIGKILL
    assert [e["step"] for e in events if e["kind"] == "ShardRecovered"] == [6]
    # the core's snapshot at step 0 has no optimizer state (unlike the worker's prepared layout): new memory; the
    # worker keeps one replica and lays its state out again as it goes back to rollout, so the second stay's
    # snapshot lands in the memory its state lives in
    restored = [(e["version"], e["in_place"], e["buckets"]) for e in events if e["kind"] == "HybridRestored"]
    assert restored == [(0, 0, 1), (4, 1, 1)]


def test_a_worker_lent_after_the_cores_first_step_receives_its_first_snapshot_into_the_memory_it_prepared(
    model_dir, tmp_path
) -> None:
    # the worker laid its state out at start (the optimizer's state included, as the core's is from its first
    # step on): lent at step 2, its first snapshot lands in that memory, and every loss is still the core's alone;
    # the core laid its snapshot buckets out after its first step and packs that snapshot into them
    batches = _batches(4)
    alone = _trainer(model_dir)
    plain = [alone.train_step(b) for b in batches]
    spare: list = []
    workers: dict = {}

    def probe(step: int, pool) -> None:
        spare.append([b.data_ptr() for b in pool.exchange._spare_buckets or ()])
        workers.update(pool.workers)

    losses, events, contributors = _run(
        model_dir, tmp_path, batches, lend_steps=10, kill_at=None, first_lend=2, probe=probe
    )
    assert spare[0] and spare[-1] == spare[0]  # (prepared after step 0; the delivered snapshot's, kept again)
    assert losses == pytest.approx(plain, abs=1e-6)
    assert [bool(c) for c in contributors] == [False, False, False, True]
    restored = [(e["step"], e["version"], e["in_place"], e["buckets"]) for e in events if e["kind"] == "HybridRestored"]
    assert [(v, n, b) for _, v, n, b in restored] == [(2, 1, 1)]
    # closed while the worker is still active: the core's LEAVE ends its stay, and it exits on its own (not
    # killed after waiting in its stay for a step that never comes)
    worker = workers["hybrid-0"]
    assert [m[0] for m in worker.inbox if m[0] in ("left", "failed")] == ["left"]
    assert worker.proc.exitcode == 0


def test_a_hung_training_step_is_reported_after_its_missed_checks(model_dir) -> None:
    from libra.runtime.trainer import TrainerThread

    trainer = _trainer(model_dir)
    release = threading.Event()

    def stuck(model, batch):  # a training step that makes no progress until released
        release.wait(scaled(60))
        from libra.adapters.grpo import policy_loss

        return policy_loss(model, batch)

    trainer.loss_fn = stuck
    thread = TrainerThread(trainer, clock_t0=0.0)
    thread.start(0, _batches(1)[0])
    assert thread.overdue(check_s=3600.0, missed_checks=2) is None  # within its bound
    assert thread.poll(timeout=0.2) is None
    why = thread.overdue(check_s=0.05, missed_checks=2)
    assert why is not None and "training step 0 made no progress" in why
    release.set()
    assert thread.poll(timeout=scaled(60)) is not None
    assert thread.overdue(check_s=0.05, missed_checks=2) is None  # nothing running
