"""Build and load the C++ snapshot extension in ``ext/libra_ext`` (the compatibility check lives here).

The extension is JIT-built with ``torch.utils.cpp_extension.load`` (ninja + the host C++ compiler) into a cache
directory, the first time :func:`load` is called in a process: about 30 s once, then cached. Where it cannot be
built, :func:`is_compatible` says why and every caller falls back to the pure-Python reference in
:mod:`libra.elastic.pack`, which writes identical bytes.

The CUDA source ``pack_cuda.cu`` is compiled into the extension only when torch has CUDA and ``nvcc`` is found;
:func:`nvcc_compile_command` gives the compile-only command CI runs where there is no GPU.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from types import ModuleType

#: Sources of the extension (next to the repository's ``libra`` package).
EXT_DIR = Path(__file__).resolve().parents[2] / "ext" / "libra_ext"
CPU_SOURCES = ("pack.cpp",)
CUDA_SOURCES = ("pack_cuda.cu",)
NAME = "libra_snapshot_ext"


def build_dir() -> Path:
    """Where the JIT build lands: ``$LIBRA_EXT_BUILD_DIR``, else ``~/.cache/libra/ext`` (read when building)."""
    root = os.environ.get("LIBRA_EXT_BUILD_DIR") or str(Path.home() / ".cache" / "libra" / "ext")
    return Path(root)


def is_compatible() -> tuple[bool, str]:
    """Whether the C++ extension can be built here, and if not, why (cf. DeepSpeed's ``OpBuilder.is_compatible``)."""
    missing = [s for s in CPU_SOURCES if not (EXT_DIR / s).is_file()]
    if missing:
        return False, f"extension sources not found in {EXT_DIR} (missing {missing}); is this an installed wheel?"
    try:
        import torch.utils.cpp_extension as cpp  # noqa: F401
    except ImportError as exc:  # pragma: no cover - torch is a dependency of libra.elastic
        return False, f"torch.utils.cpp_extension unavailable: {exc}"
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401
        except ImportError:
            return False, "ninja is not installed (pip install ninja)"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        return False, f"no C++ compiler ({compiler!r} or g++) on PATH"
    return True, "ok"


def cuda_compatible() -> tuple[bool, str]:
    """Whether the CUDA path would be built into the extension (a CUDA torch and nvcc)."""
    import torch

    if not torch.cuda.is_available():
        return False, "torch has no usable CUDA device"
    if shutil.which("nvcc") is None:
        return False, "nvcc is not on PATH"
    return True, "ok"


@functools.cache
def load() -> ModuleType | None:
    """The built extension module, or None where :func:`is_compatible` is false or the build fails."""
    ok, _ = is_compatible()
    if not ok:
        return None
    try:
        return _build()
    except Exception as exc:  # a failed build is reported by load_error(), and callers use the Python path
        _errors.append(f"{type(exc).__name__}: {exc}")
        return None


_errors: list[str] = []


def load_error() -> str:
    """Why :func:`load` returned None (empty when it did not)."""
    ok, why = is_compatible()
    return why if not ok else "; ".join(_errors)


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    sources = [str(EXT_DIR / s) for s in CPU_SOURCES]
    flags = ["-O3"]
    ldflags = ["-fopenmp"]
    with_cuda = cuda_compatible()[0]
    if with_cuda:
        sources += [str(EXT_DIR / s) for s in CUDA_SOURCES]
        flags.append("-DLIBRA_WITH_CUDA")
    return cpp_extension.load(
        name=NAME + ("_cuda" if with_cuda else ""),
        sources=sources,
        extra_cflags=flags + ["-fopenmp"],
        extra_ldflags=ldflags,
        extra_cuda_cflags=["-O3", "-DLIBRA_WITH_CUDA"],
        build_directory=str(directory),
        with_cuda=with_cuda,
        verbose=False,
    )


def nvcc_compile_command(output: Path) -> list[str]:
    """The compile-only command for the CUDA source (``nvcc -c``), as CI runs it on machines without a GPU."""
    return ["nvcc", "-c", "-O3", "-std=c++17", str(EXT_DIR / "pack_cuda.cu"), "-o", str(output)]


def cuda_binding_syntax_command() -> list[str]:
    """A g++ ``-fsyntax-only`` check of the C++ binding with its CUDA path enabled (needs only the CUDA runtime
    headers, not a GPU or a CUDA build of torch), as CI runs it."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return [
        os.environ.get("CXX", "g++"),
        "-std=c++17",
        "-fsyntax-only",
        "-DLIBRA_WITH_CUDA",
        f"-DTORCH_EXTENSION_NAME={NAME}",
        *(f"-I{p}" for p in include_paths()),
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{cuda_home}/include",
        str(EXT_DIR / "pack.cpp"),
    ]
