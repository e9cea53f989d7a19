"""Draft trees per device type: `device_trees` in generation configs, the library's per-device defaults, and the
script that chooses the CUDA default from measured costs (benchmarks/device_tree.py)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import REPO, load_benchmark_script, load_script, prompt, tiny_drafter

from hf_dynaspec import DynaSpecConfig, DynaSpecGenerationConfig
from hf_dynaspec.bench import Record
from hf_dynaspec.generation_config import (
    DEFAULT_DEVICE_TREES,
    DEFAULT_SETTINGS,
    TREE_FIELDS,
    resolve_draft_settings,
)
from hf_dynaspec.sharing import trees_text

DRAFTER_CONFIG = DynaSpecConfig(vocab_size=64, num_clusters=8)


def tree_of(settings) -> dict:
    return {k: getattr(settings, k) for k in TREE_FIELDS}


def test_a_fresh_drafter_takes_the_library_tree_of_the_targets_device(target):
    drafter = tiny_drafter(target)
    assert drafter.generation_config.num_draft_nodes is None  # the tree is not frozen into a fresh drafter
    on_cpu = resolve_draft_settings(None, drafter.generation_config, drafter.config, "cpu")
    on_cuda = resolve_draft_settings(None, drafter.generation_config, drafter.config, "cuda")
    assert tree_of(on_cpu) == {k: DEFAULT_SETTINGS[k] for k in TREE_FIELDS}
    assert tree_of(on_cuda) == {k: DEFAULT_DEVICE_TREES["cuda"].get(k, DEFAULT_SETTINGS[k]) for k in TREE_FIELDS}
    assert on_cuda.num_draft_nodes > on_cpu.num_draft_nodes  # verification is dearer per node on a CPU


def test_device_trees_override_flat_fields_and_the_call_overrides_the_drafter():
    drafter_defaults = DynaSpecGenerationConfig(num_draft_nodes=20, draft_depth=4,
                                                device_trees={"cpu": {"num_draft_nodes": 9}})
    resolve = lambda call, device: resolve_draft_settings(call, drafter_defaults, DRAFTER_CONFIG, device)  # noqa: E731
    assert (resolve(None, "cpu").num_draft_nodes, resolve(None, "cpu").draft_depth) == (9, 4)
    assert resolve(None, "cuda").num_draft_nodes == 20  # the drafter's flat field, over the library's CUDA tree
    assert resolve(DynaSpecGenerationConfig(num_draft_nodes=7), "cpu").num_draft_nodes == 7
    per_call = DynaSpecGenerationConfig(num_draft_nodes=7, device_trees={"cpu": {"num_draft_nodes": 5}})
    assert (resolve(per_call, "cpu").num_draft_nodes, resolve(per_call, "cuda").num_draft_nodes) == (5, 7)


@pytest.mark.parametrize(("trees", "message"), [
    ({"cuda:0": {"num_draft_nodes": 8}}, "device types such as 'cpu' or 'cuda'"),
    ({"gpu": {"num_draft_nodes": 8}}, "device types such as 'cpu' or 'cuda'"),
    ({"cuda": {"head_mode": "full"}}, r"sets tree fields only .*set other fields flat"),
    ({"cuda": {"num_draft_nodes": 0}}, r"num_draft_nodes must be an integer in \[1, 1024\]"),
    ({"cuda": 60}, "sets tree fields only"),
    ([("cuda", {})], "must be a dict"),
])
def test_impossible_device_trees_are_refused(trees, message):
    with pytest.raises(ValueError, match=message):
        DynaSpecGenerationConfig(device_trees=trees)
    with pytest.raises(ValueError, match=message):  # also where validation is skipped: set as an attribute
        config = DynaSpecGenerationConfig()
        config.device_trees = trees
        resolve_draft_settings(config, None, DRAFTER_CONFIG, "cpu")


def test_device_trees_round_trip_through_generation_config_json(tmp_path):
    config = DynaSpecGenerationConfig(head_mode="full", device_trees={"cpu": {"num_draft_nodes": 9},
                                                                      "cuda": {"draft_depth": 7}})
    config.save_pretrained(tmp_path)
    assert DynaSpecGenerationConfig.from_pretrained(tmp_path).device_trees == config.device_trees


def test_generate_uses_the_tree_of_the_targets_device_and_stays_exact(target):
    drafter = tiny_drafter(target)
    ids = prompt(6)
    plain = target.generate(ids, max_new_tokens=16, do_sample=False)

    def tree_size(device_trees: dict) -> float:
        config = DynaSpecGenerationConfig(max_new_tokens=16, return_dict_in_generate=True, lookup_num_tokens=0,
                                          device_trees=device_trees, step_policy="off")  # the whole tree
        out = target.generate(ids, generation_config=config, assistant_model=drafter)
        assert torch.equal(out.sequences, plain)
        return out.speculative_stats.mean_tree_size

    chain = {"tree_policy": "chain", "draft_depth": 2}
    assert tree_size({"cpu": chain}) <= 2  # the target is on the CPU: its tree applies
    assert tree_size({"cuda": chain}) > 2  # another device's tree does not


def test_model_card_states_the_tree_per_device(target):
    drafter = tiny_drafter(target)
    drafter.generation_config.device_trees = {"cpu": {"num_draft_nodes": 9}}
    text = trees_text(drafter)
    assert "CPU: " in text and "`num_draft_nodes=9`" in text
    assert f"CUDA: `tree_policy='eagle2'`, `num_draft_nodes={DEFAULT_DEVICE_TREES['cuda']['num_draft_nodes']}`" in text


def test_tune_tree_stores_the_chosen_tree_for_the_device_it_was_measured_on():
    tune_tree = load_script(REPO / "recipes/smollm2/tune_tree.py", "tune_tree")
    config = DynaSpecGenerationConfig(num_draft_nodes=12, draft_depth=5, head_mode="dynamic",
                                      device_trees={"cuda": {"draft_depth": 7}})
    stored = tune_tree.store_tree(config, {"num_draft_nodes": 8, "draft_depth": 4, "head_mode": "static"}, "cpu")
    assert stored.device_trees == {"cuda": {"draft_depth": 7}, "cpu": {"num_draft_nodes": 8, "draft_depth": 4}}
    assert (stored.num_draft_nodes, stored.draft_depth, stored.head_mode) == (None, None, "static")


# ------------------------------------------------------------------ benchmarks/device_tree.py
def verify_section(tree_ms: dict[int, float], plain_ms: float = 10.0, context: int = 512) -> dict:
    rows = [dict(context=context, mask="causal", nodes=1, ms=plain_ms)]
    rows += [dict(context=context, mask="tree", nodes=n, ms=ms) for n, ms in tree_ms.items()]
    return {"rows": rows}


def test_device_costs_are_non_decreasing_and_a_size_costs_as_the_next_measured_one():
    script = load_benchmark_script("device_tree")
    costs = script.device_costs(verify_section({1: 10.0, 2: 15.0, 4: 12.0, 8: 20.0}))
    assert costs.costs == (1.0, 1.5, 1.5, 1.5, 2.0, 2.0, 2.0, 2.0)  # 4 measured cheaper than 2: noise, lifted
    two = {"rows": verify_section({1: 10.0, 2: 12.0})["rows"] + verify_section({1: 20.0, 2: 20.0}, 10.0, 2048)["rows"]}
    assert script.device_costs(two).costs == pytest.approx((1.5, 1.6))  # the mean over contexts


def test_the_model_prefers_more_tokens_per_step_until_drafting_depth_costs_more():
    script = load_benchmark_script("device_tree")
    costs = script.device_costs(verify_section({1: 10.0, 64: 10.0}))  # flat: verification is free per node

    def records(method: str, tokens: int, nodes: int, matches: bool = True) -> list[Record]:
        stats = dict(steps=10, accepted_tokens=tokens, tree_nodes=nodes)
        return [Record(method, "qa", "1", 1.0, tokens, matches, stats), Record("plain", "qa", "1", 2.0, tokens)]

    shallow = "dynaspec[num_draft_nodes=12,draft_depth=4,draft_top_k=4,min_draft_prob=0.0]"
    deep = "dynaspec[num_draft_nodes=60,draft_depth=8,draft_top_k=10,min_draft_prob=0.0]"
    rows = script.tree_rows(records(shallow, 30, 120) + records(deep, 34, 600), costs, r=0.1)
    by = {row["method"]: row for row in rows}
    assert by[shallow]["modelled_speedup"] == pytest.approx(3.0 / (1.0 + 4 * 0.1))
    assert script.choose(rows)["method"] == shallow  # 3.4 / 1.8 = 1.89 < 3.0 / 1.4 = 2.14
    rows = script.tree_rows(records(shallow, 30, 120) + records(deep, 44, 600), costs, r=0.1)
    assert script.choose(rows)["method"] == deep  # 4.4 / 1.8 = 2.44 > 2.14
    rows = script.tree_rows(records(shallow, 30, 120, matches=False) + records(deep, 34, 600), costs, r=0.1)
    assert script.choose(rows)["method"] == deep  # a tree whose output differs from plain is never chosen


def test_a_step_cost_the_gpu_suite_measured_replaces_the_model():
    script = load_benchmark_script("device_tree")
    costs = script.device_costs(verify_section({1: 10.0, 64: 10.0}))
    tree = dict(num_draft_nodes=12, draft_depth=4, draft_top_k=4, min_draft_prob=0.0)
    gpu = {"sections": {"trees": {"rows": [dict(tree=tree, cost=2.5)]}}}
    measured = script.measured_step_costs(gpu)
    assert measured == {(12, 4, 4): 2.5} and script.measured_step_costs({"sections": {}}) == {}
    method = "dynaspec[num_draft_nodes=12,draft_depth=4,draft_top_k=4,min_draft_prob=0.0]"
    other = "dynaspec[num_draft_nodes=24,draft_depth=4,draft_top_k=4,min_draft_prob=0.0]"
    records = [Record("plain", "qa", "1", 2.0, 30)] + [
        Record(m, "qa", "1", 1.0, 30, True, dict(steps=10, accepted_tokens=30, tree_nodes=120)) for m in (method, other)]
    by = {row["method"]: row for row in script.tree_rows(records, costs, r=0.1, measured=measured)}
    assert by[method]["step_cost_source"] == "measured" and by[method]["modelled_speedup"] == pytest.approx(3.0 / 2.5)
    assert by[method]["modelled_speedup_2r"] == pytest.approx(3.0 / (2.5 + 4 * 0.1))
    assert by[other]["step_cost_source"] == "modelled" and by[other]["step_cost"] == pytest.approx(1.0 + 4 * 0.1)


def test_trees_tied_within_one_percent_go_to_the_one_emitting_more_tokens():
    script = load_benchmark_script("device_tree")
    rows = [dict(method="a", mismatches=0, modelled_speedup_geomean=1.300, tokens_per_step=2.7),
            dict(method="b", mismatches=0, modelled_speedup_geomean=1.295, tokens_per_step=3.0),
            dict(method="c", mismatches=0, modelled_speedup_geomean=1.200, tokens_per_step=3.5)]
    assert script.choose(rows)["method"] == "b"
    assert script.choose(rows, tie=0.0)["method"] == "a"


def test_the_library_cuda_tree_is_the_one_the_committed_model_chose():
    chosen = json.loads((REPO / "benchmarks/results/cuda-default-tree/results.json").read_text())["meta"]["tree"]
    assert {k: v for k, v in chosen.items() if k != "tree_policy"} == DEFAULT_DEVICE_TREES["cuda"]


def test_the_markdown_fills_every_figure_and_marks_the_choice():
    script = load_benchmark_script("device_tree")
    rows = [dict(method=m, tree=dict(num_draft_nodes=n, draft_depth=2, draft_top_k=4, min_draft_prob=0.0),
                 tokens_per_step=t, nodes_per_step=n, verify_cost=1.5, step_cost=1.7, step_cost_source="modelled",
                 modelled_speedup=t / 1.7, modelled_speedup_2r=t / 1.9, modelled_speedup_geomean=t / 1.8,
                 cpu_speedup=1.0, mismatches=0, prompts=2) for m, n, t in (("a", 8, 2.0), ("b", 16, 2.5))]
    meta = dict(gpu_device="GPU", gpu="gpu-run", prompts="2", machine="CPU", sweeps=["sweep"], r=0.1234,
                c_min=1.5, c_max=1.5, c_sizes=64)
    text = script.markdown(rows, script.choose(rows), meta)
    assert "{" not in text and "r = 0.123 plain steps" in text and "c(n) = 1.50 plain steps" in text
    assert [line.endswith("| yes |") for line in text.splitlines() if line.startswith("| 16 ")] == [True]


@pytest.mark.parametrize("head_mode", ["dynamic", "union", "full"])
def test_the_cuda_default_tree_keeps_greedy_exact(target, head_mode):
    # run here on the CPU through device_trees: the same drafting, walk and verification code as on CUDA
    drafter = tiny_drafter(target)
    ids = prompt(7, seed=3)
    config = DynaSpecGenerationConfig(max_new_tokens=24, head_mode=head_mode, return_dict_in_generate=True,
                                      device_trees={"cpu": DEFAULT_DEVICE_TREES["cuda"]}, step_policy="off")
    out = target.generate(ids, generation_config=config, assistant_model=drafter)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=24, do_sample=False))
    assert out.speculative_stats.mean_tree_size > DEFAULT_SETTINGS["num_draft_nodes"]  # the large tree was drafted
