"""The target's features computed while training draws its windows: train on a token-id corpus with no feature
folders.

`features.py` stores kilobytes per token (40 GB for Gemma 3's 8.4M-token corpus) and rebuilds them from the
committed ids on every fresh machine before the first step; a run that spans sessions on fresh machines pays that
pass each time. Here the conversations carry ids only (`Conversation.hidden is None`); the trainer hands each batch
of windows to `TargetFeatures`, which runs one right-padded forward of the target over each window's tokens (from
the conversation's start: causal states depend on every token before them) and returns the conversations with the
states that window reads. Held-out conversations are filled once and kept for the whole learning curve.

The cost moves from one pass over the corpus to one forward per window drawn (about the same for a run of one
epoch, more for several); nothing is stored, and a run resumes on any machine from its checkpoint alone.

    python -c "
    import torch; torch.set_num_threads(1); from hf_dynaspec.targets import load_target
    from hf_dynaspec.training.corpus import write_answers
    from hf_dynaspec.training.online import TargetFeatures, corpus_groups
    t, tok = load_target('tiny'); write_answers(t, tok, [{'prompt': 'hi'}], '/tmp/corpus', 8, 2)
    convs = corpus_groups('/tmp/corpus', {'all': '.*'}, [-1])['all']
    print(TargetFeatures(t, [-1])([(convs[0], 4)])[0].hidden.shape)"
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace

import torch

from ..machine import has_bf16_matrix_units
from .corpus import CorpusConversation, load_corpus
from .data import Conversation
from .features import padded_states

FORWARD_DTYPES = ("auto", "float32", "bfloat16")


def corpus_groups(
    corpus_dir: str | os.PathLike, groups: Mapping[str, str], layer_ids: Sequence[int]
) -> dict[str, list[Conversation]]:
    """{group name: its conversations without features} of a token-id corpus (`corpus.py`), a group holding the
    conversations whose source its regular expression matches whole, in corpus order (the order
    `features.write_features` keeps for a folder of that `sources`, so the held-out split is the same)."""
    convs = load_corpus(corpus_dir)
    result = {}
    for name, pattern in groups.items():
        regex = re.compile(pattern)
        chosen = [as_conversation(c, layer_ids) for c in convs if regex.fullmatch(c.source)]
        if not chosen:
            raise ValueError(f"No conversation of {corpus_dir} has a source matching {pattern!r} (group {name!r}).")
        result[name] = chosen
    return result


def as_conversation(conv: CorpusConversation, layer_ids: Sequence[int]) -> Conversation:
    """A corpus conversation as training data whose features are yet to be computed (hidden = aux = None)."""
    loss_mask = torch.zeros(conv.input_ids.numel(), dtype=torch.bool)  # (L,)
    loss_mask[conv.prompt_length:] = True
    return Conversation(conv.input_ids, loss_mask, None, None, tuple(layer_ids))


def forward_autocast(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of the feature forward: "auto" takes bfloat16 on a GPU or a CPU with bf16 matrix units
    (AMX, AVX512-BF16) and float32 elsewhere, where bf16 is emulated and several times slower."""
    if dtype not in FORWARD_DTYPES:
        raise ValueError(f"the feature forward's dtype must be one of {FORWARD_DTYPES}, got {dtype!r}.")
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or has_bf16_matrix_units() else None
    return torch.bfloat16 if dtype == "bfloat16" else None


class TargetFeatures:
    """Fills conversations with the target's states: `features([(conv, n), ...])` returns each conversation
    with `hidden` (n, d) and `aux` (n, k * d), the states of its first n tokens, from one padded forward.
    `autocast`: the forward's autocast dtype (None: the target's own dtype); states are returned in `dtype`."""

    def __init__(self, target, layer_ids: Sequence[int], autocast: torch.dtype | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.target, self.layer_ids, self.autocast, self.dtype = target, list(layer_ids), autocast, dtype
        self.device = target.get_output_embeddings().weight.device

    @torch.no_grad()
    def __call__(self, spans: Sequence[tuple[Conversation, int]]) -> list[Conversation]:
        for conv, n in spans:
            if not 1 <= n <= conv.input_ids.numel() - 1:
                raise ValueError(f"a conversation of {conv.input_ids.numel()} tokens has states for 1.."
                                 f"{conv.input_ids.numel() - 1} tokens (its last is never fed back), not {n}.")
        prefixes = [CorpusConversation(conv.input_ids[:n], 0) for conv, n in spans]
        context = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None
                   else nullcontext())
        with context:
            hidden, aux, _ = padded_states(self.target, prefixes, self.layer_ids)  # (B, W, d), (B, W, k * d)
        return [replace(conv, hidden=hidden[row, :n].to(self.dtype).cpu(), aux=aux[row, :n].to(self.dtype).cpu())
                for row, (conv, n) in enumerate(spans)]


def with_features(convs: list[Conversation], featurize: TargetFeatures | None, max_positions: int | None = None,
                  batch_size: int = 8) -> list[Conversation]:
    """`convs` with every state filled (those that have them kept as they are), in batches of `batch_size`
    grouped by length. `max_positions`: only the leading conversations whose answer positions (the ones an
    evaluation scores) reach that many, as `trainer.evaluate_drafter` reads them."""
    if max_positions is not None:
        kept, positions = [], 0
        for conv in convs:
            if positions >= max_positions:
                break
            kept.append(conv)
            positions += int(conv.loss_mask[2:].sum())
        convs = kept
    todo = sorted((i for i, c in enumerate(convs) if c.hidden is None), key=lambda i: convs[i].input_ids.numel())
    if todo and featurize is None:
        raise ValueError("These conversations carry token ids only: pass the target's features "
                         "(training.online.TargetFeatures) to compute their states.")
    filled = list(convs)
    for lo in range(0, len(todo), batch_size):
        rows = todo[lo : lo + batch_size]
        for i, conv in zip(rows, featurize([(convs[i], convs[i].num_states) for i in rows])):
            filled[i] = conv
    return filled
