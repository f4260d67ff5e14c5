"""`libra simulate` end to end on a small scenario: JSON contract, table, files, one-line errors."""

import json

import pytest

from libra.cli import main

SMALL = ["simulate", "--gpus", "16", "--prompts", "8", "--samples", "4", "--steps", "2"]


def test_json_report_has_the_contract_keys(tmp_path, capsys):
    rc = main([*SMALL, "--policy", "static-uniform,libra", "--out", str(tmp_path), "--json", "--no-plots"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"static-uniform", "libra"}
    for s in out["policies"].values():
        for key in ("throughput_tok_s", "mean_step_s", "gpu_idle_fraction", "reconfigurations", "utilisation"):
            assert key in s
        assert 0 < s["utilisation"] <= 1  # decode rate over capacity, beside occupancy (1 - gpu_idle_fraction)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["policies"] == out["policies"]
    assert len(saved["runs"]["libra"]["steps"]) == 3  # two rollout stages and the final training stage


def test_table_and_plots(tmp_path, capsys):
    rc = main([*SMALL, "--policy", "colocated,greedy", "--out", str(tmp_path)])
    assert rc == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "colocated" in text and "greedy" in text and "tok/s" in text
    # the seconds of moving the weights, which a plan's makespan leaves out, each policy's own
    (note,) = [line for line in captured.err.splitlines() if "moving the weights" in line]
    assert "greedy " in note and "colocated " in note and "`libra plan`" in note
    for name in ("report.json", "throughput.png", "allocation.png", "breakdown.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_plots_of_five_policies_in_a_new_nested_folder(tmp_path, capsys):
    """The allocation plot lays five policies out on a 2 x 4 grid (three cells left empty); `--out` may name folders
    that do not exist yet."""
    out = tmp_path / "runs" / "five"
    policies = "colocated,static-uniform,greedy,static-optimal,libra-homogeneous"
    rc = main([*SMALL, "--steps", "1", "--policy", policies, "--out", str(out)])
    assert rc == 0
    for name in ("report.json", "throughput.png", "allocation.png", "breakdown.png"):
        assert (out / name).stat().st_size > 0
    assert set(json.loads((out / "report.json").read_text())["policies"]) == set(policies.split(","))


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert main([*SMALL, "--policy", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("libra: error: unknown policy nope")
    assert main(["simulate", "--gpus", "12", "--out", str(tmp_path)]) == 2
    assert "divide" in capsys.readouterr().err
    assert main(["simulate", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert main(["simulate", "--workers", "0", "--out", str(tmp_path)]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_trace_input(tmp_path, capsys):
    from libra.workloads import generate, write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("search-r1", num_steps=2, seed=1, num_prompts=8, samples_per_prompt=4))
    rc = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--gpus",
            "16",
            "--steps",
            "2",
            "--samples",
            "4",
            "--policy",
            "static-uniform",
            "--out",
            str(tmp_path / "o"),
            "--json",
            "--no-plots",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"]["static-uniform"]["steps"] == 2


def test_workers_give_the_same_numbers_on_a_trace(tmp_path, capsys):
    from libra.workloads import generate, write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("r2e-gym", num_steps=2, seed=2, num_prompts=8, samples_per_prompt=4))
    runs = {}
    for workers in ("1", "2"):
        rc = main(
            [
                "simulate",
                "--trace",
                str(trace),
                "--gpus",
                "16",
                "--steps",
                "2",
                "--samples",
                "4",
                "--policy",
                "static-uniform,libra-cmlfq,libra",
                "--workers",
                workers,
                "--out",
                str(tmp_path / workers),
                "--json",
                "--no-plots",
            ]
        )
        assert rc == 0
        capsys.readouterr()
        runs[workers] = json.loads((tmp_path / workers / "report.json").read_text())["runs"]
    assert json.dumps(runs["1"], sort_keys=True) == json.dumps(runs["2"], sort_keys=True)


def test_cluster_and_coefficients_files(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("gpu: A800-80GB\nnum_nodes: 2\ngpus_per_node: 8\n")
    runs = {}
    for name, text in (("default", "{}\n"), ("slow", "hbm_efficiency: 0.4\n")):
        coeffs = tmp_path / f"{name}.yaml"
        coeffs.write_text(text)
        rc = main(
            [
                "simulate",
                "--cluster",
                str(cluster),
                "--coeffs",
                str(coeffs),
                "--prompts",
                "8",
                "--samples",
                "4",
                "--steps",
                "2",
                "--policy",
                "static-uniform",
                "--out",
                str(tmp_path / name),
                "--json",
                "--no-plots",
            ]
        )
        assert rc == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs["default"]["gpus"] == 16
    slow, default = (runs[n]["policies"]["static-uniform"]["mean_rollout_s"] for n in ("slow", "default"))
    assert slow > 1.1 * default  # decode reads the weights at half the bandwidth (tool calls do not slow)
    (tmp_path / "bad.yaml").write_text("kv_fill: -1\n")
    assert main([*SMALL, "--coeffs", str(tmp_path / "bad.yaml"), "--out", str(tmp_path)]) == 2
    assert "kv_fill must be a number in (0, 1]" in capsys.readouterr().err


def test_steal_modes(tmp_path, capsys):
    fractions = {}
    for mode in ("all", "new", "off"):
        rc = main(
            [*SMALL, "--policy", "colocated", "--steal", mode, "--out", str(tmp_path / mode), "--json", "--no-plots"]
        )
        assert rc == 0
        fractions[mode] = json.loads(capsys.readouterr().out)["policies"]["colocated"]["rebalanced_token_fraction"]
    assert fractions["new"] == fractions["off"] == 0.0  # only "all" moves turns under way (and re-prefills them)
    with pytest.raises(SystemExit) as exc:  # argparse's own one-line usage error
        main([*SMALL, "--steal", "some", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_dispatch_modes(tmp_path, capsys):
    out = {}
    for mode in ("blocks", "interleaved"):
        rc = main(
            [
                *SMALL,
                "--policy",
                "colocated",
                "--steal",
                "off",
                "--dispatch",
                mode,
                "--out",
                str(tmp_path / mode),
                "--json",
                "--no-plots",
            ]
        )
        assert rc == 0
        out[mode] = json.loads(capsys.readouterr().out)["policies"]["colocated"]
    assert out["blocks"]["steps"] == out["interleaved"]["steps"] == 2
    assert out["blocks"]["mean_rollout_s"] != out["interleaved"]["mean_rollout_s"]  # the spread matters


def test_colocated_switch_and_kv_fraction_change_colocated_only(tmp_path, capsys):
    """The colocated options reach the simulation: a costlier switch and a smaller KV pool slow `colocated`, and
    leave a disaggregated policy as it was; bad values are one-line errors."""
    runs = {}
    for name, extra in {
        "free": ["--colocated-switch-s", "0", "--colocated-kv-fraction", "0.9"],
        "verl": ["--colocated-switch-s", "60", "--colocated-kv-fraction", "0.4"],
    }.items():
        rc = main(
            [
                *SMALL,
                "--policy",
                "colocated,static-uniform",
                "--out",
                str(tmp_path / name),
                "--json",
                "--no-plots",
                *extra,
            ]
        )
        assert rc == 0
        runs[name] = json.loads(capsys.readouterr().out)["policies"]
    assert runs["verl"]["colocated"]["wall_s"] > runs["free"]["colocated"]["wall_s"] + 2 * 2 * 60 * 0.99
    assert runs["verl"]["static-uniform"] == runs["free"]["static-uniform"]
    assert main([*SMALL, "--colocated-kv-fraction", "1.5", "--out", str(tmp_path)]) == 2
    assert "--colocated-kv-fraction must be in (0, 1]" in capsys.readouterr().err
    assert main([*SMALL, "--colocated-switch-s", "nan", "--out", str(tmp_path)]) == 2
    assert main([*SMALL, "--colocated-offload-bytes-per-param", "-1", "--out", str(tmp_path)]) == 2
    assert "--colocated-offload-bytes-per-param must be a number in [0, 1000]" in capsys.readouterr().err


def test_every_trace_option_reads_a_gzipped_trace(tmp_path, capsys):
    """`--trace` of plan, route-eval and simulate all take the corpus's `.jsonl.gz` form."""
    import gzip

    from libra.workloads import generate, write_trace

    plain = tmp_path / "t.jsonl"
    write_trace(plain, generate("search-r1", num_steps=2, seed=1, num_prompts=8, samples_per_prompt=4))
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    outputs = []
    for trace in (plain, packed):
        for args in (
            ["plan", "--trace", str(trace), "--gpus", "16", "--json"],
            ["route-eval", "--trace", str(trace), "--json"],
            ["simulate", "--trace", str(trace), "--gpus", "16", "--steps", "2", "--samples", "4"]
            + ["--policy", "static-uniform", "--out", str(tmp_path / "o"), "--json", "--no-plots"],
        ):
            assert main(args) == 0, args
            out = json.loads(capsys.readouterr().out)
            for key in ("elapsed_s", "solve_time_s", "workload"):  # times, and the file's name
                out.pop(key, None)
            outputs.append(out)
    assert outputs[0]["makespan_s"] == outputs[3]["makespan_s"] and outputs[0]["train"] == outputs[3]["train"]
    assert outputs[1] == outputs[4]
    assert outputs[2]["policies"] == outputs[5]["policies"]


def test_a_trace_is_simulated_over_all_its_steps_by_default(tmp_path, capsys):
    """`--steps` left out with `--trace`: every step of the trace (the synthetic default of 3 steps would refuse a
    one-step trace, as every imported agent log without step labels is)."""
    from libra.workloads import generate, write_trace

    for steps in (1, 4):
        trace = tmp_path / f"t{steps}.jsonl"
        write_trace(trace, generate("search-r1", num_steps=steps, seed=1, num_prompts=8, samples_per_prompt=4))
        out_dir = tmp_path / f"o{steps}"
        args = ["simulate", "--trace", str(trace), "--gpus", "16", "--samples", "4", "--policy", "static-uniform"]
        assert main([*args, "--out", str(out_dir), "--json", "--no-plots"]) == 0
        assert json.loads(capsys.readouterr().out)["policies"]["static-uniform"]["steps"] == steps


def test_a_one_step_trace_is_resampled_into_its_steady_state(tmp_path, capsys):
    """An agent's logs of one batch are one step: the asynchronous policies have nothing to overlap, so the run
    says so and shows no steady throughput; `--resample` draws `--steps` steps of `--prompts` groups from it."""
    from libra.workloads import generate, write_trace

    trace = tmp_path / "t.jsonl"
    write_trace(trace, generate("search-r1", num_steps=1, seed=1, num_prompts=8, samples_per_prompt=4))
    args = ["simulate", "--trace", str(trace), "--gpus", "16", "--policy", "colocated,static-uniform", "--no-plots"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    out, err = capsys.readouterr()
    assert "steady tok/s" in out and "steady throughput vs colocated" not in out
    assert "one step is the pipeline's fill" in err and "--resample" in err
    assert main([*args, "--steps", "3", "--out", str(tmp_path / "x")]) == 2
    want = "--steps 3 but the trace has 1 step (--resample draws steps from it)"
    assert capsys.readouterr().err.strip().endswith(want)
    runs = []
    for i, seed in enumerate(("0", "0", "1")):
        more = ["--resample", "--steps", "3", "--prompts", "6", "--seed", seed, "--json"]
        assert main([*args, *more, "--out", str(tmp_path / f"r{i}")]) == 0
        runs.append(json.loads(capsys.readouterr().out))
        steps = json.loads((tmp_path / f"r{i}" / "report.json").read_text())["runs"]["static-uniform"]["steps"]
        assert [x["trajectories"] for x in steps if x["trajectories"]] == [24, 24, 24]  # 6 groups of 4 samples
        for s in runs[-1]["policies"].values():
            assert s["steps"] == 3 and s["steady_throughput_tok_s"] > 0
    assert runs[0]["workload"] == "t (resampled)"
    assert runs[0]["policies"] == runs[1]["policies"] != runs[2]["policies"]
    assert main([*args, "--resample", "--steps", "2", "--out", str(tmp_path / "r3")]) == 0
    steps = json.loads((tmp_path / "r3" / "report.json").read_text())["runs"]["colocated"]["steps"]
    assert [x["trajectories"] for x in steps] == [32, 32]  # by default as many groups as the trace's step: 8 x 4
    assert "steady throughput vs colocated" in capsys.readouterr().out
    assert main(["simulate", "--resample", "--out", str(tmp_path / "r4")]) == 2
    assert capsys.readouterr().err.strip() == "libra: error: --resample draws steps from a trace: give --trace FILE"


def test_tool_latency_sets_the_calls_a_trace_does_not_time(tmp_path, capsys):
    """A trace without `tool_latency_s` (as every corpus source): its calls are drawn around --tool-latency, per
    tool where named; the default is 2 s; the generators time every call, so it is refused there."""
    import attrs

    from libra.workloads import generate, write_trace

    steps = generate("search-r1", num_steps=1, seed=1, num_prompts=8, samples_per_prompt=4)
    untimed = [attrs.evolve(t, turns=tuple(attrs.evolve(u, extra={}) for u in t.turns)) for t in steps]
    trace = tmp_path / "t.jsonl"
    write_trace(trace, untimed)
    base = ["simulate", "--trace", str(trace), "--gpus", "16", "--policy", "colocated", "--json", "--no-plots"]

    def step_s(*more: str) -> float:
        assert main([*base, *more, "--out", str(tmp_path / f"o{len(list(tmp_path.iterdir()))}")]) == 0
        return json.loads(capsys.readouterr().out)["policies"]["colocated"]["mean_step_s"]

    default, two = step_s(), step_s("--tool-latency", "2")
    assert default == two
    slow, fast = step_s("--tool-latency", "60"), step_s("--tool-latency", "0.05")
    assert fast < default < slow
    assert step_s("--tool-latency", "search=60") == slow  # search-r1 calls only `search`
    assert step_s("--tool-latency", "python=60") == default
    assert step_s("--tool-latency", "search=60,*=0.05") == slow
    assert step_s("--tool-latency", "60", "--tool-latency-sigma", "0") != slow
    for bad, says in (
        ("=3", "names no tool"),
        ("x=abc", "is not SECONDS"),
        ("0", "(0, 3600]"),
        ("nan", "(0, 3600]"),
    ):
        assert main([*base, "--tool-latency", bad, "--out", str(tmp_path / "bad")]) == 2
        assert says in capsys.readouterr().err
    assert main([*base, "--tool-latency-sigma", "4", "--out", str(tmp_path / "bad")]) == 2
    assert "--tool-latency-sigma must be in [0, 3]" in capsys.readouterr().err
    assert main(["simulate", "--tool-latency", "1", "--out", str(tmp_path / "bad")]) == 2
    assert "the synthetic workloads time every call" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_out_below_a_file_is_refused_before_the_simulation(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("x")
    assert main([*SMALL, "--policy", "colocated", "--out", str(taken / "sub")]) == 2
    captured = capsys.readouterr()
    assert f"{taken} is not a folder" in captured.err and "simulating" not in captured.err
    assert "internal error" not in captured.err and len(captured.err.strip().splitlines()) == 1


def test_max_len_shorter_than_the_prompts_is_refused_as_plan_refuses_it(tmp_path, capsys):
    assert main([*SMALL, "--policy", "colocated", "--max-len", "10", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--max-len 10 is shorter than the workload's prompts" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_a_write_that_fails_leaves_no_half_written_file(tmp_path):
    """A full disk (here: a file-size limit of 12 KiB, which a plot passes) is one error line, and leaves neither
    a truncated file nor the folders the run would have created; a folder that was there keeps what it held."""
    import resource
    import subprocess
    import sys

    from tests.limits import scaled

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (12 * 1024, 12 * 1024))

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "report.json").write_text("{}")
    for out in (tmp_path / "new" / "sim", kept):
        argv = [sys.executable, "-m", "libra", *SMALL, "--steps", "1", "--policy", "colocated", "--out", str(out)]
        done = subprocess.run(
            argv, capture_output=True, text=True, preexec_fn=small_files, timeout=scaled(300), check=False
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1].endswith(f"cannot write {out}: File too large")
    assert not (tmp_path / "new").exists()
    assert [p.name for p in kept.iterdir()] == ["report.json"] and (kept / "report.json").read_text() == "{}"
