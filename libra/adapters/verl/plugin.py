"""The `verl.plugins` entry point (pyproject: `libra = "libra.adapters.verl.plugin"`).

verl imports every module of that entry-point group on `import verl` (a `module:function` value would never be
called), so importing this module is what registers Libra with verl, in the driver and in every Ray worker that
imports verl: the `libra_separate_async` trainer and the `libra_tool_agent` agent loop. verl swallows a plugin's
import error (debug log only); `registered()` says what is in place.
"""

from __future__ import annotations

import libra.adapters.verl.agent_loop  # noqa: F401  (registers libra_tool_agent)
import libra.adapters.verl.trainer  # noqa: F401  (registers libra_separate_async)


def registered() -> dict[str, bool]:
    """Whether verl's registries hold Libra's trainer and agent loop."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    return {
        "libra_separate_async": "libra_separate_async" in TRAINER_REGISTRY,
        "libra_tool_agent": "libra_tool_agent" in _agent_loop_registry,
    }
