"""The bf16 prefilter gives the fp32 head's greedy argmax exactly, and greedy verification with it equals plain
greedy; where it cannot be exact it is refused with the reason."""

from __future__ import annotations

import pytest
import torch
from helpers import prompt
from transformers import Gemma2Config, Gemma2ForCausalLM

from hf_dynaspec import DynaSpecGenerationConfig
from hf_dynaspec.generation.planning import calibration
from hf_dynaspec.generation.verification.prefilter import Prefilter, bounds, unsupported_reason
from hf_dynaspec.generation.verification.walk_head import WalkHead, choose_walk_head


def awkward_head(vocab: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A head (V, d) with exact duplicates and near-ties of its best rows, and hidden states (5, d) of mixed
    scales, the largest pointing at the duplicated rows."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=generator) * torch.rand(vocab, 1, generator=generator) * 3
    hidden = torch.randn(5, dim, generator=generator) * torch.tensor([[1e-3], [1.0], [30.0], [1e3], [1.0]])
    if vocab >= 4:
        weight[vocab // 2] = 30 * hidden[3] / hidden[3].norm()  # the best row for hidden[3] ...
        weight[vocab - 1] = weight[vocab // 2]  # ... twice: the tie goes to the lower id
        weight[1] = weight[vocab // 2] * (1 - 2.0**-20)  # and a near-tie below the bf16 resolution
    return weight, hidden


@pytest.mark.parametrize("vocab,dim", [(1, 3), (7, 5), (1000, 64), (4099, 130)])
@pytest.mark.parametrize("seed", [0, 1])
def test_prefilter_argmax_is_the_fp32_argmax(vocab, dim, seed):
    weight, hidden = awkward_head(vocab, dim, seed)
    picks = Prefilter.of(weight).argmax(hidden)
    rounded = (hidden.double() @ weight.double().T).float()  # the correctly rounded fp32 logits
    assert picks.tolist() == rounded.argmax(dim=-1).tolist()


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_bf16_error_stays_within_the_bound(scale):
    """The maths behind the candidates: |bf16 logit - fp32 logit| <= c u ||h|| ||w||, with room to spare."""
    weight, hidden = awkward_head(4099, 640, 3)
    hidden = hidden * scale
    approx = (hidden.to(torch.bfloat16) @ weight.to(torch.bfloat16).T).float()
    exact = hidden.double() @ weight.double().T
    ratio = (approx.double() - exact).abs() / bounds(hidden, weight.norm(dim=-1)).double()
    assert float(ratio.max()) < 0.5
    assert Prefilter.of(weight).error_over_bound(hidden) == pytest.approx(float(ratio.max()), rel=0.05)


def test_candidates_are_few_when_the_winner_is_clear():
    weight, hidden = awkward_head(4099, 64, 4)
    keep, _ = Prefilter.of(weight).candidates(hidden[3:4])  # the duplicated rows stand far above the rest
    assert keep[0, [1, 2049, 4098]].all() and int(keep.sum()) < 50  # with the near-tie below bf16's resolution


def test_unsupported_heads_say_why():
    head = torch.nn.Linear(8, 16, bias=False)
    assert unsupported_reason(head, 1.0, None) is None
    assert "bias" in unsupported_reason(torch.nn.Linear(8, 16), 1.0, None)
    assert "bfloat16" in unsupported_reason(torch.nn.Linear(8, 16, bias=False, dtype=torch.bfloat16), 1.0, None)
    assert "soft-caps" in unsupported_reason(head, 1.0, 30.0)
    assert "scales" in unsupported_reason(head, 0.5, None)


def test_soft_capped_target_refuses_the_prefilter_layout():
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="soft-caps"):
        WalkHead.of(Gemma2ForCausalLM(config), layout="prefilter")


@pytest.mark.parametrize("verify_head", ["full", "rows", "columns", "prefilter", "auto"])
def test_greedy_output_is_plain_greedy_for_every_verify_head(target, drafter, verify_head):
    ids = prompt(7, seed=5)
    config = DynaSpecGenerationConfig(num_draft_nodes=10, draft_depth=4, draft_top_k=3, max_new_tokens=30,
                                      do_sample=False, implementation={"verify_head": verify_head})
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=30))


def test_prefilter_picks_are_made_without_logits(target, drafter, monkeypatch):
    """With the prefilter no node's logits are computed: every pick comes from the bf16 pass."""
    from hf_dynaspec.generation.verification import verify

    monkeypatch.setattr(verify.NodeLogits, "row", lambda self, node: pytest.fail("logits were computed"))
    config = DynaSpecGenerationConfig(max_new_tokens=12, do_sample=False, implementation={"verify_head": "prefilter"})
    target.generate(prompt(6), generation_config=config, assistant_model=drafter)


@pytest.mark.parametrize("kwargs", [dict(do_sample=True), dict(repetition_penalty=1.3),
                                    dict(return_dict_in_generate=True, output_scores=True)])
def test_prefilter_needs_plain_greedy(target, drafter, kwargs):
    config = DynaSpecGenerationConfig(max_new_tokens=4, implementation={"verify_head": "prefilter"}, **kwargs)
    with pytest.raises(ValueError, match="greedy picks only"):
        target.generate(prompt(5), generation_config=config, assistant_model=drafter)


def test_auto_leaves_the_prefilter_out_when_sampling(target, drafter, monkeypatch):
    asked = []

    def measured(model, layouts, batch):
        asked.append(layouts)
        return WalkHead.of(model, layout=layouts[0])

    monkeypatch.setattr("hf_dynaspec.generation.planning.calibration.measure_walk_head", measured)
    for do_sample in (False, True):
        config = DynaSpecGenerationConfig(max_new_tokens=4, do_sample=do_sample)
        target.generate(prompt(5), generation_config=config, assistant_model=drafter)
    assert asked == [("rows", "columns", "prefilter"), ("rows", "columns")]


def test_a_batch_asks_for_the_walk_head_of_its_size(target, drafter, monkeypatch):
    """The head's layout is chosen for every row's walk rows gathered (`choose_walk_head(..., batch=B)`)."""
    asked = []

    def measured(model, layouts, batch):
        asked.append(batch)
        return WalkHead.of(model, layout="rows")

    monkeypatch.setattr("hf_dynaspec.generation.planning.calibration.measure_walk_head", measured)
    ids = torch.cat([prompt(6, seed=s) for s in range(3)])  # (3, 6)
    config = DynaSpecGenerationConfig(max_new_tokens=4, do_sample=False)
    target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, assistant_model=drafter)
    assert asked == [3]


