"""Verification computes LM-head rows only along the walk when that is exact, and all rows otherwise."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt
from transformers import DynamicCache, Gemma2Config, Gemma2ForCausalLM

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.drafting.tree import TreePool, compact
from hf_dynaspec.generation.planning import calibration
from hf_dynaspec.generation.verification import verifier, verify
from hf_dynaspec.generation.verification.walk_head import WalkHead, choose_walk_head, walk_cost


def final_hidden_and_logits(model, ids):
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    return out.hidden_states[-1][0, -1:], out.logits[0, -1:]


def test_plain_head_reproduces_logits(target):
    assert WalkHead.of(target).reproduces(*final_hidden_and_logits(target, prompt(5)))


def tiny_gemma2(softcap: float | None = 0.5):
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=softcap)
    return Gemma2ForCausalLM(config).eval()


def test_soft_capped_logits_are_reproduced_with_the_cap():
    model = tiny_gemma2()
    assert WalkHead.of(model).reproduces(*final_hidden_and_logits(model, prompt(5, vocab_size=64)))


def test_unknown_logit_post_processing_is_detected():
    model = tiny_gemma2()
    hidden, logits = final_hidden_and_logits(model, prompt(5, vocab_size=64))
    model.config.final_logit_softcapping = None  # the logits above were capped: now an unknown transform
    assert not WalkHead.of(model).reproduces(hidden, logits * 0 + logits.max())


@pytest.mark.parametrize("walk_logits,layout", [(True, "rows"), (True, "columns"), (False, "rows")])
def test_both_logit_paths_are_exact(target, drafter, walk_logits, layout, monkeypatch):
    reads, made = [], []
    original_row, original_filled = verify.NodeLogits.row, verify.NodeLogits.filled

    def counting_row(self, node):
        reads.append(node)
        return original_row(self, node)

    def counting_filled(self, nodes, rows):
        made.append(len(nodes))
        return original_filled(self, nodes, rows)

    monkeypatch.setattr(WalkHead, "reproduces", lambda *args: walk_logits)
    # rows past the second: on demand
    monkeypatch.setattr(calibration, "measure_walk_head",
                        lambda target, layouts, batch: WalkHead.of(target, 2, layout))
    monkeypatch.setattr(verify.NodeLogits, "row", counting_row)
    monkeypatch.setattr(verify.NodeLogits, "filled", counting_filled)
    ids = prompt(7, seed=4)
    config = DynaSpecGenerationConfig(tree_policy="eagle2", num_draft_nodes=10, draft_depth=4, draft_top_k=3,
                                      max_new_tokens=30, do_sample=False, return_dict_in_generate=True,
                                      step_policy="off",  # every step verifies a drafted tree
                                      implementation={"verify_head": layout if walk_logits else "auto"})  # auto: full
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=30))
    stats = out.speculative_stats
    # walking: one row read per emitted token, the root's (and the likeliest walk's) from the forward pass, others
    # made on demand, two at a time (the node and its likely child); else every row precomputed and, greedy without
    # processors, every node's argmax read at once
    if walk_logits:
        assert len(reads) == stats.accepted_tokens
        assert made and set(made) <= {1, 2}
        assert len(made) <= stats.accepted_tokens - stats.steps  # a walk reaching past its rows made them
    else:
        assert reads == [] and made == []


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_walk_rows_match_the_full_logits(target, layout):
    """The rows verify_forward computes for the likeliest walk, and those made on demand (in either weight
    layout), equal the rows of a forward with every logit (same tree, same cache)."""
    pool = TreePool.empty(3, 5)
    a = pool.add(5, 0, -0.1)
    pool.add(6, 0, -0.5)
    b = pool.add(7, a, -0.3)
    pool.add(8, b, -0.4)
    tree = compact(pool, pool.mask(range(5)))
    assert verify.likely_walk(tree, 3) == [0, 1, 3]
    rows = {}
    for walk_logits in (True, False):
        cache = DynamicCache()
        with torch.no_grad():
            target(input_ids=prompt(6), cache=cache, use_cache=True)
            head = WalkHead.of(target, 3, layout) if walk_logits else None
            logits, _ = verifier.verify_forward(target, cache, tree, past_length=6, walk_head=head)
            rows[walk_logits] = torch.cat([logits.row(i) for i in range(tree.num_nodes)])  # (n, V)
        if walk_logits:
            assert sorted(logits.rows) == list(range(tree.num_nodes))  # after reading every row
    # the same products, fed to BLAS as 3 rows or 5: equal up to fp32 summation order
    torch.testing.assert_close(rows[True], rows[False], rtol=1e-5, atol=1e-5)


def test_walk_head_is_measured_and_memoised(target, monkeypatch):
    from hf_dynaspec.generation.planning import calibration

    monkeypatch.setattr(calibration, "_WALK_HEADS", calibration.weakref.WeakKeyDictionary())
    rows = [1.0, 1.05, 1.1, 1.3, 1.4, 2.0, 2.0, 2.0]  # seconds of 1..8 rows: 3 rows cost about one
    columns = [0.6, 1.2, 1.8, 2.4, 3.0, 3.6, 4.2, 4.8]  # one row is cheaper, but a 3-row walk is not
    costs = iter(rows + columns + rows + columns)
    monkeypatch.setattr(calibration, "_median_seconds", lambda fn, repeats, device: (fn(), next(costs))[1])
    head = calibration.measure_walk_head(target)
    assert (head.layout, head.rows, head.seconds["columns"]) == ("rows", 3, tuple(columns))
    assert calibration.measure_walk_head(target) is head  # memoised: no second timing
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(1.0)  # an in-place update: a cached copy could be stale
    assert calibration.measure_walk_head(target) is not head  # measured anew (the iterator's second half)
    with pytest.raises(StopIteration):
        next(costs)


def test_every_choice_of_a_layout_shares_its_weight_copy(target, monkeypatch):
    """Batch sizes choose their rows apart, but a layout's copy of the head's weights is made once per weights."""
    from hf_dynaspec.generation.planning import calibration

    monkeypatch.setattr(calibration, "_WALK_HEADS", calibration.weakref.WeakKeyDictionary())
    monkeypatch.setattr(calibration, "_LAYOUT_HEADS", calibration.weakref.WeakKeyDictionary())
    seconds = {"columns": (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7)}
    monkeypatch.setattr(calibration, "walk_head_seconds", lambda *args, **kwargs: seconds)
    one, eight = (calibration.measure_walk_head(target, layouts=("columns",), batch=b) for b in (1, 8))
    assert one is not eight and one.layout == eight.layout == "columns"
    assert one.weight_t is eight.weight_t  # one transposed copy, not one per batch size
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(1.0)  # new weights: a new copy
    assert calibration.measure_walk_head(target, layouts=("columns",), batch=8).weight_t is not eight.weight_t


def test_walk_head_choice_follows_the_costs():
    # a 262,144 x 640 head on one AMD EPYC (ms): the transposed copy wins for 1-3 rows, loses beyond
    rows = (73.0, 158.0, 247.0, 215.0, 215.0, 216.0, 218.0, 220.0)
    columns = (45.0, 102.0, 131.0, 263.0, 280.0, 300.0, 320.0, 342.0)
    assert choose_walk_head({"rows": rows, "columns": columns}, walk=3, columns_margin=0.9) == ("columns", 3)
    assert choose_walk_head({"rows": rows, "columns": columns}, walk=6, columns_margin=0.9) == ("rows", 6)
    assert walk_cost(columns, 3, 6) == 131.0 + 3 * 45.0
    # a copy that saves under 10% is not kept
    assert choose_walk_head({"rows": rows, "columns": tuple(0.95 * t for t in rows)}, 3, 0.9) == ("rows", 5)


def test_a_batch_chooses_its_walk_head_for_every_row_gathered():
    """A batch applies the head once to every row's walk rows: what is cheap for 3 rows need not be for 24."""
    rows = (10.0, 12.0, 14.0, 30.0, 40.0, 50.0, 60.0, 70.0)  # a slower BLAS path from 4 rows on
    columns = (12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0, 26.0)
    seconds = {"rows": rows, "columns": columns}
    assert choose_walk_head(seconds, walk=3, columns_margin=0.9) == ("rows", 3)
    assert choose_walk_head(seconds, walk=3, columns_margin=0.9, batch=8) == ("columns", 3)
    # 8 rows x 3 = 24 rows at once: past the 8 measured, the 8-row time scaled by 24 / 8
    assert walk_cost(columns, 3, 3, batch=8) == 26.0 * 3
    assert walk_cost(rows, 1, 3, batch=8) == 70.0 + 8 * 2 * 10.0
    assert walk_cost(rows, 3, 6) == walk_cost(rows, 3, 6, batch=1) == 14.0 + 3 * 10.0


