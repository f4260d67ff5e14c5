"""Shared CLI plumbing: one-line errors, JSON on stdout, logs on stderr, readable tables."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libra.spec.jsonable import jsonable


class CLIError(Exception):
    """An error to print as one line (no traceback) with a non-zero exit."""


def check_ranges(args: argparse.Namespace, limits: dict[str, tuple[int, int]]) -> None:
    """Every integer option named in `limits` (its dest) lies in [low, high]; bounded before any work starts, so
    no count sizes an allocation or a loop unchecked. Options left at None are skipped."""
    for name, (low, high) in limits.items():
        value = getattr(args, name, None)
        if value is not None and not low <= value <= high:
            raise CLIError(f"--{name.replace('_', '-')} must be between {low:,} and {high:,}, got {value}")


MAX_TRAJECTORIES_PER_STEP = 1 << 20  # prompts x samples
MAX_MODEL_LEN = 10_000_000  # the trace loader's bound on one trajectory


def check_generation(steps: int, prompts: int, samples: int) -> None:
    """A synthetic workload the CLI is asked to generate stays bounded: per step and over all steps."""
    check_batch(prompts, samples)
    if steps * prompts * samples > 10 * MAX_TRAJECTORIES_PER_STEP:
        raise CLIError(f"--steps x --prompts x --samples: at most {10 * MAX_TRAJECTORIES_PER_STEP:,} trajectories")


def check_batch(prompts: int, samples: int) -> None:
    if prompts * samples > MAX_TRAJECTORIES_PER_STEP:
        raise CLIError(
            f"--prompts x --samples = {prompts * samples:,} trajectories per step; "
            f"at most {MAX_TRAJECTORIES_PER_STEP:,}"
        )


def check_prompts_fit(longest: int, max_len: int, option: str) -> None:
    """A synthetic workload's trajectories are cut at the model's length, its prompts are not: a workload whose
    longest trajectory (`longest` tokens, after the cut) is still longer than `max_len` has prompts that do not fit,
    refused rather than planned or simulated with trajectories longer than the model's length."""
    if longest > max_len:
        raise CLIError(f"{option} {max_len} is shorter than the workload's prompts ({longest:,} tokens)")


def max_len_note(lengths: Sequence[int], max_len: int) -> str | None:
    """A note where a trace's trajectories (their total `lengths`) pass --max-len: a trace is replayed as recorded
    (a model of a longer context wrote it), so its rollout runs them whole while training, which cannot hold more
    than the model's length, prices each cut at it; None where all fit."""
    over = [n for n in lengths if n > max_len]
    if not over:
        return None
    longest = int(max(over))
    return (
        f"note: {len(over):,} of {len(lengths):,} trajectories are longer than --max-len {max_len:,} (up to "
        f"{longest:,} tokens): rollout runs them whole, training prices each cut at {max_len:,}; "
        f"--max-len {longest} prices them whole"
    )


def check_new_output(path: Path, *, directory: bool) -> None:
    """Fail before the work when an output path cannot be written: a folder named by an existing file (or the
    reverse), a parent folder that does not exist, (for a folder, whose missing parents are created) a file
    where a parent folder would go, or a folder (a file's own, for a file) that cannot be created or written
    (`_probe_folder`)."""
    if directory and path.exists() and not path.is_dir():
        raise CLIError(f"--out {path}: exists and is not a folder")
    if directory:
        above = next(p for p in (path, *path.parents) if p.exists())  # ('.' or '/' at the latest)
        if not above.is_dir():
            raise CLIError(f"--out {path}: {above} is not a folder")
        _probe_folder(path, above)
    if not directory and path.is_dir():
        raise CLIError(f"--out {path}: is a folder; name a file")
    if not directory and not path.parent.is_dir():
        raise CLIError(f"--out {path}: folder {path.parent} does not exist")
    if not directory:
        _probe_folder(path.parent, path.parent, shown=path)  # the file is written next to a temporary one there


def _probe_folder(path: Path, above: Path, *, shown: Path | None = None) -> None:
    """Create `path` (and its missing parents) and a file in it, then remove them again: what the run will do when
    it writes there, tried before the run. Permission bits cannot tell (root may write anywhere by them, yet not
    under /proc; a read-only mount says so only when written). `above` is the nearest folder that exists; `shown`
    the --out the message names (`path` itself by default)."""
    created = [p for p in (path, *path.parents) if not p.exists()]  # (deepest first)
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=path, prefix=".libra-probe-")
        os.close(handle)
        os.unlink(name)
    except OSError as exc:
        where = f"cannot create it in {above}" if created else f"cannot write in {path}"
        raise CLIError(f"--out {shown or path}: {where} ({exc.strerror or exc})") from None
    finally:
        for folder in created:  # only the folders made here, each empty again
            with contextlib.suppress(OSError):
                folder.rmdir()


def progress_bar(*, total: int, desc: str, unit: str, enabled: bool = True):
    """A tqdm bar on stderr, shown only on a terminal, where it is cleared when it closes (`leave=False`): written
    to a file, its carriage returns would put the bar on the same line as the error or the table after it."""
    from tqdm import tqdm

    shown = enabled and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not shown, leave=False)


