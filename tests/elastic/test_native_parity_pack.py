"""The snapshot packers against one another on odd layouts: the C++ extension (ext/libra_ext/pack.cpp), the fast
path and the Python reference (libra/elastic/pack.py) write the same bytes and checksums for any layout
`plan_layout` makes (odd sizes and alignments, empty tensors, strided inputs), hash each bucket front to back
whatever order its slots are listed in, and refuse alike what is not a layout: a slot of the wrong size, outside
its bucket (an offset near 2**63 included: the C++ sum overflowed), overlapping another, or a conjugate view (whose
bytes are not its values). Calls that crashed the process run in a child process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from libra.elastic.pack import Layout, checksum, pack, pack_checksummed, plan_layout, sub_layout, unpack  # noqa: E402
from tests.limits import scaled  # noqa: E402

BACKENDS = ("python", "native", "auto")
DTYPES = (torch.uint8, torch.int16, torch.float32, torch.float64, torch.bool, torch.complex64)


@st.composite
def tensors_and_layouts(draw):
    tensors = []
    for _ in range(draw(st.integers(0, 7))):
        dtype = draw(st.sampled_from(DTYPES))
        shape = draw(st.lists(st.integers(0, 5), max_size=2))
        t = (torch.arange(max(1, int(torch.tensor(shape).prod())), dtype=torch.float64) * 37 % 251)[
            : int(torch.tensor(shape).prod())
        ]
        t = t.reshape(shape).to(dtype)
        if t.dim() == 2 and draw(st.booleans()):
            t = t.t()  # strided
        tensors.append(t)
    nbytes = [t.numel() * t.element_size() for t in tensors]
    layout = plan_layout(nbytes, bucket_bytes=draw(st.integers(1, 200)), align=draw(st.integers(1, 70)))
    return tensors, layout


def _bytes(buckets: list) -> list[bytes]:
    return [bytes(b.numpy()) for b in buckets]


@settings(max_examples=60, deadline=None)
@given(case=tensors_and_layouts())
def test_every_backend_writes_and_reads_the_same_bytes(ext, case) -> None:
    tensors, layout = case
    packed = {be: pack_checksummed(tensors, layout, backend=be) for be in BACKENDS}
    reference, sums = packed["python"]
    for buckets, crcs in packed.values():
        assert _bytes(buckets) == _bytes(reference) and crcs == sums
    assert sums == [checksum(b) for b in reference]
    for be in BACKENDS:
        outs = [torch.zeros(t.shape, dtype=t.dtype) for t in tensors]
        unpack(reference, outs, layout, backend=be)
        assert all(torch.equal(a.contiguous(), b) for a, b in zip(tensors, outs, strict=True))


@settings(max_examples=40, deadline=None)
@given(case=tensors_and_layouts(), data=st.data())
def test_slots_listed_out_of_offset_order_are_hashed_front_to_back(ext, case, data) -> None:
    """A sub-layout lists slots in the order it is given (snapshot.py takes the CPU ones): the fast path hashed
    each bucket in that order, so its checksum was not the bucket's."""
    tensors, layout = case
    order = data.draw(st.permutations(range(len(tensors))))
    shuffled = sub_layout(layout, order)
    chosen = [tensors[i] for i in order]
    reference = pack(chosen, shuffled, backend="python")
    for be in BACKENDS:
        buckets, crcs = pack_checksummed(chosen, shuffled, backend=be)
        assert _bytes(buckets) == _bytes(reference)
        assert crcs == [checksum(b) for b in buckets]


def test_a_slot_listed_before_one_at_a_lower_offset_is_hashed_in_place() -> None:
    layout = Layout(bucket_sizes=(72,), slot_bucket=(0, 0), slot_offset=(64, 0), slot_nbytes=(4, 4))
    buckets, crcs = pack_checksummed([torch.ones(1), torch.full((1,), 2.0)], layout, backend="auto")
    assert crcs == [checksum(buckets[0])]


