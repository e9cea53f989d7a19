"""Host synchronisations per decoding step are bounded by the draft depth and the tokens emitted, never by the
number of tree nodes (on CUDA each one waits for the GPU; counted on CPU by `HostSyncCounter`)."""

from __future__ import annotations

import pytest
import torch
from helpers import greedy, prompt, tiny_drafter

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.loop import decoding, syncs
from hf_dynaspec.generation.loop.syncs import HostSyncCounter, wall_seconds
from hf_dynaspec.generation_config import split_implementation


def test_counter_sees_every_kind_of_host_read():
    t = torch.arange(6)
    with HostSyncCounter() as counter:
        int(t[1]), bool(t[2] > 1), float(t[3]), t.tolist(), t[0].item(), t.nonzero(), [0, 1, 2][t[1]]
    assert counter.total == 7
    assert set(counter.counts) == {"__int__", "__bool__", "__float__", "tolist", "item", "nonzero", "__index__"}


def test_wall_seconds_times_each_run_and_leaves_the_untimed_part_out(monkeypatch):
    clock, events = [0.0], []
    monkeypatch.setattr(syncs.time, "perf_counter", lambda: clock[0])

    def run(seconds: float, name: str) -> None:
        clock[0] += seconds
        events.append(name)

    times = wall_seconds(lambda: run(1.5, "run"), 3, torch.device("cpu"), after=lambda: run(10.0, "after"))
    assert events == ["run", "after"] * 3
    assert times == [1.5, 1.5, 1.5]  # `after` (10 s each) is not counted


@pytest.mark.parametrize("head_mode", ["dynamic", "union", "full"])
@pytest.mark.parametrize(("nodes", "depth"), [(8, 3), (64, 6)])
def test_syncs_per_step_do_not_grow_with_the_tree(target, monkeypatch, head_mode, nodes, depth):
    drafter = tiny_drafter(target)
    steps: list[tuple[int, int]] = []  # (host reads, tokens emitted) per step
    original = decoding.speculative_step

    def counted(target_, batch):
        run = batch.rows[0]
        before = run.input_ids.shape[1]
        with HostSyncCounter() as counter:
            original(target_, batch)
        steps.append((counter.total, run.input_ids.shape[1] - before))

    monkeypatch.setattr(decoding, "speculative_step", counted)
    ids = prompt(8)
    config = DynaSpecGenerationConfig(num_draft_nodes=nodes, draft_depth=depth, draft_top_k=4, head_mode=head_mode,
                                      lookup_num_tokens=3, max_new_tokens=30, do_sample=False)
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out, greedy(target, ids, max_new_tokens=30))
    assert len(steps) > 3
    for reads, emitted in steps:
        # per expansion (<= depth, the root's included): the head's cluster union and the proposals; per
        # emitted token: the stopping criteria and the walk's pick; per step: the committed ids, the recall
        assert reads <= 2 * (depth + 1) + 2 * emitted + 2, steps


def counted_run(target, drafter, **settings):
    settings = split_implementation({"count_host_reads": True, **settings})
    config = DynaSpecGenerationConfig(max_new_tokens=30, do_sample=False, return_dict_in_generate=True, **settings)
    return target.generate(prompt(8), generation_config=config, assistant_model=drafter)


def test_stats_count_host_reads_per_step_ours_and_the_targets_apart(target, monkeypatch):
    drafter = tiny_drafter(target)
    per_step: list[int] = []
    original = decoding.speculative_step

    def counted(*args):
        with HostSyncCounter() as counter:
            original(*args)
        per_step.append(counter.total)

    monkeypatch.setattr(decoding, "speculative_step", counted)
    calls = {"n": 0}
    forward = type(target).forward

    def reading_forward(self, *args, **kwargs):  # a target whose forward reads one value itself
        calls["n"] += 1
        int(torch.tensor(1))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(target), "forward", reading_forward)
    out = counted_run(target, drafter)
    stats = out.speculative_stats
    assert stats.target_host_reads == stats.steps  # one per verification forward, prefill not counted
    assert stats.host_reads + stats.target_host_reads == sum(per_step)
    assert stats.summary()["host_reads_per_step"] == stats.host_reads / stats.steps


def test_lanes_read_fewer_values_than_the_union(target):
    drafter = tiny_drafter(target)
    union = counted_run(target, drafter, shortlist_layout="union").speculative_stats
    lanes = counted_run(target, drafter, shortlist_layout="lanes").speculative_stats
    assert lanes.steps == union.steps  # the same drafts, the same steps
    assert lanes.host_reads_per_step < union.host_reads_per_step
    assert counted_run(target, drafter, count_host_reads=False).speculative_stats.host_reads == 0


@pytest.mark.parametrize("head_mode", ["dynamic", "union", "context", "full"])
def test_device_drafting_reads_at_most_three_values_per_step(target, monkeypatch, head_mode):
    """As a GPU decodes (every node's logits at once, no CPU walk head): the tree read once, the walk's path once,
    the stopping criteria once; nothing inside a draft call but the tree's one read."""
    monkeypatch.setattr(decoding, "walk_head_for", lambda *args: (None, None))
    monkeypatch.setattr(decoding, "step_arm", lambda *args: "policy")  # as on a GPU: no A/B arms (step_arms)
    drafter = tiny_drafter(target)
    draft_reads: list[int] = []
    original = decoding.DynaSpecCandidateGenerator._draft_fixed

    def counted(self, *args):
        with HostSyncCounter() as counter:
            tree = original(self, *args)
        draft_reads.append(counter.total)
        return tree

    monkeypatch.setattr(decoding.DynaSpecCandidateGenerator, "_draft_fixed", counted)
    out = counted_run(target, drafter, tree_growth="device", shortlist_layout="lanes", head_mode=head_mode,
                      lookup_num_tokens=3, num_draft_nodes=16, draft_depth=4)
    stats = out.speculative_stats
    assert torch.equal(out.sequences, greedy(target, prompt(8), max_new_tokens=30))
    assert draft_reads and set(draft_reads) <= {0, 1} and 1 in draft_reads  # the tree, read once when grown
    assert stats.host_reads <= 3 * stats.steps, (stats.host_reads, stats.steps)
