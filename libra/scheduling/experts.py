"""Which evidence C-MLFQ admits on, chosen online from how each would have done on the finished requests.

Admission carries no tokens, so the admission bucket is free to choose; what matters is which evidence predicts a
request's final bucket on this workload. `AdmitExperts` keeps, for each of a few admission guesses ("experts"),
how often it named the bucket the finished requests of the last steps ended in, and admits on the best of them
at the next step (the first among equals, so the tree's own guess wins ties). The experts, in order:

- `tree`: the priced rule's admission (the prompt's root shares, shrunk toward the population's; the population's
  for an unseen prompt);
- `prompt`: the most common final bucket of the prompt's own earlier runs (unshrunk; the population's for an
  unseen prompt): the `predictor` baseline's evidence. It wins where a prompt's runs agree and the fitted
  shrinkage, fitted on tool-return records deep in the tree, distrusts a prompt root that is in fact reliable;
- `population`: the most common final bucket of all trajectories (the `most_common` baseline's): it wins where
  lengths are concentrated and a prompt's few runs mislead.

All three guess where a request will end. Admitting into bucket 0 (the published rule's admission, which leaves
the rest to later moves) is not among them: scored by admission accuracy alone it looks good wherever short
requests are common, but its wrong guesses are repaired by moves that carry context (tried: on tau2 it took the
default from 6.5 % to 14.1 % migrated tokens).

Each expert's score is its count of right guesses, the older steps the lighter (weight 1/2 per step, as the
budget and the shrinkage weigh their records), so the choice follows a drifting workload. Every request's guesses
are scored whichever expert admitted it: the counterfactual accuracy of an admission guess does not depend on
what the router did afterwards. Nothing in it is fitted to one workload.
"""

from __future__ import annotations

EXPERTS = ("tree", "prompt", "population")


class AdmitExperts:
    """Scores of the admission experts (module docstring) and the choice of the one to admit on."""

    def __init__(self, *, decay: float = 0.5) -> None:
        self.decay = float(decay)
        self.scores = [0.0] * len(EXPERTS)
        self._hits = [0] * len(EXPERTS)
        self.chosen = 0  # index into EXPERTS; the tree until something is scored

    def finish(self, guesses: tuple[int, ...], truth: int) -> None:
        """A finished request's admission guesses (one per expert) and the bucket its final length belongs to."""
        hits = self._hits
        for i, g in enumerate(guesses):
            if g == truth:
                hits[i] += 1

    def end_step(self) -> int:
        """Fold this step's hits into the scores and return the expert to admit on next (the best score, the
        first among equals)."""
        d = self.decay
        self.scores = [d * s + h for s, h in zip(self.scores, self._hits)]
        self._hits = [0] * len(EXPERTS)
        self.chosen = self.scores.index(max(self.scores))
        return self.chosen