def one_line(text: str) -> str:
    """A message on one line: a library's message over several lines, or a file name holding a newline, must not
    break the contract of one error line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def add_setup_args(p: argparse.ArgumentParser, *, gpus: int = 48) -> None:
    """The cluster, model and cost-model options that `plan`, `simulate` and `estimate` share."""
    p.add_argument("--gpus", type=int, default=gpus, help=f"total GPUs (default {gpus})")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node, joined by NVLink (default 8)")
    p.add_argument("--gpu", default="A800-80GB", help="GPU preset (A800-80GB, A100-80GB, H100-80GB, H200)")
    p.add_argument("--cluster", metavar="FILE", help="YAML/JSON cluster file (overrides --gpus/--gpus-per-node/--gpu)")
    p.add_argument("--model", default="Qwen3-14B", help="model preset name or a YAML/JSON file of ModelSpec fields")
    p.add_argument(
        "--coeffs",
        metavar="FILE",
        help="YAML/JSON file of cost-model coefficients (e.g. fitted by calibrate); the rest keep defaults",
    )


def setup_from_args(args: argparse.Namespace):
    """(cluster, model, coefficients or None) from the options of `add_setup_args`."""
    from libra.planning.cost import load_coefficients
    from libra.spec import ClusterSpec, get_gpu, load_cluster, load_model

    if args.cluster:
        cluster = load_cluster(args.cluster)
    else:
        cluster = ClusterSpec.from_total(gpu=get_gpu(args.gpu), num_gpus=args.gpus, gpus_per_node=args.gpus_per_node)
    return cluster, load_model(args.model), load_coefficients(args.coeffs) if args.coeffs else None


def log(message: str) -> None:
    print(message, file=sys.stderr)


def emit_json(obj: dict[str, Any]) -> None:
    print(json.dumps(jsonable(obj), indent=2))


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if "." in f"{value:.{digits}f}" else f"{value:,}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _decimals(column: Sequence[Any]) -> int | None:
    """Decimals that show every float of a column to about four significant digits (at most 3), the same for all
    of its numbers so that their points line up; None where `fmt` is kept (no floats, or one it writes as 1e+06)."""
    floats = [v for v in column if isinstance(v, float) and math.isfinite(v)]
    if not floats or any(v != 0 and not 1e-3 <= abs(v) < 1e6 for v in floats):
        return None
    if all(v.is_integer() for v in floats):
        return 0
    return max(min(3, max(0, 3 - math.floor(math.log10(abs(v))))) if v else 0 for v in floats)


def _cell(value: Any, decimals: int | None) -> str:
    if decimals is None or isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return fmt(value)
    return f"{value:,.{decimals}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> str:
    """A plain-text table; numbers right-aligned, a column's floats with the same decimals ("-" stands for none)."""
    decimals = [_decimals([row[i] for row in rows]) for i in range(len(headers))]
    cells = [[_cell(c, d) for c, d in zip(row, decimals)] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [
        any(isinstance(row[i], int | float) for row in rows)
        and all(isinstance(row[i], int | float) or row[i] == "-" for row in rows)
        for i in range(len(headers))
    ]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.rjust(w) if num else s.ljust(w) for s, w, num in zip(items, widths, numeric)).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(headers))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def key_values(pairs: Sequence[tuple[str, Any]], *, title: str | None = None) -> str:
    width = max(len(k) for k, _ in pairs)
    out = [title] if title else []
    out.extend(f"{k.ljust(width)}  {fmt(v)}" for k, v in pairs)
    return "\n".join(out)


def add_tool_latency_args(p: argparse.ArgumentParser) -> None:
    """The options for the tool calls a trace does not time, which `plan` and `simulate` share."""
    p.add_argument(
        "--tool-latency",
        metavar="SPEC",
        default=None,
        help="median seconds of a tool call where the trace records none (`tool_latency_s`): a number, or "
        "TOOL=SECONDS pairs with an optional *=SECONDS for the other tools, e.g. python=0.3,search=4 (default 2; "
        "calls are drawn lognormal around it, --tool-latency-sigma; the generators record every call)",
    )
    p.add_argument(
        "--tool-latency-sigma",
        type=float,
        default=None,
        metavar="S",
        help="log-spread of the drawn tool calls (default 0.8: one call in a thousand takes about 12x the median)",
    )


def tool_latency_from_args(args: argparse.Namespace):
    """`ToolLatency` from --tool-latency and --tool-latency-sigma, or None for the default (checked: finite
    seconds in (0, 3600], a spread in [0, 3], non-empty tool names; refused without --trace)."""
    from libra.sim import ToolLatency

    if args.tool_latency is None and args.tool_latency_sigma is None:
        return None
    if not args.trace:
        raise CLIError("--tool-latency sets the calls a trace does not time; the synthetic workloads time every call")
    default = ToolLatency()
    sigma = default.sigma if args.tool_latency_sigma is None else args.tool_latency_sigma
    if not math.isfinite(sigma) or not 0 <= sigma <= 3:
        raise CLIError(f"--tool-latency-sigma must be in [0, 3], got {sigma}")
    median, per_tool = default.median_s, {}
    for item in (args.tool_latency or "").split(",") if args.tool_latency is not None else []:
        name, sep, value = item.strip().rpartition("=")
        if sep and not name.strip():
            raise CLIError(f"--tool-latency: {item.strip()!r} names no tool; expected TOOL=SECONDS or *=SECONDS")
        try:
            seconds = float(value)
        except ValueError:
            raise CLIError(f"--tool-latency: {item.strip()!r} is not SECONDS or TOOL=SECONDS") from None
        if not math.isfinite(seconds) or not 0 < seconds <= 3600:
            raise CLIError(f"--tool-latency: seconds must be in (0, 3600], got {value.strip()}")
        if not sep or name.strip() == "*":
            median = seconds
        else:
            per_tool[name.strip()] = seconds
    return ToolLatency(median_s=median, sigma=sigma, per_tool_median_s=per_tool)
