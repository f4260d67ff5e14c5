"""The generators' output, byte for byte: a speed-up or a refactor must not change the random stream.

The digests are sha256 of the JSON Lines trace of 2 steps x 4 prompts x 16 samples (seed 0), early in the drift and
late with a cap that cuts trajectories, each line without its synthetic label (the trailing `"source":
"synthetic:NAME"`, which the test checks is on every line: the digests predate the label and pin the random stream
alone). A change meant to alter a workload updates them, and says so in its commit. (They assume numpy's
`Generator` streams, which numpy keeps stable within a major version.)
"""

from __future__ import annotations

import hashlib

import pytest

from libra.workloads import write_trace
from libra.workloads.generators import generate

FINGERPRINTS = {
    ("search-r1", 0, 40960): "a7692fd018b972cd4fdf6b115a8bf89c65da81e7711d43fc76ab4e790f22c7a6",
    ("search-r1", 80, 8000): "a7469320a707651468930c8cb3c5020fcd3c7a21ac4504d235c54182f392272c",
    ("dapo-math", 0, 40960): "760a1e43ecae3335b42c15c871abd0f250e43a9e5f6962cd0371efada63bb4da",
    ("dapo-math", 80, 8000): "92f4d1addb56355f12264742e5a4e356c3ffdb680cb9a191b1458c0adcea47d0",
    ("r2e-gym", 0, 40960): "346fcf899a56a2f3321bf4c0e5877839a6c0bf8c56445486c013097a83975ab3",
    ("r2e-gym", 80, 8000): "345fc3f9e6feea308682d8e33c3e58bfd553994139611fb8443094c1e5cbdbfd",
    ("swe-agent", 0, 40960): "9476ef5226f040b682e7fff56c7ffbf77f40bb7ef2e9dc3fb84cc4fa17872627",
    ("swe-agent", 80, 8000): "7e16ff0de4f8866826822ff9be30339f1d2cef5bdf6eeaf62abe009baa3b40ef",
}


@pytest.mark.parametrize(("name", "start_step", "max_model_len"), sorted(FINGERPRINTS))
def test_output_matches_the_stored_fingerprint(name, start_step, max_model_len, tmp_path) -> None:
    trajectories = generate(
        name,
        num_steps=2,
        seed=0,
        num_prompts=4,
        samples_per_prompt=16,
        start_step=start_step,
        max_model_len=max_model_len,
    )
    if max_model_len < 40960:
        assert any(t.total_tokens == max_model_len for t in trajectories), "the cap must cut some trajectories"
    path = tmp_path / "trace.jsonl"
    write_trace(path, trajectories)
    label = f',"source":"synthetic:{name}"}}'.encode()
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines and all(line.rstrip(b"\n").endswith(label) for line in lines), "every line says it is synthetic"
    unlabelled = b"".join(line.rstrip(b"\n")[: -len(label)] + b"}\n" for line in lines)
    assert hashlib.sha256(unlabelled).hexdigest() == FINGERPRINTS[name, start_step, max_model_len]
