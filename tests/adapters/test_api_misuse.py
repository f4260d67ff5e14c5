"""The adapters' public API used wrongly, as a trainer author might: each mistake is one clear typed error that
names the bad value (no engine started; the torch trainer runs without a process group)."""

from __future__ import annotations

import pytest

from libra.adapters import UnknownBackend, UnsupportedConfig, get_backend, register_backend
from libra.adapters.errors import StateMismatch
from libra.adapters.registry import TRAINER_BACKENDS
from libra.adapters.types import InstanceSpec, Sampling


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text.strip(), text
    return text


def test_a_registered_target_without_its_class_is_an_unknown_backend():
    register_backend("trainer", "broken-target", "libra.adapters.grpo:NoSuchTrainer")
    try:
        with pytest.raises(UnknownBackend) as exc:  # it used to be a bare AttributeError
            get_backend("trainer", "broken-target")
        assert _one_line(exc) == (
            "trainer backend 'broken-target' is registered as 'libra.adapters.grpo:NoSuchTrainer', but "
            "libra.adapters.grpo has no 'NoSuchTrainer'"
        )
    finally:
        del TRAINER_BACKENDS["broken-target"]


def test_register_backend_refuses_a_target_that_is_not_module_colon_class():
    with pytest.raises(ValueError, match=r"target must be 'module:Class', got 'libra.adapters.grpo'"):
        register_backend("trainer", "no-colon", "libra.adapters.grpo")
    assert "no-colon" not in TRAINER_BACKENDS
    with pytest.raises(UnknownBackend, match=r"unknown trainer backend \['torch-ddp'\]"):
        get_backend("trainer", ["torch-ddp"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 2.5}, r"Sampling.max_tokens must be a whole number >= 1, got 2.5"),
        ({"max_tokens": "8"}, r"Sampling.max_tokens must be a whole number >= 1, got '8'"),
        ({"max_tokens": True}, r"Sampling.max_tokens must be a whole number >= 1, got True"),
        ({"max_tokens": 8, "temperature": -0.5}, r"Sampling.temperature must be a finite number >= 0, got -0.5"),
        ({"max_tokens": 8, "top_p": 0.0}, r"Sampling.top_p must be a number in \(0, 1\], got 0.0"),
        ({"max_tokens": 8, "top_p": 1.5}, r"Sampling.top_p must be a number in \(0, 1\], got 1.5"),
    ],
)
def test_sampling_refuses_values_an_engine_cannot_use(kwargs, match):
    with pytest.raises(ValueError, match=match) as exc:
        Sampling(**kwargs)
    _one_line(exc)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "a", "tp": "2"}, r"InstanceSpec 'a': tp must be a whole number >= 1, got '2'"),
        ({"name": "a", "tp": True}, r"InstanceSpec 'a': tp must be a whole number >= 1, got True"),
        ({"name": "a", "max_model_len": 1}, r"InstanceSpec 'a': max_model_len must be a whole number >= 2, got 1"),
        ({"name": ""}, r"InstanceSpec.name must be a non-empty string, got ''"),
    ],
)
def test_instance_spec_refuses_bad_types_and_values(kwargs, match):
    with pytest.raises(ValueError, match=match) as exc:
        InstanceSpec(**kwargs)
    _one_line(exc)


def test_numpy_integers_are_whole_numbers():
    np = pytest.importorskip("numpy")
    assert Sampling(max_tokens=np.int64(4), top_p=np.float32(0.5)).max_tokens == 4
    assert InstanceSpec(name="a", tp=np.int32(2)).tp == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"zero_stage": True}, r"zero_stage must be 0, 1, 2 or 3, got True"),
        ({"micro_batch": 0}, r"micro_batch must be a whole number >= 1, got 0"),
        ({"dp": 2.0}, r"dp must be a whole number >= 1, got 2.0"),
        ({"lr": -1e-3}, r"lr must be a finite number > 0, got -0.001"),
        ({"gradient_clipping": -1.0}, r"gradient_clipping must be a number >= 0 \(0: off\), got -1.0"),
    ],
)
def test_deepspeed_config_refuses_a_batch_or_optimizer_it_cannot_run(kwargs, match):
    from libra.adapters.deepspeed_trainer import deepspeed_config

    good = {"zero_stage": 1, "micro_batch": 2, "lr": 1e-3, "dp": 2}
    with pytest.raises(UnsupportedConfig, match=match):
        deepspeed_config(**{**good, **kwargs})