def test_walk_head_choice_among_three_layouts():
    rows = (1.0, 1.1, 1.2)
    assert choose_walk_head({"rows": rows, "columns": rows, "prefilter": (0.5, 0.5, 0.6)}, 3, 0.9) == ("prefilter", 3)
    assert choose_walk_head({"prefilter": (0.5, 1.2)}, 2, 0.9) == ("prefilter", 1)
    assert choose_walk_head({"rows": rows, "prefilter": (0.95, 1.05, 1.15)}, 3, 0.9)[0] == "rows"  # copy must pay


def test_named_layout_is_measured_alone(target, monkeypatch):
    monkeypatch.setattr(calibration, "_WALK_HEADS", calibration.weakref.WeakKeyDictionary())
    head = calibration.measure_walk_head(target, max_rows=3, repeats=1, layouts=("prefilter",))
    assert head.layout == "prefilter" and list(head.seconds) == ["prefilter"]
    with pytest.raises(ValueError, match="layouts must be some of"):
        calibration.measure_walk_head(target, layouts=("diagonal",))


def test_a_bf16_gemm_beyond_the_bound_keeps_the_prefilter_out(target, monkeypatch):
    from hf_dynaspec.generation.verification import prefilter

    monkeypatch.setattr(calibration, "_WALK_HEADS", calibration.weakref.WeakKeyDictionary())
    monkeypatch.setattr(prefilter.Prefilter, "error_over_bound", lambda self, hidden: 0.7)
    head = calibration.measure_walk_head(target, max_rows=2, repeats=1, layouts=("rows", "prefilter"))
    assert head.layout == "rows"  # timed, but not taken: not exact on this machine
    with pytest.raises(ValueError, match="errs beyond the bound"):
        calibration.measure_walk_head(target, max_rows=2, repeats=1, layouts=("prefilter",))


def test_verify_costs_take_the_prefilter_picks_from_their_own_timing(target, monkeypatch):
    """A forward timed for c(n) over random tokens does not rescore its (flat) rows: the prefilter layout's own
    timing of that many picks is added instead (real contexts leave few candidates, random ones thousands)."""
    from transformers import DynamicCache

    head = WalkHead.of(target, rows=2, layout="prefilter")
    head = type(head)(**{**head.__dict__, "seconds": {"prefilter": (5.0, 7.0)}})  # known, unmistakable timings

    def no_rescoring(*_):
        raise AssertionError("the timed forward rescored random rows")

    monkeypatch.setattr(Prefilter, "argmax", no_rescoring)
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=prompt(8), cache=cache, use_cache=True)
    one = calibration.time_forward(target, cache, 8, 1, 1, walk_head=head)
    three = calibration.time_forward(target, cache, 8, 3, 1, walk_head=head)
    assert 5.0 < one < 6.0 and 7.0 < three < 8.0  # 1 pick, then the walk head's 2 rows, plus a tiny forward
    assert cache.get_seq_length() == 8  # cropped back
