"""Libra: resource management for agentic RL post-training.

The pure core (`libra.spec`, `libra.workloads`, `libra.planning`, `libra.scheduling`, `libra.sim`) imports no
torch or engine; `libra.elastic` uses torch and `libra.adapters` the engines, lazily.
"""

__version__ = "0.1.0"
