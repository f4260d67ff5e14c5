"""Build of the optional C accelerators: the router's step-end tree update and the priced rule's tool return
(ext/scheduling), the generators' values (ext/workloads) and the simulator's slice (ext/sim); the rest of the
package's metadata is in pyproject.toml. `optional=True`: without a C compiler the package installs and runs on the
pure-Python references (libra/scheduling/node.py, tree.py, priced.py; libra/workloads/trace.py; libra/sim/slices.py),
with the same results.
`-ffp-contract=off` for the decode pass and the priced rule: no fused multiply-add, so every float is rounded where
numpy or Python rounds it."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "libra.scheduling._tree_native",
            sources=[
                "ext/scheduling/tree_native.c",
                "ext/scheduling/evict_native.c",
                "ext/scheduling/replay_native.c",
                "ext/scheduling/priced_native.c",
                "ext/scheduling/priced_shares.c",
            ],
            depends=["ext/scheduling/tree_native.h", "ext/scheduling/priced_native.h"],
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "libra.workloads._slots_native",
            sources=["ext/workloads/slots_native.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "libra.sim._slice_native",
            sources=[
                "ext/sim/slice_native.c",
                "ext/sim/pass.c",
                "ext/sim/slice.c",
                "ext/sim/admit.c",
                "ext/sim/steal.c",
                "ext/sim/returns.c",
                "ext/sim/event.c",
                "ext/sim/order.c",
            ],
            depends=["ext/sim/slice_native.h"],
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