def _bad_layouts() -> list:
    one = [torch.ones(1)]
    return [
        ("has 4 bytes; its slot in the layout has 8", one, Layout(bucket_sizes=(8,), slot_bucket=(0,),
                                                                   slot_offset=(0,), slot_nbytes=(8,))),
        ("outside the buckets", one, Layout(bucket_sizes=(8,), slot_bucket=(0,), slot_offset=(6,), slot_nbytes=(4,))),
        ("outside the buckets", one, Layout(bucket_sizes=(8,), slot_bucket=(0,), slot_offset=(-4,), slot_nbytes=(4,))),
        ("outside the buckets", one, Layout(bucket_sizes=(8,), slot_bucket=(1,), slot_offset=(0,), slot_nbytes=(4,))),
        ("outside the buckets", one, Layout(bucket_sizes=(8,), slot_bucket=(0,), slot_offset=(2**63 - 2,),
                                            slot_nbytes=(4,))),
        ("overlaps slot 0", [torch.ones(1), torch.ones(1)], Layout(bucket_sizes=(8,), slot_bucket=(0, 0),
                                                                    slot_offset=(0, 2), slot_nbytes=(4, 4))),
    ]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("message", "tensors", "layout"), _bad_layouts())
def test_every_backend_refuses_what_is_not_a_layout_in_one_line(ext, backend, message, tensors, layout) -> None:
    with pytest.raises(ValueError, match=message) as info:
        pack_checksummed(tensors, layout, backend=backend)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpack_refuses_a_slot_outside_its_bucket_and_a_bucket_that_is_not_bytes(ext, backend) -> None:
    layout = Layout(bucket_sizes=(8,), slot_bucket=(0,), slot_offset=(-4,), slot_nbytes=(4,))
    with pytest.raises(ValueError, match="outside the buckets"):
        unpack([torch.zeros(8, dtype=torch.uint8)], [torch.ones(1)], layout, backend=backend)
    layout = Layout(bucket_sizes=(8,), slot_bucket=(0,), slot_offset=(0,), slot_nbytes=(4,))
    with pytest.raises(ValueError, match="want contiguous uint8 on cpu"):
        unpack([torch.zeros(2)], [torch.ones(1)], layout, backend=backend)


def test_empty_slots_are_skipped_by_the_extension_as_by_the_reference(ext) -> None:
    """An empty tensor's slot writes nothing, and its bucket id is not looked up (the reference skips it)."""
    (bucket,) = ext.pack([torch.zeros(0), torch.ones(1)], [4], [7, 0], [0, 0])
    assert bytes(bucket.numpy()) == bytes(torch.ones(1).view(torch.uint8).numpy())
    ext.unpack([bucket], [torch.zeros(0)], [7], [0])


def _in_child(code: str) -> subprocess.CompletedProcess:
    prelude = "import torch\nfrom libra.elastic import native\next = native.load()\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )


@pytest.mark.parametrize(
    "call",
    [
        "ext.pack([torch.ones(1)], [8], [0], [2**63 - 2])",  # (off + n wrapped round: a write far outside)
        "ext.unpack([torch.zeros(8, dtype=torch.uint8)], [torch.ones(1)], [0], [-4])",  # (a read before the bucket)
        "ext.unpack([torch.zeros(8, dtype=torch.uint8)], [torch.ones(1)], [0], [2**63 - 2])",
        "ext.pack([torch.ones(2), torch.ones(2)], [16], [0, 0], [0, 4])",  # (two copies racing over 4 bytes)
        "ext.pack([torch.ones(1, dtype=torch.complex64).conj()], [8], [0], [0])",  # (bytes are not the values)
        "ext.unpack([torch.zeros(8, dtype=torch.uint8)], [torch._neg_view(torch.ones(2))], [0], [0])",
    ],
)
def test_the_extension_refuses_a_bad_slot_with_an_error_not_a_crash(ext, call) -> None:
    proc = _in_child(
        f"""
        try:
            {call}
        except RuntimeError as exc:
            print("refused:", str(exc).splitlines()[0])
        else:
            print("accepted")
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout, proc.stdout
