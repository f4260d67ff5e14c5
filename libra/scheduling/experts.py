"""Which evidence C-MLFQ admits on, chosen online from how each would have done on the finished requests.

Admission carries no tokens, so the admission bucket is free to choose; what matters is which evidence predicts a
request's final bucket on this workload. `AdmitExperts` keeps, for each of a few admission guesses ("experts"),
how often it named the bucket the finished requests of the last steps ended in, and admits on the best of them
at the next step (the first among equals, so the tree's own guess wins ties). The experts, in order:

- `tree`: the priced rule's admission (the prompt's root shares, shrunk toward the population's; the population's
  for an unseen prompt);
- `prompt`: the `predictor` baseline's guess: the most common final bucket of the prompt's own earlier runs
  (unshrunk), for an unseen prompt that of the finished requests whose prompt length fell in the same decile
  (`PromptLengthBins`), else the population's. It wins where a prompt's runs agree and the shrinkage, fitted on
  tool-return records deep in the tree, distrusts a prompt root that is in fact reliable, and where the prompt's
  length tells the final length (short agents whose prompt is a large part of the context);
- `population`: the most common final bucket of all trajectories (the `most_common` baseline's): it wins where
  lengths are concentrated and a prompt's few runs mislead;
- `recent` (optional, `recent=K`; the default router's `recent_expert=1`): the most common final bucket of the last
  K steps' requests, admitted on only past a paired test against the best of the other three (`AdmitExperts`): it
  follows lengths that drift over the run, where the others lag.

All of them guess where a request will end. Admitting into bucket 0 (the published rule's admission, which leaves
the rest to later moves) is not among them: scored by admission accuracy alone it looks good wherever short
requests are common, but its wrong guesses are repaired by moves that carry context (tried: on tau2 it took the
default from 6.5 % to 14.1 % migrated tokens).

Each expert's score is its count of right guesses, the older steps the lighter (weight 1/2 per step, as the
budget and the shrinkage weigh their records), so the choice follows a drifting workload. Every request's guesses
are scored whichever expert admitted it: the counterfactual accuracy of an admission guess does not depend on
what the router did afterwards. Nothing in it is fitted to one workload.
"""

from __future__ import annotations

import numpy as np

EXPERTS = ("tree", "prompt", "population")
RECENT = len(EXPERTS)  # the index of the optional fourth expert, `recent` (AdmitExperts)


class AdmitExperts:
    """Scores of the admission experts (module docstring) and the choice of the one to admit on.

    `recent` K > 0 adds a fourth expert, `recent`: the most common final bucket of the requests
    finished in the last K steps (1/2 per step, as the scores), the population's guess with a short memory. It
    follows lengths that drift over the run (the population's and the tree's windows lag by a few steps), and in a
    stationary run it is a noisier copy of the population's guess. So it is admitted on only when it beats the best
    of the other three by more than chance: among the finished requests (weighted as the scores) where exactly one of
    the two named the final bucket, its wins exceed its losses by more than one standard deviation of a fair coin's
    difference (sqrt(wins + losses)). K and that threshold are conventions, not tuned (docs/routing-log.md)."""

    def __init__(self, *, decay: float = 0.5, recent: int = 0) -> None:
        self.decay = float(decay)
        n = len(EXPERTS) + (1 if recent else 0)
        self.scores = [0.0] * n
        self._hits = [0] * n
        self.chosen = 0  # index into EXPERTS (RECENT for `recent`); the tree until something is scored
        self.lengths = PromptLengthBins()
        self.recent = int(recent)
        self._truths: list[int] = []  # this step's final buckets
        self._last: list[list[int]] = []  # those of the last `recent` steps
        self.recent_guess: int | None = None  # None until a step has finished a request
        # per other expert: (recent right and it wrong, it right and recent wrong), this step's and weighted
        self._pairs = [[0.0, 0.0] for _ in EXPERTS]
        self._pairs_step = [[0, 0] for _ in EXPERTS]

    def finish(self, guesses: tuple[int, ...], truth: int, prompt_tokens: int | None = None) -> None:
        """A finished request's admission guesses (one per expert), the bucket its final length belongs to and (for
        the prompt-length bins) its prompt length."""
        if prompt_tokens is not None:
            self.lengths.observe(prompt_tokens, truth)
        hits = self._hits
        for i, g in enumerate(guesses):
            if g == truth:
                hits[i] += 1
        if self.recent:
            self._truths.append(truth)
            if len(guesses) > RECENT:
                r_ok = guesses[RECENT] == truth
                for i in range(RECENT):
                    if r_ok != (guesses[i] == truth):
                        self._pairs_step[i][0 if r_ok else 1] += 1

    def end_step(self) -> int:
        """Fold this step's hits into the scores and return the expert to admit on next (the best score, the
        first among equals; `recent` only past the paired test of the class docstring)."""
        self.lengths.end_step()
        d = self.decay
        self.scores = [d * s + h for s, h in zip(self.scores, self._hits)]
        self._hits = [0] * len(self.scores)
        self.chosen = self.scores.index(max(self.scores))
        if self.recent:
            self._end_recent(d)
        return self.chosen

    def _end_recent(self, d: float) -> None:
        """The paired test of `recent` against the best other expert, and its next guess."""
        self._pairs = [[d * w + s for w, s in zip(p, q)] for p, q in zip(self._pairs, self._pairs_step)]
        self._pairs_step = [[0, 0] for _ in EXPERTS]
        if self.chosen == RECENT:
            other = self.scores.index(max(self.scores[:RECENT]))
            won, lost = self._pairs[other]
            if won - lost <= (won + lost) ** 0.5:
                self.chosen = other
        if self._truths:
            self._last = [*self._last, self._truths][-self.recent :]
            self._truths = []
            self.recent_guess = _most_common(self._last, d)

    def __setstate__(self, state: dict) -> None:
        """A router pickled before `recent` existed unpickles without it (recent=0)."""
        self.__dict__.update({**AdmitExperts().__dict__, **state})


