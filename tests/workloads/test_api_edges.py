"""The workloads API called from Python with odd arguments: one-line errors naming the argument, never a traceback
from deep inside (numpy, slicing, a KeyError) nor a silent wrong answer."""

from __future__ import annotations

import gzip
import json
import math
import shutil

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libra.spec import SpecError
from libra.workloads import WORKLOAD_NAMES, Trajectory, Turn, generate, profile_from_trajectories, profiles_over_steps
from libra.workloads.corpus import DEFAULT_CORPUS, load_corpus, load_manifest
from libra.workloads.generators import WorkloadGenerator
from libra.workloads.importers import StatusRules, TokenizerError, get_counter, import_files
from libra.workloads.trace import TraceError, load_trace

ONE = Trajectory(prompt_id="p", prompt_tokens=10, turns=(Turn(gen_tokens=5),))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trajectories": []}, "cannot build a workload profile from zero trajectories"),
        ({"trajectories": "abc"}, "trajectories must be a list of Trajectory values, got str"),
        ({"trajectories": [ONE, {"prompt_id": "p"}]}, "trajectories must be Trajectory values, got a dict"),
        ({"window_steps": 0}, "window_steps must be an integer >= 1, got 0"),
        ({"window_steps": True}, "window_steps must be an integer >= 1, got True"),
        ({"window_steps": 1.5}, "window_steps must be an integer >= 1, got 1.5"),
        ({"requests_per_step": math.nan}, "requests_per_step must be an integer >= 1 or None, got nan"),
        ({"requests_per_step": 0}, "requests_per_step must be an integer >= 1 or None, got 0"),
        ({"mean_tool_time_s": "2"}, "mean_tool_time_s must be finite seconds >= 0, got '2'"),
        ({"mean_tool_time_s": math.inf}, "mean_tool_time_s must be finite seconds >= 0, got inf"),
        ({"name": 5}, "name must be a non-empty string, got 5"),
    ],
)
def test_a_profile_of_odd_arguments_is_one_clear_error(kwargs, message) -> None:
    kwargs = {"trajectories": [ONE], **kwargs}
    with pytest.raises(SpecError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        profile_from_trajectories(**kwargs)


def test_profiles_over_steps_names_a_window_below_one() -> None:
    with pytest.raises(SpecError, match="^window_steps must be an integer >= 1, got 0$"):
        profiles_over_steps([ONE], window_steps=0)  # (it said: zero trajectories)
    assert profiles_over_steps([]) == []


def test_profiles_of_one_turn_and_of_the_longest_trajectory() -> None:
    longest = Trajectory(prompt_id="p", prompt_tokens=10_000_000 - 1, turns=(Turn(gen_tokens=1),))
    profile = profile_from_trajectories([ONE, longest])
    assert profile.total_lengths == (15.0, 10_000_000.0) and profile.turns == (1.0, 1.0)
    slow = Turn(gen_tokens=1, tool="x", tool_tokens=1, extra={"tool_latency_s": 3600})
    timed = Trajectory(prompt_id="q", prompt_tokens=1, turns=(slow, Turn(gen_tokens=1)))
    assert profile_from_trajectories([timed]).tool_s == (3600.0,)


def _corpus_copy(tmp_path, manifest_change=None):
    root = tmp_path / "corpus"
    root.mkdir()
    manifest = load_manifest()
    src = manifest["sources"][2]  # swe-agent-demos: small
    shutil.copy(DEFAULT_CORPUS / src["file"], root / src["file"])
    manifest = {**manifest, "sources": [{**src, **(manifest_change or {})}]}
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    return root, src


def test_a_copy_of_the_corpus_loads() -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        root, src = _corpus_copy(Path(d))
        assert len(load_corpus(root)[src["name"]]) == src["trajectories"]


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "cannot read the corpus manifest: No such file or directory"),
        ("{bad", "not valid JSON"),
        ("[]", "the manifest must be an object with a list of sources"),
        ('{"sources": [{"name": "a"}]}', "field 'sources[0].file': must be a non-empty string, got None"),
        ('{"sources": [{"name": "a", "file": "../x.jsonl.gz"}]}', "must name a file in the corpus folder"),
        ('{"sources": [{"name": "a", "file": "a.gz", "trajectories": -1}]}', "must be an integer >= 1, got -1"),
        ('{"sources": [{"name": "a", "file": "a"}, {"name": "a", "file": "b"}]}', "'a' names two sources"),
    ],
)
def test_a_broken_manifest_is_one_error_naming_it(tmp_path, manifest, message) -> None:
    if manifest is not None:
        (tmp_path / "MANIFEST.json").write_text(manifest)
    with pytest.raises(TraceError, match="MANIFEST.json") as info:
        load_corpus(tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_corpus_trace_that_lost_trajectories_is_found(tmp_path) -> None:
    """Where the manifest records no sums of the trace itself, a trace cut at a line end (still a whole gzip stream)
    is found by its count."""
    root, src = _corpus_copy(tmp_path, {"trace_sha256": None, "trace_bytes": None})
    path = root / src["file"]
    lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)
    path.write_bytes(gzip.compress(b"".join(lines[:-1])))
    with pytest.raises(TraceError, match=f"holds {len(lines) - 1} trajectories; the manifest says {len(lines)}$"):
        load_corpus(root)
    path.unlink()
    with pytest.raises(TraceError, match="cannot open trace: it does not exist"):
        load_corpus(root)


