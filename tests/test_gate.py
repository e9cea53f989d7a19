"""The draft gate: drafting pauses (exponential back-off) while drafted steps emit tokens more slowly than plain
steps, and output stays identical to plain greedy either way."""

from __future__ import annotations

import torch
from helpers import greedy, prompt, tiny_drafter

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation import decoding
from hf_dynaspec.generation.candidates import DynaSpecCandidateGenerator
from hf_dynaspec.generation.gate import MAX_BACKOFF, DraftGate


def test_gate_measures_plain_once_then_backs_off_while_drafting_is_slower():
    gate = DraftGate(remeasure=100)
    assert gate.draft_next()  # nothing known: draft
    gate.record(True, 3.0, 1)
    assert not gate.draft_next()  # one plain step to learn its cost
    gate.record(False, 1.0, 1)
    assert gate.draft_next()  # the first drafted step after plain ones is a fresh trial
    waits = []
    for _ in range(6):  # drafting keeps losing: plain for 1, 2, 4, ... steps, capped
        assert gate.draft_next()
        gate.record(True, 3.0, 1)
        waits.append(gate.wait)
        while not gate.draft_next():
            gate.record(False, 1.0, 1)
    assert waits == [1, 2, 4, 8, 16, 16] and MAX_BACKOFF == 16
    gate.record(True, 0.5, 1)  # drafting pays again: no wait, back-off reset
    assert gate.draft_next() and gate.backoff == 1


def test_gate_refreshes_the_plain_cost_every_remeasure_drafted_steps():
    gate = DraftGate(remeasure=3)
    gate.record(True, 1.0, 4)
    gate.record(False, 1.0, 1)
    decisions = []
    for _ in range(8):
        drafted = gate.draft_next()
        decisions.append(drafted)
        gate.record(drafted, 1.0, 4 if drafted else 1)
    assert decisions == [True, True, True, False, True, True, True, False]


class FakeClock:
    """`time` for decoding.py: every reading advances one unit; drafting costs `draft_cost` more."""

    def __init__(self, draft_cost: float) -> None:
        self.now, self.draft_cost = 0.0, draft_cost

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_slow_drafting_is_gated_and_output_stays_exact(target, monkeypatch):
    drafter = tiny_drafter(target)  # untrained: few drafts accepted
    clock = FakeClock(draft_cost=5.0)
    original_draft = DynaSpecCandidateGenerator.draft

    def slow_draft(self, *args, **kwargs):
        clock.now += clock.draft_cost
        return original_draft(self, *args, **kwargs)

    monkeypatch.setattr(decoding, "time", clock)
    monkeypatch.setattr(DynaSpecCandidateGenerator, "draft", slow_draft)
    ids = prompt(8)
    config = DynaSpecGenerationConfig(draft_gate=True, lookup_num_tokens=0, max_new_tokens=40, do_sample=False,
                                      return_dict_in_generate=True)
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, greedy(target, ids, max_new_tokens=40))
    stats = out.speculative_stats
    assert stats.gated_steps > stats.steps // 2  # mostly plain: drafting costs 6 units per ~1-2 tokens
    ungated = target.generate(ids, generation_config=DynaSpecGenerationConfig(
        lookup_num_tokens=0, max_new_tokens=40, do_sample=False, return_dict_in_generate=True), assistant_model=drafter)
    assert ungated.speculative_stats.gated_steps == 0
