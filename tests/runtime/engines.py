"""Helpers of the runtime tests that run real engines: small configurations and a plain synchronous loop."""

from __future__ import annotations

import zlib

import attrs

from libra.runtime import RunConfig

# a virtual cluster of 3 GPUs (1 trains, 2 serve) with TP 2 only: the planner can only place one TP-2 instance,
# `rollout-tp2-0`, the one the default run's replan leaves on the shared engines (adopted without an engine start)
ONE_INSTANCE_VIRTUAL = {"gpus": 3, "gpus_per_node": 3, "model": "Qwen3-4B", "tp_degrees": (2,)}
ONE_INSTANCE_YAML = "virtual: {gpus: 3, gpus_per_node: 3, model: Qwen3-4B, tp_degrees: [2]}\n"


def one_instance_config(**changes) -> RunConfig:
    """A run on `ONE_INSTANCE_VIRTUAL` (one TP-2 instance), 2 prompts x 2 samples, no workload shift."""
    base = RunConfig()
    virtual = attrs.evolve(base.virtual, **ONE_INSTANCE_VIRTUAL)
    return attrs.evolve(base, virtual=virtual, shift=None, prompts=base.prompts[:2], samples_per_prompt=2, **changes)


def plain_synchronous_losses(backend, model_dir: str, config: RunConfig, steps: int) -> list[float]:
    """The loop an RL script would write without Libra: roll out every trajectory on the one live instance (submit
    all, poll, call the tool at each turn end, resume), GRPO batch, one optimizer step, push the weights."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from libra.adapters.grpo import group_advantages, make_batch
    from libra.adapters.torch_ddp import TorchDDPTrainer
    from libra.adapters.types import EventKind, Sampling
    from libra.runtime.agent import ToolAgent

    torch.manual_seed(config.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = TorchDDPTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        distributed=False,
        optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=config.lr),
    )
    (instance,) = backend.instances()
    backend.load_weights(trainer.export_weights(bucket_bytes=1 << 20))

    def sampling(rid: str, turn: int) -> Sampling:  # greedy, or seeded per request and turn
        seed = None if config.temperature == 0 else zlib.crc32(f"{config.seed}/{rid}/{turn}".encode())
        return Sampling(max_tokens=config.max_tokens, temperature=config.temperature, seed=seed)

    losses = []
    for step in range(steps):
        agent = ToolAgent(tok, step=step, shift=config.shift)
        prompts = {
            f"s{step}-p{i}-{j}": list(tok.encode(p))
            for i, p in enumerate(config.prompts)
            for j in range(config.samples_per_prompt)
        }
        masks = {rid: [0] * len(ids) for rid, ids in prompts.items()}
        turns = {rid: 0 for rid in prompts}
        starts = {rid: len(ids) for rid, ids in prompts.items()}
        contexts: dict[str, tuple[int, ...]] = {}
        for rid, ids in prompts.items():
            backend.submit(rid, instance, ids, sampling(rid, 0))
        while len(contexts) < len(prompts):
            for ev in backend.poll():
                if ev.kind != EventKind.FINISHED:
                    continue
                rid = ev.request_id
                context = backend.context(rid)
                generated = tuple(context[starts[rid] :])
                masks[rid] += [1] * len(generated)
                turns[rid] += 1
                result = agent.tool(rid, generated, turns[rid] - 1) if turns[rid] < config.max_turns else None
                if result is None:
                    contexts[rid] = backend.release(rid)
                    continue
                masks[rid] += [0] * len(result.output_token_ids)
                backend.resume(rid, result.output_token_ids, sampling(rid, turns[rid]))
                starts[rid] = len(backend.context(rid))
        order = sorted(prompts, key=lambda r: (r.split("-")[1], int(r.split("-")[2])))
        batch = make_batch(
            [contexts[r] for r in order],
            [masks[r] for r in order],
            group_advantages([agent.reward(r) for r in order], config.samples_per_prompt),
            pad_id=tok.pad_token_id,
        )
        losses.append(trainer.train_step(batch))
        backend.load_weights(trainer.export_weights(bucket_bytes=1 << 20))
    return losses