def test_a_corpus_trace_that_is_not_the_manifests_is_refused_before_it_is_read(tmp_path) -> None:
    """`load_corpus` checks the committed trace's own sums: one byte changed (the same size, still a gzip stream
    that may well parse) is refused by its sha256, a trace cut short by its size."""
    root, src = _corpus_copy(tmp_path)
    path = root / src["file"]
    data = bytearray(path.read_bytes())
    data[4] ^= 0x01  # the gzip header's time: the stream still decompresses to the same trajectories
    path.write_bytes(bytes(data))
    assert len(load_trace(path)) == src["trajectories"]
    with pytest.raises(TraceError, match="its sha256 is not the manifest's trace_sha256: the file was changed$"):
        load_corpus(root)
    path.write_bytes(bytes(data[:-10]))
    with pytest.raises(TraceError, match=f"is {len(data) - 10:,} bytes; the manifest says {len(data):,}"):
        load_corpus(root)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trace_sha256": "ABC"}, "trace_sha256': must be 64 lowercase hex digits, got 'ABC'"),
        ({"trace_bytes": True}, "trace_bytes': must be an integer >= 1, got True"),
        ({"trace_bytes": 0}, "trace_bytes': must be an integer >= 1, got 0"),
    ],
)
def test_a_manifest_with_bad_trace_sums_is_one_error(tmp_path, change, message) -> None:
    root, _ = _corpus_copy(tmp_path, change)
    with pytest.raises(TraceError) as info:
        load_corpus(root)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_prompts": 10**12}, "num_prompts must be at most 1,048,576, got 1,000,000,000,000"),
        ({"num_prompts": 2048, "samples_per_prompt": 1024}, "at most 1,048,576 trajectories a step, got 2,048 x 1,024"),
        ({"num_dataset_prompts": 10**10}, "num_dataset_prompts must be at most 16,777,216"),
        ({"max_model_len": 10**8}, "max_model_len must be at most 10,000,000, got 100,000,000"),
        ({"name": ["search-r1"]}, "unknown workload ['search-r1']"),
        ({"num_prompts": math.nan}, "num_prompts must be an integer >= 1, got nan"),
    ],
)
def test_a_generator_of_odd_sizes_is_refused_before_any_array_is_made(kwargs, message) -> None:
    kwargs = {"name": "search-r1", "seed": 0, **kwargs}
    with pytest.raises(SpecError) as info:
        WorkloadGenerator(**kwargs)  # (it ran out of memory, or raised TypeError: unhashable type)
    assert message in str(info.value)


def test_generate_refuses_more_trajectories_than_it_can_hold_before_making_any(monkeypatch) -> None:
    monkeypatch.setattr(WorkloadGenerator, "step", lambda self, step: pytest.fail(f"step {step} was made"))
    with pytest.raises(SpecError, match=r"^num_steps x num_prompts x samples_per_prompt must be at most 10,485,760"):
        generate("search-r1", num_steps=10**6, seed=0)  # (it made 1,024 a step until memory ran out)
    with pytest.raises(SpecError, match=r"^step must be at most"):
        generate("search-r1", num_steps=2, seed=0, num_prompts=1, samples_per_prompt=1, start_step=2**63 - 2)


