"""Draft only where it pays: a decoding step that drafts must emit tokens at least as fast as a plain one.

A drafted step costs the drafter's work plus a target forward over the tree; a plain step, one target forward
over one token. When the drafter is weak on a text (or the machine makes wide forwards dear), drafted steps
can emit tokens more slowly than plain decoding. `DraftGate` keeps running means of the seconds per emitted
token of both kinds of step in the current generate() call, measured as they happen:

    draft next step  <=>  a plain step has been measured since the last `remeasure` drafted steps (or nothing
                          has been measured yet), and no back-off is pending
    after a drafted step (the first after plain ones replaces s_draft, later ones update it):
                           if s_draft > s_plain:  decode plainly for `backoff` steps, backoff <- 2 backoff (<= 16)
                           else:                  backoff <- 1
    every `remeasure` drafted steps, one plain step refreshes s_plain (its cost grows with the context)

A plain step verifies the root alone (the target's own token), and the drafter's cache catches up on the
skipped positions in one batched call when drafting resumes (`DynaSpecCandidateGenerator.accept(defer=)`).
Verification never trusts a draft, so output is identical whatever the gate decides.

    python -c "
    from hf_dynaspec.generation.gate import DraftGate; g = DraftGate()
    for drafted, s, n in [(True, 0.3, 1), (False, 0.1, 1), (True, 0.3, 1)]: g.record(drafted, s, n); print(g.draft_next())"
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BACKOFF = 16


@dataclass
class DraftGate:
    """Running seconds-per-token means (exponential, `decay` on the old value) of drafted and plain steps."""

    decay: float = 0.7
    remeasure: int = 32
    draft_seconds: float | None = None  # seconds per emitted token, drafted steps
    plain_seconds: float | None = None  # seconds per emitted token, plain steps
    wait: int = 0  # plain steps left before drafting is tried again
    backoff: int = 1
    since_plain: int = 0  # drafted steps since the last plain one
    plain_steps: int = 0

    def draft_next(self) -> bool:
        """Should the next step draft?"""
        if self.draft_seconds is not None and (self.plain_seconds is None or self.since_plain >= self.remeasure):
            return False  # measure (or refresh) what a plain step costs
        return self.wait == 0

    def record(self, drafted: bool, seconds: float, tokens: int) -> None:
        """A finished step: whether it drafted, its wall time and the tokens it emitted."""
        rate = seconds / max(tokens, 1)
        if not drafted:
            self.plain_steps += 1
            self.plain_seconds = self._mean(self.plain_seconds, rate)
            self.since_plain = 0
            self.wait = max(0, self.wait - 1)
            return
        # the first drafted step after plain ones is a fresh trial: it replaces the mean
        self.draft_seconds = rate if self.since_plain == 0 else self._mean(self.draft_seconds, rate)
        self.since_plain += 1
        if self.plain_seconds is not None and self.draft_seconds > self.plain_seconds:
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)
        else:
            self.backoff = 1

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new
