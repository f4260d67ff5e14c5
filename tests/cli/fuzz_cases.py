"""Seeded bad-input cases for the CLI and the loaders, and a runner that executes each in a forked child with a time
and a memory limit. Used by `tests/cli/test_fuzz.py` (a few hundred cases) and `scripts/fuzz_cli.py` (thousands).

A case is an argv for `libra` plus the files it names, written into the case's own folder. The contract checked:
the child exits 0 (a result) or 2 (a user error); a user error is ONE line `libra: error: ...` on stderr (or
argparse's own one-line error); never a traceback, an `internal error`, a crash, a hang past the time
limit or an allocation past the memory limit.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

_BIG = 2**63


@attrs.frozen
class Case:
    kind: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()  # (name, content) written into the case folder first


@attrs.frozen
class Outcome:
    case: Case
    verdict: str  # ok, error, usage, internal, traceback, crash, hang, several-lines
    code: int | None
    stderr: str
    seconds: float


# --- values -----------------------------------------------------------------------------------------------------
_INTS = ["0", "1", "2", "3", "-1", "-5", "7", str(_BIG), str(2**31), "1e3", "x", "", "nan", " 4", "08"]
_FLOATS = [0, -1, 1.5, 1e30, 1e-30, float("nan"), float("inf"), "3e-6", "x", True, None, [], {}, 2**63, 10**12]
MODEL_FIELDS = {  # a valid ModelSpec file's fields (test_rough_edges.py takes them too)
    "num_layers": 8,
    "hidden_size": 512,
    "num_heads": 8,
    "num_kv_heads": 2,
    "head_dim": 64,
    "ffn_hidden_size": 1024,
    "vocab_size": 32000,
}
_MODEL_BAD = [0, -1, 1.5, True, False, "8", None, 10**9, 2**63, 1e300, [8], {"a": 1}]
_CLUSTER = {"gpu": "A800-80GB", "num_nodes": 1, "gpus_per_node": 8}
_GPU = {
    "name": "g",
    "memory_gb": 80,
    "bf16_tflops": 312,
    "hbm_bandwidth_gbs": 2039,
    "nvlink_bandwidth_gbs": 200,
    "network_bandwidth_gbs": 25,
}
_COEFFS = ["decode_mfu", "dp_overlap", "step_overhead_s", "max_num_seqs", "kv_fill", "activation_reserve_gb"]
_SPECIAL_PATHS = ["/proc/self/mem", "/proc/self/status", "/dev/null", "/dev/zero", ".", "missing.yaml", "/proc"]


def _dump(obj, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return json.dumps(obj, allow_nan=True).encode()
    return "\n".join(f"{k}: {json.dumps(v, allow_nan=True)}" for k, v in obj.items()).encode() + b"\n"


def _garbage(rng: random.Random) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if choice == 1:
        return b"\xff\xfe" + "num_layers: 8\n".encode("utf-16-le")
    if choice == 2:
        depth = rng.choice([1_000, 100_000])
        return b"[" * depth + b"]" * depth
    if choice == 3:
        return b"a: &x [1, 2]\nb: [*x, *x, *x]\n"
    if choice == 4:
        return b"- 1\n- 2\n"
    return b'{"num_layers": 8'


def _model_file(rng: random.Random) -> tuple[str, bytes]:
    suffix = rng.choice([".yaml", ".json"])
    if rng.random() < 0.25:
        return "model" + suffix, _garbage(rng)
    obj: dict = dict(MODEL_FIELDS)
    for _ in range(rng.randrange(1, 3)):
        key = rng.choice([*MODEL_FIELDS, "num_experts", "tie_embeddings", "moe_ffn_hidden_size", "dtype_bytes", "name"])
        obj[key] = rng.choice(_MODEL_BAD + ["no", "yes"])
    if rng.random() < 0.1:
        obj.pop(rng.choice(list(MODEL_FIELDS)))
    return "model" + suffix, _dump(obj, rng)


def _cluster_file(rng: random.Random) -> tuple[str, bytes]:
    suffix = rng.choice([".yaml", ".json"])
    if rng.random() < 0.2:
        return "cluster" + suffix, _garbage(rng)
    obj: dict = dict(_CLUSTER)
    if rng.random() < 0.5:
        gpu = dict(_GPU)
        gpu[rng.choice(list(_GPU))] = rng.choice(_FLOATS)
        obj["gpu"] = gpu
    key = rng.choice(["num_nodes", "gpus_per_node", "gpu"])
    obj[key] = rng.choice([*_MODEL_BAD, "A800-80GB", "TPU", 1e9, 2.5])
    return "cluster" + suffix, _dump(obj, rng)


def _coeffs_file(rng: random.Random) -> tuple[str, bytes]:
    if rng.random() < 0.2:
        return "coeffs.yaml", _garbage(rng)
    obj = {rng.choice(_COEFFS): rng.choice(_FLOATS + [1e12, 0.5])}
    return "coeffs.yaml", _dump(obj, rng)


def _trace_line(rng: random.Random, step: int, k: int) -> dict:
    turns = [
        {"gen_tokens": rng.randrange(1, 400), "tool": "search", "tool_status": "ok", "tool_tokens": 50}
        for _ in range(rng.randrange(0, 3))
    ]
    turns.append({"gen_tokens": rng.randrange(1, 400)})
    return {"prompt_id": f"p{k // 2}", "sample": k % 2, "step": step, "prompt_tokens": 200, "turns": turns}


def _trace_file(rng: random.Random) -> tuple[str, bytes]:
    lines = [_trace_line(rng, step, k) for step in range(2) for k in range(8)]
    bad = lines[rng.randrange(len(lines))]
    choice = rng.randrange(12)
    if choice == 0:
        bad["prompt_tokens"] = rng.choice([2**63, 10**12, -1, 1.5, True, "100"])
    elif choice == 1:
        bad["turns"][-1]["gen_tokens"] = rng.choice([2**63, 10**12, 10**9, -3, None])
    elif choice == 2:
        bad["reward"] = rng.choice([float("nan"), float("inf"), "1", True])
    elif choice == 3:
        bad["turns"][0]["tool_latency_s"] = rng.choice([float("nan"), -1, "x", True, 1e9, float("inf")])
    elif choice == 4:
        bad["turns"] = [{"gen_tokens": 1, "tool": "t", "tool_status": "ok"}] * 10_000 + [{"gen_tokens": 1}]
    elif choice == 5:
        bad["turns"] = []
    elif choice == 6:
        bad["step"] = rng.choice([-1, 1.5, "a", 2**63])
    elif choice == 7:
        return "trace.jsonl", _garbage(rng)
    elif choice == 8:
        body = "\n".join(json.dumps(x) for x in lines).encode()
        return "trace.jsonl", body + b"\n\xff\xfe\n"
    elif choice == 9:
        return "trace.jsonl", b""
    elif choice == 10:
        for line in lines:  # every length zero
            line["prompt_tokens"] = 0
            for turn in line["turns"]:
                turn["gen_tokens"] = 0
                turn["tool_tokens"] = 0
    text = "\n".join(json.dumps(x, allow_nan=True) for x in lines) + "\n"
    return "trace.jsonl", text.encode()


def _path_or_file(rng: random.Random, make) -> tuple[str, tuple[tuple[str, bytes], ...]]:
    if rng.random() < 0.15:
        return rng.choice(_SPECIAL_PATHS), ()
    name, content = make(rng)
    return name, ((name, content),)


_SMALL_SIM = ("--gpus", "8", "--prompts", "2", "--samples", "2", "--steps", "1", "--slices", "5")


def _plan_case(rng: random.Random) -> Case:
    argv = ["plan", "--json", "--prompts", "8", "--samples", "2"]
    files: tuple = ()
    choice = rng.randrange(7)
    if choice == 0:
        argv += [rng.choice(["--gpus", "--gpus-per-node", "--step", "--window-steps", "--max-len"]), rng.choice(_INTS)]
    elif choice == 1:
        argv += ["--gpus", "16", "--tp-degrees", rng.choice(["3", "0", "1,x", "", ",", "16", "-1", "1,2", "5,8"])]
    elif choice == 2:
        path, files = _path_or_file(rng, _model_file)
        argv += ["--gpus", "16", "--model", path]
    elif choice == 3:
        path, files = _path_or_file(rng, _cluster_file)
        argv += ["--cluster", path]
    elif choice == 4:
        path, files = _path_or_file(rng, _coeffs_file)
        argv += ["--gpus", "16", "--coeffs", path]
    elif choice == 5:
        path, files = _path_or_file(rng, _trace_file)
        argv = ["plan", "--json", "--gpus", "16", "--trace", path]
    else:
        argv += ["--gpus", rng.choice(["8", "2", "4"]), "--model", rng.choice(["Qwen3-14B", "Qwen3-4B", "x"])]
    return Case("plan", tuple(argv), files)


def _trace_case(rng: random.Random) -> Case:
    options = [
        ["--workload", rng.choice(["r2e-gym", "dapo-math", "search-r1", "x"])],
        ["--steps", rng.choice(["1", "2", "0", "-1", str(_BIG)])],
        ["--prompts", rng.choice(["2", "0", str(_BIG)])],
        ["--samples", rng.choice(["2", "-3", str(2**40)])],
        ["--max-model-len", rng.choice(["100", "1", "40960", "0"])],
        ["--seed", rng.choice(["0", "-1", str(_BIG)])],
        ["--out", rng.choice(["t.jsonl", ".", "missing/t.jsonl"])],
    ]
    chosen = [o for o in options if rng.random() < 0.5]
    argv = ["trace", "--prompts", "2", "--samples", "2"]
    split = rng.randrange(len(chosen) + 1)
    for o in chosen[:split]:
        argv += o
    argv.append("generate")
    for o in chosen[split:]:
        argv += o
    return Case("trace", tuple(argv))


def _route_case(rng: random.Random) -> Case:
    argv = ["route-eval", "--json", "--steps", "2", "--prompts", "4", "--samples", "2"]
    files: tuple = ()
    choice = rng.randrange(4)
    if choice == 0:
        argv += ["--buckets", rng.choice(["1:0.5,2:inf", "1:nan", "0:5", "1:5,1:5", "2:100,4:inf", "", "x", "1:-inf"])]
    elif choice == 1:
        argv += [rng.choice(["--chunks", "--warmup-steps", "--steps", "--prompts"]), rng.choice(_INTS)]
    elif choice == 2:
        path, files = _path_or_file(rng, _trace_file)
        argv = ["route-eval", "--json", "--trace", path]
    else:
        argv += ["--option", rng.choice(["rule=median", "x", "=1", "size_edges=1,2", "nope=1"])]
    return Case("route-eval", tuple(argv), files)


def _simulate_case(rng: random.Random) -> Case:
    argv = ["simulate", "--json", "--no-plots", "--policy", "colocated", "--workers", "1", *_SMALL_SIM]
    files: tuple = ()
    choice = rng.randrange(6)
    if choice == 0:
        path, files = _path_or_file(rng, _trace_file)
        argv += ["--trace", path, "--samples", "2"]
    elif choice == 4:  # steps drawn from a trace (the synthetic defaults' --steps 1 replaced)
        path, files = _path_or_file(rng, _trace_file)
        if rng.random() < 0.5:  # --resample's own default of 3 steps
            at = argv.index("--steps")
            argv = argv[:at] + argv[at + 2 :]
        argv += ["--trace", path, "--resample", rng.choice(["--steps", "--prompts"]), rng.choice(_INTS)]
    elif choice == 5:  # the calls a trace does not time
        path, files = _path_or_file(rng, _trace_file)
        spec = rng.choice(["2", "0", "-1", "nan", "inf", "x", "", "=", "*=1", "a=1,b=x", "a=1,,b=2", "1e9", "t=0.5"])
        argv += ["--trace", path, "--tool-latency", spec]
        argv += (
            ["--tool-latency-sigma", rng.choice(["0", "0.8", "3", "3.1", "-1", "nan", "x"])]
            if rng.random() < 0.5
            else []
        )
    elif choice == 1:
        argv += [rng.choice(["--slices", "--workers", "--drift-steps", "--max-len", "--seed"]), rng.choice(_INTS)]
    elif choice == 2:
        files = (("taken", b"x"),)
        argv += ["--out", "taken"]
    else:
        path, files = _path_or_file(rng, _model_file)
        argv += ["--model", path]
    return Case("simulate", tuple(argv), files)


_MAKERS = {"plan": _plan_case, "trace": _trace_case, "route-eval": _route_case, "simulate": _simulate_case}


def cases(seed: int, count: int, kinds: tuple[str, ...] = tuple(_MAKERS)) -> Iterator[Case]:
    rng = random.Random(seed)
    for _ in range(count):
        yield _MAKERS[rng.choice(kinds)](rng)


# --- the runner -------------------------------------------------------------------------------------------------
def _child(case: Case, folder: Path, memory_bytes: int) -> None:
    """In the forked child: limits, the case's files and folder, then `libra` itself; never returns."""
    code = 70
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        os.chdir(folder)
        out = os.open(folder / "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(folder / "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        from libra.cli import main

        try:
            code = int(main(list(case.argv)) or 0)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        os.write(2, b"\nMemoryError past the fuzz memory limit\n")
        code = 71
    except BaseException:  # noqa: BLE001 - reported as a traceback verdict
        import traceback

        os.write(2, ("\nTraceback (fuzz child)\n" + traceback.format_exc()).encode())
        code = 70
    os._exit(code)


def _verdict(code: int | None, stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip() and not x.startswith("\r") and "it/s" not in x]
    lines = [x for x in lines if not x.startswith(("generating ", "replaying ", "simulating ", "planned in "))]
    if code is None:
        return "hang"
    if "Traceback" in stderr:
        return "traceback"
    if "internal error" in stderr:
        return "internal"
    if code == 0:
        return "ok"
    if code != 2:
        return "crash"
    if len(lines) == 1 and lines[0].startswith("libra: error: "):
        return "error"
    if len(lines) == 1 and lines[0].startswith("libra ") and ": error: " in lines[0]:
        return "usage"  # argparse's own error, on one line
    return "several-lines"


def run_case(case: Case, folder: Path, *, timeout_s: float, memory_bytes: int) -> Outcome:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in case.files:
        (folder / name).write_bytes(content)
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(case, folder, memory_bytes)
    code: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - start > timeout_s:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    seconds = time.monotonic() - start
    stderr = (folder / "stderr").read_text(errors="replace") if (folder / "stderr").exists() else ""
    return Outcome(case=case, verdict=_verdict(code, stderr), code=code, stderr=stderr[-2000:], seconds=seconds)


def memory_limit(extra_gib: float = 3.0) -> int:
    """The parent's current address space plus `extra_gib` (a fork starts with the parent's mappings)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE") + int(extra_gib * (1 << 30))