def test_progress_refuses_a_step_that_step_refuses() -> None:
    with pytest.raises(SpecError, match="^step must be a non-negative integer, got -5$"):
        WorkloadGenerator("search-r1", seed=0).progress(-5)


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(WORKLOAD_NAMES),
    seed=st.integers(0, 2**70),
    max_model_len=st.sampled_from([1, 2, 100, 1000, 40960, 10_000_000]),
    drift_steps=st.integers(1, 3),
    start_step=st.integers(0, 5),
)
def test_generated_trajectories_obey_the_schema(name, seed, max_model_len, drift_steps, start_step) -> None:
    """They are made without the constructors' checks (`trusted_values`): each must pass them anyway."""
    trajs = generate(
        name,
        num_steps=1,
        seed=seed,
        num_prompts=3,
        samples_per_prompt=2,
        max_model_len=max_model_len,
        drift_steps=drift_steps,
        start_step=start_step,
    )
    assert len(trajs) == 6
    for t in trajs:
        assert [attrs.evolve(u) for u in t.turns] == list(t.turns)  # (each made again by the checking constructor)
        assert attrs.evolve(t) == t


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"paths": "log.json"}, "paths must be a list of files, got str: 'log.json'"),
        ({"paths": [5]}, "paths must be file names, got 5"),
        (
            {"fmt": ["openai"]},
            "unknown import format ['openai']; expected one of openai, swe-agent, mini-swe-agent, verl, atif",
        ),
        ({"tokenizer": 5}, "tokenizer must be a tokenizer's name or a tokenizer.json path, got 5"),
        ({"rules": "x"}, "rules must be StatusRules or None, got str"),
        ({"source": 5}, "source must be a non-empty string or None, got 5"),
    ],
)
def test_import_files_names_an_odd_argument(kwargs, message) -> None:
    kwargs = {"fmt": "openai", "paths": ["log.json"], **kwargs}
    with pytest.raises(ValueError) as info:
        import_files(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("name", [5, None, ""])
def test_get_counter_names_a_tokenizer_that_is_not_a_name(name) -> None:
    with pytest.raises(TokenizerError, match="^tokenizer must be a tokenizer's name or a tokenizer.json path, got "):
        get_counter(name)  # (it raised TypeError from pathlib, or took "" for the current folder)


def test_status_rules_refuse_a_pattern_string_for_a_list_of_them() -> None:
    with pytest.raises(ValueError, match="^error_patterns must be a tuple of regular expressions, got 'error'$"):
        StatusRules(error_patterns="error")  # type: ignore[arg-type]  # (it matched any line holding an e, r or o)


def _verl(tmp_path, **fields) -> list[Trajectory]:
    path = tmp_path / "v.jsonl"
    path.write_text(json.dumps({"uid": "u", "prompt_length": 4, "response_mask": [1, 1, 0, 1], **fields}) + "\n")
    return import_files("verl", [path])


def test_verl_labels_that_are_not_counts_are_left_out(tmp_path) -> None:
    (t,) = _verl(tmp_path, global_steps=True, sample=True, reward_score=10**400)
    assert (t.step, t.sample, t.reward) == (None, None, None)  # (True was step 1; the reward an OverflowError)
    assert t.extra["reward_not_finite"] == str(10**400)


def test_an_imported_log_too_long_for_a_trace_is_an_error_naming_the_file(tmp_path) -> None:
    with pytest.raises(TraceError) as info:
        _verl(tmp_path, prompt_length=10_000_000)
    assert str(info.value).startswith(f"{tmp_path / 'v.jsonl'}:1:") and "must hold 1 to 10,000,000" in str(info.value)
    with pytest.raises(TraceError, match=r"v\.jsonl:1: field 'step': must be an integer in \[0, 10,000,000\]"):
        _verl(tmp_path, global_steps=10**8)


CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


@pytest.mark.parametrize("fmt", ["openai", "swe-agent", "mini-swe-agent", "verl", "atif"])
def test_json_nested_too_deeply_is_one_error_naming_the_file(tmp_path, fmt) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceError, match=r"deep\.json: not valid JSON \(nested too deeply\)$"):
        import_files(fmt, [path], tokenizer="bytes4")  # (it was a RecursionError)


@pytest.mark.parametrize(
    ("fmt", "record"),
    [
        ("openai", {"messages": CHAT, "reward": "BIG"}),
        (
            "atif",
            {
                "schema_version": "ATIF-v1.7",
                "session_id": "s",
                "reward": "BIG",
                "steps": [
                    {"step_id": 1, "source": "user", "message": "hi"},
                    {"step_id": 2, "source": "agent", "message": "yo"},
                ],
            },
        ),
    ],
)
def test_a_reward_past_a_float_is_kept_aside_not_an_overflow(tmp_path, fmt, record) -> None:
    big = "9" * 400
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record).replace('"BIG"', big))
    (t,) = import_files(fmt, [path], tokenizer="bytes4")  # (float() raised OverflowError)
    assert t.reward is None and t.extra["reward_not_finite"] == big


def test_an_inspect_score_past_a_float_is_kept_aside_not_an_overflow(tmp_path) -> None:
    spec = {"task": "t", "task_id": "t1", "run_id": "r1", "model": "m", "dataset": {"name": "d"}}
    one = {"id": 1, "epoch": 1, "input": "hi", "messages": CHAT, "scores": {"m": {"value": "BIG"}}, "metadata": {}}
    log = {"version": 2, "status": "success", "eval": spec, "plan": {}, "results": {}, "stats": {}, "samples": [one]}
    path = tmp_path / "log.json"
    path.write_text(json.dumps(log).replace('"BIG"', "9" * 400))
    (t,) = import_files("openai", [path], tokenizer="bytes4")
    assert t.reward is None and t.extra["reward_not_finite"] == "9" * 400


def test_a_call_or_an_output_nested_too_deeply_is_read_as_text(tmp_path) -> None:
    """A model may write anything as a call's text, a tool anything as its output: JSON nested past the parser's
    depth is not JSON (it was a RecursionError)."""
    from libra.workloads.importers.dialects import _json_output

    deep = "[" * 100_000 + "]" * 100_000
    turns = [
        {"from": "human", "value": "hi"},
        {"from": "function_call", "value": deep},
        {"from": "observation", "value": "ok"},
        {"from": "gpt", "value": "done"},
    ]
    path = tmp_path / "share.json"
    path.write_text(json.dumps({"conversations": turns}))
    (t,) = import_files("openai", [path], tokenizer="bytes4")
    assert t.turns[0].tool == "tool"
    assert _json_output('{"output": ' + deep + "}") is None
