"""What the step policy learned in one generate() call, carried into the next call of the same drafter, target
and settings (in this process; the costs it plans with are kept on disk by `measured`).

A call that started from the policy's fixed priors (kappa = 1, rho = 1/2, no depth profile, no drafter timings)
under-predicted what it would accept wherever acceptance is far from those priors, above all at depths a short call
rarely reaches (long copy chains). Each call now starts from where the last one ended: its calibration as a prior
bounded to `policy.CARRY_WEIGHT` tested nodes per depth (so a new sequence moves it within a few steps), its depth
profile and timings as they were. Verification never trusts any of it: output is exact whatever the policy learned.

    python -m pytest tests/test_policy.py -q -k carried
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Hashable

import torch

from .policy import StepPolicy, VerifyCosts

# drafter -> target -> {call key: the policy its last call ended with}
_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def start_policy(drafter: torch.nn.Module, target: torch.nn.Module, key: Hashable, costs: VerifyCosts,
                 max_depth: int) -> StepPolicy:
    """The policy a call starts with: the last call's, carried (`StepPolicy.carried`) with this call's costs and
    depth, or a fresh one."""
    previous = _LEARNED.get(drafter, {}).get(target, {}).get(key)
    if previous is None:
        return StepPolicy(costs, max_depth)
    return dataclasses.replace(previous.carried(), costs=costs, max_depth=max_depth)


def keep_policy(drafter: torch.nn.Module, target: torch.nn.Module, key: Hashable, policy: StepPolicy) -> None:
    """Remember the policy a call ended with (for `start_policy` of the next call with the same key)."""
    by_target = _LEARNED.setdefault(drafter, weakref.WeakKeyDictionary())
    by_target.setdefault(target, {})[key] = policy


def forget_policies(drafter: torch.nn.Module | None = None) -> None:
    """Drop what calls of `drafter` (None: of every drafter) learned: the next call starts from the priors."""
    if drafter is None:
        _LEARNED.clear()
    else:
        _LEARNED.pop(drafter, None)
