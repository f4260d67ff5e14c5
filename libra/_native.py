"""The optional C extensions' one loader (ext/: the router's tree update, the generators' values, the simulator's
slice): each has a Python reference that runs where the extension is not built, and `LIBRA_PURE_PYTHON=1` selects
the references everywhere."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def optional_extension(name: str) -> ModuleType | None:
    """The extension module `name`, or None where it is not built or `LIBRA_PURE_PYTHON` is set."""
    if os.environ.get("LIBRA_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
