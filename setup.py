"""Build of the optional C accelerator of the router's step-end tree update (ext/scheduling/tree_native.c); the
rest of the package's metadata is in pyproject.toml. `optional=True`: without a C compiler the package installs
and runs on the pure-Python reference (libra/scheduling/node.py), with the same results."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "libra.scheduling._tree_native",
            sources=[
                "ext/scheduling/tree_native.c",
                "ext/scheduling/evict_native.c",
            ],
            depends=["ext/scheduling/tree_native.h"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