def test_make_batch_refuses_advantages_or_masks_that_do_not_match_the_contexts():
    pytest.importorskip("torch")
    from libra.adapters.grpo import make_batch

    contexts, masks = [[1, 2, 3], [4, 5]], [[0, 1, 1], [0, 1]]
    # one advantage for two sequences used to broadcast silently over both in the loss
    with pytest.raises(ValueError, match="got 2 contexts, 2 masks, 1 advantages"):
        make_batch(contexts, masks, [1.0], pad_id=0)
    with pytest.raises(ValueError, match="got 0 contexts, 0 masks, 0 advantages"):
        make_batch([], [], [], pad_id=0)
    with pytest.raises(ValueError, match="mask 1 has 3 entries for a context of 2 tokens"):
        make_batch(contexts, [[0, 1, 1], [0, 1, 1]], [1.0, -1.0], pad_id=0)
    batch = make_batch(contexts, [[0, 1, 1], [0]], [1.0, -1.0], pad_id=0)  # a short mask: the rest is not trained
    assert batch["loss_mask"].tolist() == [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


class _Tied:
    """A causal LM head tied to its embedding (Qwen3-0.6B..4B, Llama-3.2-1B/3B): one tensor under two names."""

    @staticmethod
    def make():
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(11, 4), torch.nn.Linear(4, 11, bias=False))
        model[1].weight = model[0].weight
        return model


def test_export_weights_of_a_model_with_tied_embeddings():
    torch = pytest.importorskip("torch")
    from safetensors.torch import load

    from libra.adapters.torch_ddp import TorchDDPTrainer

    model = _Tied.make()
    update = TorchDDPTrainer(model=model, distributed=False).export_weights()
    served = {k: v for blob in update.buckets for k, v in load(blob).items()}
    assert sorted(served) == ["0.weight", "1.weight"]  # both names, as the checkpoint has them
    assert torch.equal(served["0.weight"], model[0].weight) and torch.equal(served["1.weight"], model[1].weight)


def test_restore_of_a_snapshot_of_another_model_names_the_parameter():
    torch = pytest.importorskip("torch")
    from libra.adapters.torch_ddp import TorchDDPTrainer

    trainer = TorchDDPTrainer(model=torch.nn.Linear(2, 2), distributed=False)
    other = TorchDDPTrainer(model=torch.nn.Linear(3, 2), distributed=False).snapshot()
    with pytest.raises(StateMismatch, match=r"parameter 'weight' has shape \(2, 3\) in the snapshot, \(2, 2\)") as e:
        trainer.restore(other)
    _one_line(e)
    with pytest.raises(StateMismatch, match=r"snapshot has the keys version, model and optimizer; got \['model'\]"):
        trainer.restore({"model": {}})
    with pytest.raises(StateMismatch, match=r"snapshot lacks \['bias'\]"):
        trainer.restore({**trainer.snapshot(), "model": {"weight": torch.zeros(2, 2)}})
    assert trainer.version == 0


