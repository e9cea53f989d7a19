"""recipes/gemma3/vllm_engine.py's parts that need no vLLM: the end-of-sequence ids of a saved target and the
stop token vLLM may leave out of an output (the corpus keeps it, as transformers' answers do)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from helpers import REPO, load_script

engine = load_script(REPO / "recipes/gemma3/vllm_engine.py", "vllm_engine")


def test_eos_ids_come_from_the_saved_generation_config_then_the_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [1, 106]}))
    assert engine.engine_eos_ids(tmp_path) == {1, 106}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert engine.engine_eos_ids(tmp_path) == {1}
    with pytest.raises(ValueError, match="save_target"):
        engine.engine_eos_ids(tmp_path / "nowhere")


@pytest.mark.parametrize("ids, reason, stop, expected", [
    ([5, 6], "stop", None, [5, 6, 1]),        # stopped at EOS, which vLLM did not return
    ([5, 106], "stop", 106, [5, 106]),        # returned: kept once
    ([5, 6], "stop", 106, [5, 6, 106]),       # a stop token id not returned
    ([5, 6], "length", None, [5, 6]),         # cut at max_tokens: nothing added
])
def test_outputs_end_with_their_stop_token(ids, reason, stop, expected):
    output = SimpleNamespace(token_ids=ids, finish_reason=reason, stop_reason=stop)
    assert engine.with_eos(output, {1, 106}) == expected


def test_the_engine_starts_on_the_first_continuation_only(monkeypatch):
    """A resumed stage with nothing left to answer never starts vLLM (minutes of start-up per stage)."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))
    starts = []

    class Engine:
        def generate(self, prompts, params, use_tqdm):
            out = SimpleNamespace(token_ids=[7] * params["max_tokens"], finish_reason="length", stop_reason=None)
            return [SimpleNamespace(outputs=[out]) for _ in prompts]

    continue_batch = engine.engine_continuation(lambda: starts.append(1) or Engine(), {1})
    assert starts == []
    assert [t.tolist() for t in continue_batch([[3], [4, 5]], 2)] == [[7, 7], [7, 7]]
    continue_batch([[3]], 1)
    assert starts == [1]