def _most_common(steps: list[list[int]], decay: float) -> int:
    """The most common bucket of `steps` (oldest first), the newest step weighing 1 in all and each older one
    `decay` times the one after it; the smallest among equals."""
    weights: dict[int, float] = {}
    m = len(steps)
    for age, truths in enumerate(steps):
        w = decay ** (m - 1 - age) / len(truths)
        for t in truths:
            weights[t] = weights.get(t, 0.0) + w
    return min(weights, key=lambda b: (-weights[b], b))


class PromptLengthBins:
    """The most common final bucket per decile of prompt length, over the last `window` finished requests (the
    `predictor` baseline's evidence for a prompt never seen). Bins move at step ends only.

    The window is kept as two arrays (prompt lengths, buckets), and a step end counts the (bin, bucket) pairs in one
    `bincount`: its cost is a few passes of numpy over the window, not a Python loop over it (a run of one-request
    steps ends a step per request)."""

    def __init__(self, *, bins: int = 10, window: int = 20_000) -> None:
        self.bins = bins
        self.window = window
        self._lengths = np.zeros(0)  # the window's prompt lengths, oldest first
        self._buckets = np.zeros(0, np.int64)  # and their final buckets
        self._new: list[tuple[int, int]] = []  # this step's, not yet in the arrays
        self._edges = np.zeros(0)
        self._majority: list[int] = []

    def observe(self, prompt_tokens: int, bucket: int) -> None:
        self._new.append((prompt_tokens, bucket))

    def end_step(self) -> None:
        if self._new:
            new = np.array(self._new, np.int64).reshape(-1, 2)
            keep = max(0, len(self._lengths) + len(new) - self.window)  # (the oldest beyond the window drop out)
            self._lengths = np.concatenate([self._lengths, new[:, 0].astype(float)])[keep:]
            self._buckets = np.concatenate([self._buckets, new[:, 1]])[keep:]
            self._new = []
        if not len(self._lengths):
            return
        self._edges = np.unique(np.quantile(self._lengths, np.linspace(0, 1, self.bins + 1)[1:-1]))
        self._majority = _bin_majorities(self._edges, self._lengths, self._buckets)

    def guess(self, prompt_tokens: int) -> int | None:
        """The most common final bucket of the prompt's length decile; None before any step ended."""
        if not self._majority:
            return None
        return self._majority[int(np.searchsorted(self._edges, prompt_tokens, side="right"))]

    def __setstate__(self, state: dict) -> None:
        """A router pickled when the window was a deque of (length, bucket) pairs (`_seen`) unpickles into the
        arrays."""
        seen = state.pop("_seen", None)
        self.__dict__.update(state)
        if seen is not None:
            self.window = seen.maxlen
            pairs = np.array(list(seen), np.int64).reshape(-1, 2)
            self._lengths, self._buckets, self._new = pairs[:, 0].astype(float), pairs[:, 1], []


def _bin_majorities(edges: np.ndarray, lengths: np.ndarray, buckets: np.ndarray) -> list[int]:
    """The most common bucket of each bin that `edges` cut `lengths` into, the smallest among equals; an empty bin
    takes that of all (as the predictor baseline). Buckets are indices (>= 0)."""
    width = int(buckets.max()) + 1
    bins = np.searchsorted(edges, lengths, side="right")
    counts = np.bincount(bins * width + buckets, minlength=(len(edges) + 1) * width).reshape(-1, width)
    every = int(np.argmax(counts.sum(axis=0)))  # (argmax: the first, i.e. the smallest, of the most common)
    return [int(np.argmax(c)) if c.any() else every for c in counts]