def test_a_grad_hook_that_returns_new_tensors_is_not_ignored():
    """`hook(step, grads) -> grads`: a hook written as `return [g * 0 for g in grads]` used to be dropped (the
    optimizer stepped on the local gradients); now its result is copied in, and a result that does not fit the
    parameters is refused, naming the gradient."""
    torch = pytest.importorskip("torch")
    from libra.adapters.torch_ddp import TorchDDPTrainer

    def loss(model, batch):
        return model(batch["x"]).pow(2).sum()

    torch.manual_seed(0)
    trainer = TorchDDPTrainer(
        model=torch.nn.Linear(3, 2),
        loss_fn=loss,
        optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=0.1),
        distributed=False,
    )
    before = {k: v.clone() for k, v in trainer.module.state_dict().items()}
    batch = {"x": torch.ones(4, 3)}
    trainer.train_step(batch, grad_hook=lambda step, grads: [torch.zeros_like(g) for g in grads])
    assert all(torch.equal(before[k], v) for k, v in trainer.module.state_dict().items())  # zero gradients: no move
    with pytest.raises(StateMismatch, match=r"grad_hook returned 1 gradients for step 1; the model has 2"):
        trainer.train_step(batch, grad_hook=lambda step, grads: grads[:1])
    with pytest.raises(StateMismatch, match=r"grad_hook returned shape \(3, 2\) for gradient 0 of step 7; the param"):
        trainer.train_step(batch, grad_hook=lambda step, grads: [g.t() for g in grads], step=7)


def test_group_advantages_refuse_a_reward_that_is_not_a_finite_number():
    from libra.adapters.grpo import group_advantages

    # a NaN reward (a crashed grader) used to make its whole group's advantages NaN, and the loss with them
    with pytest.raises(ValueError, match=r"^reward 1 is nan; rewards must be finite numbers$"):
        group_advantages([1.0, float("nan"), 0.0, 1.0], 2)
    with pytest.raises(ValueError, match=r"^reward 0 is None; rewards must be finite numbers$"):
        group_advantages([None, 1.0], 2)
    with pytest.raises(ValueError, match=r"^2 rewards do not split into groups of 2.0$"):
        group_advantages([1.0, 0.0], 2.0)
    assert group_advantages([1, 0], 2) == pytest.approx([1.0, -1.0], abs=1e-4)


def test_a_weight_update_is_versioned_safetensors_bytes():
    from libra.adapters.types import WeightUpdate

    with pytest.raises(ValueError, match=r"^WeightUpdate.version must be a whole number >= 0, got -1$"):
        WeightUpdate(version=-1, buckets=(b"x",))
    with pytest.raises(ValueError, match=r"^WeightUpdate v3 bucket 1 is a dict, not safetensors bytes"):
        WeightUpdate(version=3, buckets=(b"x", {"lm_head.weight": 0}))
    with pytest.raises(ValueError, match=r"^WeightUpdate v3 needs a non-empty tuple of buckets, got b'x'$"):
        WeightUpdate(version=3, buckets=b"x")  # one blob, not a tuple of them: each byte would be a "bucket"
    with pytest.raises(ValueError, match=r"^WeightUpdate v3 needs a non-empty tuple of buckets, got \(\)$"):
        WeightUpdate(version=3, buckets=())


def test_policy_loss_refuses_a_hand_built_batch_that_would_broadcast():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from libra.adapters.grpo import policy_loss

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 32, (3, 5))
    good = {"input_ids": ids, "loss_mask": torch.ones(3, 5), "advantages": torch.tensor([1.0, -1.0, 0.5])}
    assert torch.isfinite(policy_loss(model, good))
    with pytest.raises(ValueError, match=r"needs loss_mask \(3, 5\) and advantages \(3,\); got \(3, 5\) and \(1,\)"):
        policy_loss(model, {**good, "advantages": torch.tensor([1.0])})  # used to apply 1.0 to every row
    with pytest.raises(ValueError, match=r"got \(1, 5\) and \(3,\)"):
        policy_loss(model, {**good, "loss_mask": torch.ones(1, 5)})
    with pytest.raises(ValueError, match=r"it lacks \['advantages', 'loss_mask'\]"):
        policy_loss(model, {"input_ids": ids})
