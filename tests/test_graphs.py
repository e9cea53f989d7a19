"""Draft steps as captured graphs (`generation.drafting.graphs`): the buffer discipline, the fallback, the settings, and
speculative == greedy with every draft step replayed from its graph (CUDA-graph semantics emulated on the CPU;
the real capture runs where CUDA is)."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import greedy, prompt, speculative, tiny_drafter, tiny_target
from transformers.cache_utils import Cache, StaticLayer

from hf_dynaspec import generation_config
from hf_dynaspec.generation.drafting import graphs
from hf_dynaspec.generation.drafting.candidates import DynaSpecCandidateGenerator
from hf_dynaspec.generation.verification.cache import crop_cache
from hf_dynaspec.generation_config import resolve_draft_settings


def counter_step(cache: torch.Tensor, pointer: torch.Tensor):
    """A step that writes its input at the pointer and advances it (as the drafter's static cache does)."""

    def step(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        position = torch.arange(x.numel()) + pointer  # (n,)
        cache.index_copy_(0, position, x)
        pointer.add_(x.numel())
        return (cache.cumsum(0),)

    return step


def run_counter(runner: graphs.StepGraphs | None, device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """Four calls of `counter_step`, eager (runner None) or through `runner`: (outputs, cache, pointer)."""
    cache, pointer = torch.zeros(12, device=device), torch.zeros((), dtype=torch.long, device=device)
    step = counter_step(cache, pointer)
    outs = []
    for i in range(4):
        x = torch.arange(3, device=device, dtype=torch.float32) + 10 * i
        outs.append(step(x)[0] if runner is None else runner(2, step, (x,), state=(pointer,))[0])
    return outs, cache, int(pointer)


@pytest.mark.parametrize("backend", [graphs.ReplayEmulation(), "cuda"])
def test_replays_match_eager_and_outputs_are_fresh(backend):
    if backend == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("CUDA graphs need CUDA")
        backend, device = graphs.CudaGraphs(), torch.device("cuda")
    else:
        device = torch.device("cpu")
    runner = graphs.StepGraphs(backend)
    outs, cache, pointer = run_counter(runner, device)
    eager_outs, eager_cache, eager_pointer = run_counter(None, device)
    assert runner.replays == 4 and not runner.fallbacks
    for eager, replayed in zip(eager_outs, outs):
        assert torch.equal(eager, replayed)  # each output kept its values: a clone, not the graph's buffer
    assert torch.equal(cache, eager_cache) and pointer == eager_pointer == 12


@pytest.mark.parametrize("bad", ["item", "tensor"])
def test_a_step_capture_refuses_runs_eagerly_with_the_reason_logged(bad, caplog):
    def step(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if bad == "item":
            return (x * x.sum().item(),)
        return (x + torch.tensor([1.0, 2.0]),)

    runner = graphs.StepGraphs(graphs.ReplayEmulation())
    x = torch.tensor([1.0, 3.0])
    with caplog.at_level(logging.WARNING, logger=graphs.__name__):
        first = runner("k", step, (x,))
        second = runner("k", step, (x * 2,))
    assert torch.equal(first[0], step(x)[0]) and torch.equal(second[0], step(x * 2)[0])
    assert runner.replays == 0 and bad in runner.fallbacks["k"]
    assert sum("runs eagerly" in r.message for r in caplog.records) == 1  # said once


def test_the_emulation_bakes_python_values_in_as_a_graph_does():
    """What makes the emulation a check: a step that reads a Python value changing between calls replays the
    captured value, so such a step would be caught by speculative == greedy below."""
    scale = {"value": 2.0}
    runner = graphs.StepGraphs(graphs.ReplayEmulation())

    def step(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x * scale["value"],)

    runner(0, step, (torch.ones(2),))
    scale["value"] = 5.0
    assert runner(0, step, (torch.ones(2),))[0].tolist() == [2.0, 2.0]


def test_crop_moves_a_static_layer_back_without_touching_its_tensors():
    cache = Cache(layers=[StaticLayer(max_cache_len=8)])
    cache.update(torch.ones(1, 2, 5, 4), torch.ones(1, 2, 5, 4), 0)
    keys = cache.layers[0].keys
    crop_cache(cache, 3)
    assert int(cache.layers[0].cumulative_length) == 3 and cache.layers[0].keys is keys


@pytest.fixture
def emulated_graphs(monkeypatch):
    """Graphs allowed on the CPU, captured by `ReplayEmulation`; yields the runners made, to inspect."""
    made: list[graphs.StepGraphs] = []

    def backend_for(device: torch.device) -> graphs.Backend:
        return graphs.ReplayEmulation()

    class Recorded(graphs.StepGraphs):
        def __init__(self, backend: graphs.Backend) -> None:
            super().__init__(backend)
            made.append(self)

    monkeypatch.setattr(generation_config, "GRAPH_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(graphs, "backend_for", backend_for)
    monkeypatch.setattr(graphs, "StepGraphs", Recorded)
    return made


@pytest.mark.parametrize("policy", ["eagle2", "chain"])
@pytest.mark.parametrize("mode", ["dynamic", "static", "full"])
def test_greedy_speculative_with_graphed_draft_steps_equals_greedy(emulated_graphs, mode, policy):
    """Every draft step replayed from its graph (none eager), over steps whose committed length, pool and lookup
    graft all differ: greedy output unchanged."""
    target = tiny_target(eos_token_id=None)
    drafter = tiny_drafter(target, static_token_ids=torch.arange(0, 128, 3))
    ids = prompt()
    out = speculative(target, drafter, ids, max_new_tokens=30, tree_policy=policy, head_mode=mode,
                      tree_growth="device", shortlist_layout="lanes", draft_graphs="on", num_draft_nodes=10,
                      draft_depth=4, lookup_num_tokens=3)
    assert torch.equal(out, greedy(target, ids, max_new_tokens=30))
    (runner,) = emulated_graphs
    assert runner.replays > 0 and not runner.fallbacks and runner.graphs


def drafted(monkeypatch, **settings) -> tuple[list[tuple[list[int], list[int]]], list[torch.Tensor]]:
    """Of one speculative generation: (tokens, parents) of every tree, and every draft step's outputs (features
    and log q of the children, concatenated)."""
    trees, steps = [], []
    draft, run_step = DynaSpecCandidateGenerator.draft, DynaSpecCandidateGenerator._run_step

    def recorded_draft(self, *args, **kwargs):
        tree = draft(self, *args, **kwargs)
        trees.append((list(tree.tokens), list(tree.parents)))
        return tree

    def recorded_step(self, *args):
        feature, head, (children, log_q) = run_step(self, *args)
        steps.append(torch.cat([feature.flatten(), log_q.flatten()]))
        return feature, head, (children, log_q)

    with monkeypatch.context() as patch:
        patch.setattr(DynaSpecCandidateGenerator, "draft", recorded_draft)
        patch.setattr(DynaSpecCandidateGenerator, "_run_step", recorded_step)
        target = tiny_target(eos_token_id=None)
        drafter = tiny_drafter(target)
        speculative(target, drafter, prompt(), max_new_tokens=30, tree_growth="device", shortlist_layout="lanes",
                    num_draft_nodes=10, draft_depth=4, lookup_num_tokens=3, step_policy="off", **settings)
    return trees, steps


def test_graphed_draft_steps_draft_what_eager_steps_draft(emulated_graphs, monkeypatch):
    """Verification keeps the output exact whatever is drafted, so the drafts themselves are compared, with the
    graphs (static cache, replayed steps) and without: the same trees step after step, and each draft step's
    features and log q equal to float rounding (the static cache attends over masked padding too)."""
    eager_trees, eager_steps = drafted(monkeypatch, draft_graphs="off")
    trees, steps = drafted(monkeypatch, draft_graphs="on")
    assert len(eager_trees) > 3 and trees == eager_trees
    assert len(steps) == len(eager_steps)
    for eager, replayed in zip(eager_steps, steps):
        torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=1e-5)
    assert emulated_graphs[-1].replays > 0


def test_draft_graphs_setting_resolves_where_it_applies():
    drafter = tiny_drafter(tiny_target())
    resolve = lambda device, **fields: resolve_draft_settings(  # noqa: E731
        generation_config.DynaSpecGenerationConfig(**generation_config.split_implementation(fields)), None,
        drafter.config, device).draft_graphs
    assert resolve("cuda") == "on"  # CUDA's defaults: device growth, lanes
    assert resolve("cpu") == "off"
    assert resolve("cuda", head_mode="union") == "off" and resolve("cuda", tree_growth="host") == "off"
    assert resolve("cuda", draft_graphs="off") == "off"
    for device, fields, says in [("cpu", {}, "'cpu'"), ("cuda", {"head_mode": "context"}, "changes shape"),
                                 ("cuda", {"tree_policy": "dyspec"}, "grow on the device"),
                                 ("cuda", {"shortlist_layout": "union"}, "lanes")]:
        with pytest.raises(ValueError, match=says):
            resolve(device, draft_graphs="on", **fields)
    with pytest.raises(ValueError, match="draft_graphs must be one of"):
        resolve("cuda", draft_graphs=True)
