"""Bounded regret for the step policy: inside a call, the policy's steps against the whole configured tree's
(what `step_policy="off"` verifies every step), compared on the tokens per second they realise.

The step policy plans from a model (acceptance calibrated on the sequence, verification costs measured once and
corrected by the call's steps). Where the model is off (a drafter stronger than its calibration says, a cost
measured under a burst of load) it may keep choosing plain steps, and a plain step tests no draft, so nothing
corrects it. So the steps are also an A/B test without a model: `StepArms.next_arm` gives each step to "policy"
(the policy plans it) or "tree" (the whole configured tree, untrimmed), the other arm than the better one every
`EXPLORE_EVERY` steps until it has `MIN_STEPS` timed steps and every `RECHECK_EVERY` steps after, and `record`
keeps each arm's realised tokens and seconds (exponentially forgotten: `DECAY` per step of that arm). Both arms
are sampled at fixed intervals, not where one of them looks good, so their rates compare like with like. A call
thus runs at least about as fast as the better of the two, paying for the other on at most one step in
`RECHECK_EVERY` once both are known. A tree step still teaches the policy what its drafts are worth (its nodes
are tested: `policy.Calibration.update`). Output is exact whichever arm verifies a step. The arms run on CPU targets
(`decoding.step_arm`).

    python -m pytest tests/test_step_arms.py -q
"""

from __future__ import annotations

from dataclasses import dataclass, field

ARMS = ("policy", "tree")
EXPLORE_EVERY = 4  # steps between turns of the arm that is not chosen, while it has fewer than MIN_STEPS
MIN_STEPS = 6  # timed steps of an arm before its rate is compared
RECHECK_EVERY = 32  # steps between turns of the arm not chosen, once both are known
DECAY = 0.98  # weight of an arm's earlier tokens and seconds at each of its steps


@dataclass
class Arm:
    """One arm's realised tokens and seconds (decayed sums) and its steps."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0
    last: int = 0  # `StepArms.step` at its last step

    def rate(self) -> float | None:
        """Tokens per second (None before `MIN_STEPS` steps)."""
        return self.tokens / self.seconds if self.steps >= MIN_STEPS and self.seconds > 0 else None


@dataclass
class StepArms:
    """The arms of one drafter and target (carried across calls with the policy's timings)."""

    arms: dict[str, Arm] = field(default_factory=lambda: {name: Arm() for name in ARMS})
    step: int = 0

    def best(self) -> str:
        """The arm with the higher realised rate ("policy" until both are known)."""
        rates = {name: arm.rate() for name, arm in self.arms.items()}
        if None in rates.values():
            return "policy"
        return max(ARMS, key=lambda name: rates[name])

    def next_arm(self) -> str:
        """The arm of the next step: the one not chosen when its turn is due (module docstring), else the best."""
        self.step += 1
        best = self.best()
        other = next(name for name in ARMS if name != best)
        gap = EXPLORE_EVERY if self.arms[other].steps < MIN_STEPS else RECHECK_EVERY
        return other if self.step - self.arms[other].last >= gap else best

    def record(self, arm: str, tokens: int, seconds: float) -> None:
        """A step of `arm` emitted `tokens` (every row's) in `seconds` (the whole step, planning to commit)."""
        kept = self.arms[arm]
        kept.tokens = DECAY * kept.tokens + tokens
        kept.seconds = DECAY * kept.seconds + seconds
        kept.steps += 1
        kept.last = self.step
