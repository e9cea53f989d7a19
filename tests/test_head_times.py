"""The LM head's seconds over r rows (`head_times.HeadTimes`) and what a batch's verification does with them: rows
padded to the cheapest grid count, every node's logits computed where that costs no more than the walk rows (no row
then made on demand), the walk rows otherwise; exact either way; timings kept on disk.

    python -m pytest tests/test_head_times.py -q
"""

from __future__ import annotations

import pytest
import torch
from helpers import prompt

from hf_dynaspec.generation.planning import calibration, measured
from hf_dynaspec.generation.verification import verifier, verify
from hf_dynaspec.generation.verification.head_times import ROW_GRID, HeadTimes, grid_rows, pad_rows
from hf_dynaspec.generation.verification.walk_head import WalkHead

pytestmark = pytest.mark.usefixtures("one_thread")


def fake_times(target, seconds: dict[int, float]) -> HeadTimes:
    """A HeadTimes whose grid counts are `seconds` (any other count fails the test if asked)."""
    times = HeadTimes(WalkHead.of(target, 3), key="unused", device=target.device, seconds=dict(seconds))
    times._time = lambda size: pytest.fail(f"{size} rows were timed")
    return times


def test_grid_and_padding(target):
    assert [grid_rows(r) for r in (1, 5, 13, 33, 600)] == [1, 6, 16, 48, 600]
    assert list(ROW_GRID) == sorted(ROW_GRID)
    times = fake_times(target, {3: 3.5, 4: 3.0, 6: 3.0, 8: 2.0, 12: 1.0, 16: 1.5, 24: 0.4, 32: 0.3, 48: 0.2})
    assert times.padded(3) == 12  # the cheapest of 3 .. 16 (a few rows: up to 16)
    assert times.padded(12) == 24 and times(12) == 0.4  # the cheapest of 12 .. 24 (at most twice the rows)
    assert times.padded(24) == 48
    assert times(0) == 0.0
    head = WalkHead.of(target, 3)
    hidden = torch.randn(5, target.config.hidden_size)
    padded = pad_rows(hidden, 8)
    assert padded.shape == (8, hidden.shape[1]) and torch.equal(padded[:5], hidden) and not padded[5:].any()
    with torch.no_grad():
        torch.testing.assert_close(head.apply(padded)[:5], head.apply(hidden), rtol=1e-5, atol=1e-5)


def batch(lengths):
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = prompt(length, seed=11 + row)[0]
        mask[row, width - length :] = 1
    return ids, mask


@pytest.mark.parametrize("every_node", [True, False])
def test_a_batch_reads_every_node_where_that_costs_no_more(target, drafter, monkeypatch, every_node):
    """Rows head times: flat (every node costs what the walks cost) -> every node's logits in the pass, none made
    on demand; steep -> the walk rows, the rest on demand. Greedy output equals plain batched greedy both ways."""
    steep = {size: float(size) for size in ROW_GRID}
    flat = {size: 1.0 for size in ROW_GRID}
    times = fake_times(target, flat if every_node else steep)
    monkeypatch.setattr(calibration, "head_times", lambda target, walk_head: times)
    monkeypatch.setattr(calibration, "measure_walk_head",
                        lambda target, layouts, batch: WalkHead.of(target, 2, "rows"))
    import hf_dynaspec.generation.loop.decoding as decoding

    monkeypatch.setattr(decoding, "head_times", calibration.head_times)
    made, rows_now = [], [0]  # rows made on demand while a batch of several rows verified
    original_verify, original_filled = verifier.Verifier.verify, verify.NodeLogits.filled

    def verify_spy(self, trees, sequences):
        rows_now[0] = len(trees)
        return original_verify(self, trees, sequences)

    def filled_spy(self, nodes, made_rows):
        if rows_now[0] > 1:
            made.append(nodes)
        return original_filled(self, nodes, made_rows)

    monkeypatch.setattr(verifier.Verifier, "verify", verify_spy)
    monkeypatch.setattr(verify.NodeLogits, "filled", filled_spy)
    ids, mask = batch([7, 4, 10])
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    out = target.generate(ids, assistant_model=drafter, step_policy="off", tree_policy="eagle2", draft_depth=4,
                          num_draft_nodes=8, **kwargs)
    assert torch.equal(out, target.generate(ids, **kwargs))
    assert (made == []) == every_node


def test_head_times_are_kept_on_disk(target, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DYNASPEC_CACHE", str(tmp_path))
    monkeypatch.setenv(measured.ENV, "disk")
    head = WalkHead.of(target, 3)
    first = HeadTimes.of(target, head)
    assert first.seconds == {}
    seconds = first(5)  # times the grid from 5 to 16 rows, pads to the cheapest
    assert set(first.seconds) == {6, 8, 12, 16} and seconds == min(first.seconds.values()) > 0
    again = HeadTimes.of(target, head)  # the next process
    again._time = lambda size: pytest.fail("timed again although stored")
    assert again.seconds == first.seconds and again(5) == seconds
    with pytest.raises(ValueError, match="greedy picks"):
        HeadTimes.of(target, WalkHead.of(target, 3, "prefilter"))