def test_columns_layout_keeps_the_bias_and_the_soft_cap():
    model = tiny_gemma2()
    hidden, logits = final_hidden_and_logits(model, prompt(5, vocab_size=64))
    head = WalkHead.of(model, layout="columns")
    assert head.weight_t.shape == (32, 64) and head.weight_t.is_contiguous()
    assert head.reproduces(hidden, logits)
    torch.testing.assert_close(head(hidden), WalkHead.of(model)(hidden), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="layout"):
        WalkHead.of(model, layout="diagonal")


def chain_tree(tokens: list[int], branch: int) -> tuple:
    """A tree: the root, a chain of `tokens`, and a second child `branch` of the root (its children ordered
    best first, the chain first)."""
    pool = TreePool.empty(len(tokens) + 1, len(tokens) + 2)
    parent = 0
    for depth, token in enumerate(tokens):
        parent = pool.add(token, parent, -0.1 * (depth + 1))
    pool.add(branch, 0, -2.0)
    return compact(pool, pool.mask(range(len(tokens) + 2)))


@pytest.mark.parametrize("processors", [False, True])
def test_rows_walk_together_and_equal_their_walks_on_full_logits(target, processors):
    """Rows whose walks reach past their computed rows wait and get them in one head call per round
    (`verify.walk_trees`); each row's walk equals its walk on every node's logits."""
    from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    head = WalkHead.of(target, 2)
    torch.manual_seed(3)
    trees, full, partial, sequences = [], [], [], []
    for _ in range(3):
        hidden = torch.randn(6, target.config.hidden_size)  # (n, d) a tree of 6 nodes
        with torch.no_grad():
            logits = head(hidden)  # (n, V)
        picks = logits.argmax(dim=-1).tolist()
        # the root's pick drafted first (accepted unless a processor changes the pick), then likely misses
        chain = [picks[0]] + [0] * 3
        tree = chain_tree(chain, branch=(picks[0] + 1) % target.config.vocab_size)
        order = tree.token_list  # node ids follow the pool's order: root, chain, branch
        trees.append(tree)
        full.append(logits[: tree.num_nodes])
        partial.append(verify.NodeLogits(hidden[: tree.num_nodes], head, {0: logits[0:1]}))
        sequences.append(torch.tensor([[order[0]]]))
    rounds = []
    original = verify.fill_together
    verify.fill_together = lambda logits, nodes: (rounds.append(len(nodes)), original(logits, nodes))[1]
    try:
        chosen = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3)] if processors else [])
        together = verify.walk_trees(trees, partial, sequences, chosen, do_sample=False)
    finally:
        verify.fill_together = original
    alone = [verify.walk_tree(t, f, s, chosen, False) for t, f, s in zip(trees, full, sequences)]
    assert [(w.path, w.new_tokens) for w in together] == [(w.path, w.new_tokens) for w in alone]
    assert rounds and rounds[0] == sum(len(w.path) > 1 for w in alone)  # every row that went on waited in round 1
