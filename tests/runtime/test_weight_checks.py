"""The checked weight push (libra/runtime/backend.py `push_weights`): each instance's version and a checksum of its
`lm_head` against the trainer's, engine-free (a backend that reports what a corrupted or stale engine would)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from libra.runtime.backend import push_weights
from libra.runtime.clock import Clock


class _Reporting:
    """Two instances that accept every push and report the given checksums of `lm_head.weight`."""

    def __init__(self, checksums: dict[str, float]) -> None:
        self.checksums = checksums
        self.version = -1

    def instances(self) -> tuple[str, ...]:
        return tuple(self.checksums)

    def load_weights(self, update) -> int:
        self.version = update.version
        return self.version

    def weight_version(self, name: str) -> int:
        return self.version

    def param_checksum(self, name: str, param: str) -> float:
        assert param == "lm_head.weight"
        return self.checksums[name]


def _trainer(version: int = 1):
    import torch

    torch.manual_seed(0)
    return SimpleNamespace(version=version, module=SimpleNamespace(lm_head=torch.nn.Linear(4, 3, bias=False)))


def _pushed(trainer, checksums: dict[str, float]) -> dict:
    return push_weights(_Reporting(checksums), trainer, SimpleNamespace(version=1), Clock(), step=0)


def test_matching_checksums_pass() -> None:
    trainer = _trainer()
    want = float(trainer.module.lm_head.weight.detach().double().sum())
    pushed = _pushed(trainer, {"i0": want, "i1": want * (1 + 1e-9)})
    assert pushed == {"version": 1, "instances": {"i0": 1, "i1": 1}, "checksum_checked": True}


@pytest.mark.parametrize("served", [math.nan, math.inf, -math.inf])
def test_an_instance_serving_weights_that_are_not_finite_is_refused(served) -> None:
    trainer = _trainer()
    want = float(trainer.module.lm_head.weight.detach().double().sum())
    # before: NaN passed (abs(nan - want) > tolerance is false): an engine serving NaN weights went unnoticed
    with pytest.raises(RuntimeError, match="weight push of version 1: checksums"):
        _pushed(trainer, {"i0": want, "i1": served})


def test_a_checksum_off_by_more_than_the_tolerance_is_refused() -> None:
    trainer = _trainer()
    want = float(trainer.module.lm_head.weight.detach().double().sum())
    with pytest.raises(RuntimeError, match="!= trainer"):
        _pushed(trainer, {"i0": want + 1e-3, "i1": want})
