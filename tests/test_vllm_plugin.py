"""The vLLM plugin's side that runs without vLLM (vLLM itself is not in the test environment: the serving benchmark,
benchmarks/serving/run.sh, runs the plugin inside vLLM): the package imports, its entry point and the draft class
it registers exist under the names a vllm-dynaspec folder and vLLM use."""

from __future__ import annotations

import ast
import importlib.util

import pytest
import tomllib
from helpers import REPO

from hf_dynaspec import vllm_plugin
from hf_dynaspec.vllm_export import ARCHITECTURE


def test_entry_point_names_the_register_hook():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"]["dynaspec"] == "hf_dynaspec.vllm_plugin:register"
    assert callable(vllm_plugin.register)


def test_registered_class_subclasses_vllms_eagle3_draft():
    """vLLM's proposer asserts isinstance(model, Eagle3LlamaForCausalLM), and renames any architecture not starting
    or ending with "Eagle3": the class must subclass it and the name must keep the prefix."""
    module, name = vllm_plugin.DRAFT_CLASS.split(":")
    assert ARCHITECTURE.startswith("Eagle3")
    source = REPO / (module.replace(".", "/") + ".py")
    classes = {node.name: node for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.ClassDef)}
    assert [ast.unparse(base) for base in classes[name].bases] == ["Eagle3LlamaForCausalLM"]
    assert {"compute_logits", "get_top_tokens", "load_weights", "forward", "combine_hidden_states"} <= {
        f.name for f in classes[name].body if isinstance(f, ast.FunctionDef)}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_register_without_vllm_says_so():
    with pytest.raises(ModuleNotFoundError, match="vllm"):
        vllm_plugin.register()


def test_target_classes_capture_hidden_states_under_vllms_names():
    for name, path in vllm_plugin.TARGET_CLASSES.items():
        module, cls = path.split(":")
        source = REPO / (module.replace(".", "/") + ".py")
        classes = {n.name: n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ClassDef)}
        assert [ast.unparse(b) for b in classes[cls].bases] == [name, "SupportsEagle3"]


def test_draft_timer_counts_every_call_per_process_and_wraps_once(tmp_path):
    from hf_dynaspec.vllm_plugin import timing

    class Proposer:  # stands in for vLLM's SpecDecodeBaseProposer
        def propose(self, steps):
            return [s * 2 for s in range(steps)]

    prefix = str(tmp_path / "draft")
    original = Proposer.propose
    assert not timing.install_draft_timer(Proposer, None) and Proposer.propose is original  # off: untouched
    assert timing.install_draft_timer(Proposer, prefix) and timing.install_draft_timer(Proposer, prefix)
    assert Proposer.propose.__wrapped__ is original  # wrapped once, however often vLLM calls register()
    assert timing.read_times(prefix) == {"calls": 0, "seconds": 0.0}
    assert Proposer().propose(3) == [0, 2, 4] and Proposer().propose(1) == [0]
    mine = timing.read_times(prefix)
    assert mine["calls"] == 2 and mine["seconds"] > 0
    other = tmp_path / "draft.1.json"  # another vLLM process (a worker) of the same run
    other.write_text('{"calls": 5, "seconds": 1.5}')
    assert timing.read_times(prefix) == {"calls": 7, "seconds": mine["seconds"] + 1.5}
    (tmp_path / "elsewhere.2.json").write_text('{"calls": 9, "seconds": 9.0}')  # another prefix: not read
    assert timing.read_times(prefix)["calls"] == 7
