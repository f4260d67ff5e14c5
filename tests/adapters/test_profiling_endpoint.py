"""`measure_endpoint` on a server whose stream arrives all at once: one `ProfileError` naming the likely cause, not a
point the fit cannot use (a measured time must be > 0; the fit's error is relative to it)."""

from __future__ import annotations

import pytest

from libra.adapters import profiling
from libra.adapters.profiling import Grid, ProfileError, measure_endpoint


def test_a_stream_that_arrives_at_once_is_one_line_naming_a_buffering_proxy(monkeypatch) -> None:
    def buffered(base: str, model: str, prompt: list[int], max_tokens: int, timeout: float) -> list[float]:
        return [0.0] + [0.25] * (max_tokens + 1)  # the request sent at 0, every chunk read in one go at 0.25 s

    monkeypatch.setattr(profiling, "_stream", buffered)
    grid = Grid(batches=(1,), contexts=(8,), decode_tokens=4, prefill_tokens=(8,), burst_requests=2, repeats=1)
    with pytest.raises(ProfileError, match="median gap 0 s at batch 1.*a proxy that buffers the stream") as info:
        measure_endpoint("http://127.0.0.1:9", grid, vocab_size=100, model="m")
    assert "\n" not in str(info.value)
