"""recipes/gemma3/root_recall.py on a tiny target: the shortlists it replays at every continuation position are
the ones the drafter's own forward builds, a shortlist of the whole vocabulary holds everything, and the budget
of the named bench method is the one measured."""

from __future__ import annotations

import pytest
import torch
from helpers import REPO, load_script

from hf_dynaspec import DynaSpecDrafter, bench
from hf_dynaspec.targets import encode_formatted, load_target

root_recall = load_script(REPO / "recipes/gemma3/root_recall.py", "gemma3_root_recall")
PROMPTS = [{"question_id": f"{cat}-{i}", "category": cat, "prompt": f"{words} {i}"}
           for cat, words in (("en", "hello there"), ("de", "guten tag")) for i in range(2)]


def tiny_setup():
    target, tokenizer = load_target("tiny")
    vocab = target.config.vocab_size
    drafter = DynaSpecDrafter.from_target(target, num_clusters=8, seed=0, drafter_architecture="eagle3")
    drafter.set_static_shortlist(torch.randperm(vocab, generator=torch.Generator().manual_seed(0)), ranked=True)
    return target, tokenizer, drafter.bind(target, force=True).eval()


def forward_membership(target, tokenizer, drafter, row: dict, output_ids: list[int], k: int) -> tuple[int, int, int]:
    """(next tokens inside the router's top-k shortlist, positions whose shortlist top-1 is the next token,
    positions) by the drafter's public forward: position j reads (project(target features of j), x_{j+1}) and
    its shortlist must hold x_{j+2}."""
    prompt_ids = encode_formatted(tokenizer, row["prompt"], "plain")[0]
    ids = torch.cat([prompt_ids, torch.tensor(output_ids)])[None]  # (1, L)
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
        hidden = drafter.project(drafter.target_features(states))[:, :-2]  # (1, L - 2, d)
        out = drafter(ids[:, 1:-1], hidden, num_clusters=k, return_vocab_logits=True)
    first = prompt_ids.numel() - 1  # the first position whose token x_{j+1} is a new one
    logits = out.vocab_logits[first:]  # (n, V)
    nxt = ids[0, first + 2 :]
    return int(logits.gather(1, nxt[:, None]).isfinite().sum()), int((logits.argmax(-1) == nxt).sum()), nxt.numel()


def test_root_recall_replays_the_drafters_shortlists():
    target, tokenizer, drafter = tiny_setup()
    methods = ["plain", "dynaspec", "static[static_size=40]", "static", "static[static_size=40,lookup_num_tokens=0]"]
    records = bench.run_bench(target, tokenizer, drafter, PROMPTS, methods, 12, warmup=0, prompt_format="plain")
    outputs = {r.question_id: r.output_ids for r in records if r.method == "plain"}
    assert all(len(o) == 12 for o in outputs.values())
    assert all(r.output_ids is None for r in records if r.method != "plain")

    result = root_recall.measure(target, tokenizer, drafter, PROMPTS, records, "plain", "dynaspec")
    assert result["meta"]["static_sizes"] == {"static[static_size=40]": 40, "static": target.config.vocab_size}
    k0 = result["meta"]["shortlist_k0"]
    assert k0 == drafter.config.shortlist_k0
    hits = right = positions = 0
    for row in PROMPTS:
        h, r, n = forward_membership(target, tokenizer, drafter, row, outputs[row["question_id"]], k0)
        hits, right, positions = hits + h, right + r, positions + n
    overall = result["categories"]["overall"]
    assert overall["positions"] == positions == 4 * 11
    assert abs(overall["dynaspec"]["next"] - hits / positions) < 1e-9
    assert abs(overall["dynaspec"]["draft"] - right / positions) < 1e-9
    assert overall["static"]["draft"] == overall["full head"]["next"]  # the whole list drafts the full head's top-1
    assert overall["static"]["next"] == overall["static"]["top1"] == 1.0  # every token is in the whole list
    assert overall["static"]["size"] == target.config.vocab_size
    first40 = set(drafter.bound_head.static_ranking[:40].tolist()) | set(drafter.config.always_include_ids)
    nexts = [t for o in outputs.values() for t in o[1:]]
    assert abs(overall["static[static_size=40]"]["next"] - sum(t in first40 for t in nexts) / len(nexts)) < 1e-9
    assert list(result["categories"]) == ["de", "en", "overall"]
    assert "| overall | 44 |" in root_recall.markdown(result)


def test_root_recall_takes_the_named_methods_budget_and_needs_plain_outputs():
    target, tokenizer, drafter = tiny_setup()
    records = bench.run_bench(target, tokenizer, drafter, PROMPTS[:1], ["plain"], 10, warmup=0,
                              prompt_format="plain")
    every = root_recall.measure(target, tokenizer, drafter, PROMPTS[:1], records, "plain",
                                "dynaspec[shortlist_k0=8]")  # all 8 clusters: the whole vocabulary
    assert every["meta"]["shortlist_k0"] == 8
    assert every["categories"]["overall"]["dynaspec"]["next"] == 1.0
    assert every["categories"]["overall"]["dynaspec"]["top1"] == 1.0
    assert every["categories"]["overall"]["dynaspec"]["draft"] == every["categories"]["overall"]["full head"]["next"]
    for record in records:
        record.output_ids = None
    with pytest.raises(ValueError, match="no plain outputs"):
        root_recall.measure(target, tokenizer, drafter, PROMPTS[:1], records, "plain", "dynaspec")
