"""Measurements for `libra profile`: a live vLLM engine in process, an OpenAI-compatible endpoint, the torch trainer.

Each function returns the points `libra.planning.cost.profile_fit` fits (decode steps over a batch x context grid,
prefills, a burst of requests for the per-request overhead, training steps over sequence length x micro-batch).
Engines are imported lazily; the endpoint client uses only the standard library. Prompts are random token ids, so
the prefix cache never shortens a measured prefill.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

import attrs
import numpy as np

from libra.planning.cost.profile_fit import DecodeStep, Prefill, RequestBurst, TrainStep

Progress = Callable[[str], None]


class ProfileError(Exception):
    """A measurement could not be taken (bad endpoint, unreachable server, engine error): one line for the user."""


@attrs.frozen(kw_only=True)
class Grid:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    contexts: tuple[int, ...] = (64, 256, 640)
    decode_tokens: int = 24
    prefill_tokens: tuple[int, ...] = (32, 128, 256, 512, 768, 900)
    burst_requests: int = 16
    train_lens: tuple[int, ...] = (32, 64, 128, 256)
    train_micro_batches: tuple[int, ...] = (1, 2, 4)
    repeats: int = 3

    @classmethod
    def quick(cls) -> Grid:
        return cls(
            batches=(1, 4, 16),
            contexts=(64, 384),
            decode_tokens=12,
            prefill_tokens=(32, 256, 512, 768),
            burst_requests=8,
            train_lens=(32, 64, 128),
            train_micro_batches=(1, 4),
            repeats=2,
        )

    def decode_points(self) -> list[tuple[int, int]]:
        return [(b, c) for c in self.contexts for b in self.batches]

    def size(self, *, train: bool) -> int:
        n = len(self.decode_points()) + len(self.prefill_tokens) + 1
        return n + (len(self.train_lens) * len(self.train_micro_batches) if train else 0)


def _noop(_: str) -> None:
    return None


# --- vLLM in process ------------------------------------------------------------------------------------------------


def measure_vllm(
    model_dir: str, grid: Grid, *, vocab_size: int, max_model_len: int = 1024, seed: int = 0, tick: Progress = _noop
) -> tuple[list[DecodeStep], list[Prefill], list[RequestBurst]]:
    """Decode steps, prefills and a request burst on one vLLM engine (TP 1) driven through `VLLMRolloutBackend`."""
    from libra.adapters.types import EventKind, InstanceSpec, Sampling
    from libra.adapters.vllm_backend import VLLMRolloutBackend

    rng = np.random.default_rng(seed)
    backend = VLLMRolloutBackend(model=model_dir, engine_tp="one", sleep_mode="pause")
    need = max([*grid.contexts, *grid.prefill_tokens]) + grid.decode_tokens + 2
    if need > max_model_len:
        raise ProfileError(f"the grid needs {need} tokens of context, the engine allows {max_model_len}")
    spec = InstanceSpec(
        name="profile", tp=1, max_num_seqs=max(max(grid.batches), grid.burst_requests), max_model_len=max_model_len
    )
    try:
        backend.start_instance(spec)
    except RuntimeError as exc:  # vLLM's own cause is in its engine's log above
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ProfileError(
            f"the vLLM engine did not start ({first}); on CPU, VLLM_CPU_KVCACHE_SPACE (GiB) sizes its KV cache"
        ) from None
    ids = iter(range(1 << 30))

    def prompt(n: int) -> list[int]:
        return [int(x) for x in rng.integers(3, vocab_size - 1, size=n)]

    def run(batch: int, context: int, max_tokens: int) -> tuple[float, float]:
        """(seconds until every request has its first token, then seconds per decode step until all finish).
        Same-length requests submitted together stay in lock-step, so the decode phase is max_tokens - 1 steps
        of the whole batch; timing the phase (not single polls) is immune to how outputs are batched per poll."""
        names = [f"p{next(ids)}" for _ in range(batch)]
        sampling = Sampling(max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        for name in names:
            backend.submit(name, "profile", prompt(context), sampling)
        started: set[str] = set()
        done: set[str] = set()
        first_at: float | None = None
        while len(done) < batch:
            for ev in backend.poll():
                if ev.kind == EventKind.FAILED:
                    raise ProfileError(f"vLLM request failed: {ev.error}")
                started.add(ev.request_id)
                if ev.kind == EventKind.FINISHED:
                    done.add(ev.request_id)
            if first_at is None and len(started) == batch:
                first_at = time.perf_counter()
        end = time.perf_counter()
        for name in names:
            backend.release(name)
        first_at = first_at or end
        return first_at - start, (end - first_at) / max(max_tokens - 1, 1)

    try:
        run(1, 16, 4)  # warm-up: first-call costs stay out of the measurements
        decode = []
        for b, c in grid.decode_points():  # the fastest of the repeats: other load on the machine only adds time
            step = min(run(b, c, grid.decode_tokens)[1] for _ in range(grid.repeats))
            decode.append(DecodeStep(batch=b, context=c + grid.decode_tokens / 2.0, time_s=step))
            tick(f"decode b={b} ctx={c}")
        prefill = []
        for n in grid.prefill_tokens:
            prefill.append(Prefill(tokens=n, time_s=min(run(1, n, 1)[0] for _ in range(grid.repeats))))
            tick(f"prefill {n}")
        times = []
        for _ in range(grid.repeats):
            t0 = time.perf_counter()
            run(grid.burst_requests, 8, 1)
            times.append(time.perf_counter() - t0)
        burst = [RequestBurst(requests=grid.burst_requests, prompt_tokens=8, time_s=min(times))]
        tick("request burst")
        return decode, prefill, burst
    finally:
        backend.shutdown()


# --- an OpenAI-compatible endpoint ------------------------------------------------------------------------------------


def check_endpoint(url: str) -> str:
    """The base URL (no trailing slash, no /v1) or a ProfileError naming what is wrong with it."""
    parts = urllib.parse.urlparse(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ProfileError(f"bad endpoint URL {url!r}: expected http(s)://host:port of an OpenAI-compatible server")
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


def _get_json(url: str, timeout: float) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the user's own server
            return json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        raise ProfileError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ProfileError(f"cannot reach {url}: {reason}") from None
    except ValueError:
        raise ProfileError(f"{url}: the answer is not JSON (is this an OpenAI-compatible server?)") from None


def served_model(base: str, timeout: float = 10.0) -> str:
    data = _get_json(f"{base}/v1/models", timeout)
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ProfileError(f"{base}/v1/models lists no model") from None


def _stream(base: str, model: str, prompt: list[int], max_tokens: int, timeout: float) -> list[float]:
    """Arrival times of the streamed chunks of one completion (the first one is the first token)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    times = [time.perf_counter()]
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's own server
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                    times.append(time.perf_counter())
    except urllib.error.HTTPError as exc:
        raise ProfileError(f"{base}/v1/completions: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ProfileError(f"cannot reach {base}: {getattr(exc, 'reason', exc)}") from None
    return times


def measure_endpoint(
    url: str,
    grid: Grid,
    *,
    vocab_size: int,
    model: str | None = None,
    timeout: float = 60.0,
    seed: int = 0,
    tick: Progress = _noop,
) -> tuple[list[DecodeStep], list[Prefill], list[RequestBurst]]:
    """Decode step = median inter-chunk time of `batch` concurrent streams; prefill = time to the first chunk of
    one request; request burst = `burst_requests` one-token requests sent at once."""
    base = check_endpoint(url)
    name = model or served_model(base, timeout)
    rng = np.random.default_rng(seed)

    def prompt(n: int) -> list[int]:
        return [int(x) for x in rng.integers(3, vocab_size - 1, size=n)]

    def concurrent(batch: int, context: int, max_tokens: int) -> list[list[float]]:
        results: list = [None] * batch
        errors: list[Exception] = []

        def one(i: int) -> None:
            try:
                results[i] = _stream(base, name, prompt(context), max_tokens, timeout)
            except ProfileError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(batch)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    _stream(base, name, prompt(8), 2, timeout)  # warm-up (and the first reachability check of completions)
    decode = []
    for b, c in grid.decode_points():
        gaps = []
        for _ in range(grid.repeats):
            for times in concurrent(b, c, grid.decode_tokens):
                gaps.extend(np.diff(times[1:]).tolist())
        if not gaps:
            raise ProfileError(f"{base} streamed no tokens (does it support stream=true and ignore_eos?)")
        if statistics.median(gaps) <= 0:  # (a measured time must be > 0: the fit's error is relative to it)
            raise ProfileError(
                f"{base} sent the tokens of most decode steps at once (median gap 0 s at batch {b}): a proxy that "
                "buffers the stream? profile the engine's own URL"
            )
        decode.append(DecodeStep(batch=b, context=c + grid.decode_tokens / 2.0, time_s=statistics.median(gaps)))
        tick(f"decode b={b} ctx={c}")
    prefill = []
    for n in grid.prefill_tokens:
        ttft = [
            times[1] - times[0] for times in (_stream(base, name, prompt(n), 1, timeout) for _ in range(grid.repeats))
        ]
        prefill.append(Prefill(tokens=n, time_s=statistics.median(ttft)))
        tick(f"prefill {n}")
    walls = []
    for _ in range(grid.repeats):
        t0 = time.perf_counter()
        concurrent(grid.burst_requests, 8, 1)
        walls.append(time.perf_counter() - t0)
    burst = [RequestBurst(requests=grid.burst_requests, prompt_tokens=8, time_s=statistics.median(walls))]
    tick("request burst")
    return decode, prefill, burst


# --- the torch trainer ------------------------------------------------------------------------------------------------


def measure_torch_trainer(model_dir: str, grid: Grid, *, seed: int = 0, tick: Progress = _noop) -> list[TrainStep]:
    """Optimizer steps of `TorchDDPTrainer` (one replica, causal-LM loss) over sequence length x micro-batch."""
    import torch
    from transformers import AutoModelForCausalLM

    from libra.adapters.torch_ddp import TorchDDPTrainer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = int(model.config.vocab_size)

    def lm_loss(m, batch):
        return m(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    trainer = TorchDDPTrainer(model=model, loss_fn=lm_loss, distributed=False)
    trainer.train_step({"input_ids": torch.randint(3, vocab, (1, 16))})  # warm-up
    out = []
    for length in grid.train_lens:
        for mb in grid.train_micro_batches:
            times = []
            for _ in range(grid.repeats):
                batch = {"input_ids": torch.randint(3, vocab, (mb, length))}
                t0 = time.perf_counter()
                trainer.train_step(batch)
                times.append(time.perf_counter() - t0)
            out.append(TrainStep(seq_len=length, micro_batch=mb, time_s=min(times)))
            tick(f"train len={length} mb={mb}")
    return out
