"""The self-distilled training corpus as token ids: small enough to commit, everything else recomputed from it.

Two resumable stages, each appending to files in one folder (commit the folder; it survives a fresh machine):

1. **Questions, Magpie-style** (`write_questions`): the target writes its own user turns. The chat template is
   opened with a system message that steers the domain (writing, coding, math, ...) followed by the bare start
   of a user turn; what the target samples up to its end-of-turn token is a question of that domain.
   Stored in `questions.jsonl` ({"prompt", "source"}), deduplicated.
2. **Answers** (`write_answers`): the target answers every prompt greedily (batched, left padding, bf16 where
   the CPU has bf16 matrix units: measured 2.8x faster than fp32 on an AVX512-BF16 EPYC); each conversation
   is stored as its token ids (the chat-templated prompt, then the answer) in compressed shards
   `answers_00000.npz` = {input_ids (N,) uint16/int32, offsets (n + 1,), prompt_lengths (n,)} plus
   `index.json` (the prompts done, by hash; tokens, seconds and tokens/s per shard).

The target's features (hidden states of the layers the drafter reads, and its final hidden state for the
loss) are recomputed from these ids in batched forward passes (`features.py`): they are large (kilobytes
per token) and never committed.

    python -c "
    import torch; torch.set_num_threads(1); from hf_dynaspec.targets import load_target
    from hf_dynaspec.training.corpus import write_answers, load_corpus
    t, tok = load_target('tiny'); write_answers(t, tok, [{'prompt': 'hi'}, {'prompt': 'hello'}], '/tmp/corpus', 8, 2)
    print([c.input_ids.shape for c in load_corpus('/tmp/corpus')])"
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..targets import encode_prompt

INDEX_NAME = "index.json"
QUESTIONS_NAME = "questions.jsonl"
CORPUS_VERSION = 1

# Magpie domain steering: the system message placed before the bare user turn.
DOMAINS: dict[str, str] = {
    "writing": "You help users with creative and professional writing: stories, poems, letters, essays, emails.",
    "coding": "You help programmers: writing, explaining, debugging and reviewing code in Python, JavaScript, "
    "C++, SQL, Rust and shell scripts.",
    "math": "You help students solve math problems step by step: arithmetic, algebra, geometry, probability "
    "and word problems.",
    "roleplay": "You take part in role-play: users ask you to act as a character, a professional or a guide "
    "and stay in that role.",
    "qa": "You answer factual questions about the world: history, geography, people, sports, culture and "
    "everyday knowledge.",
    "extraction": "You extract information from text the user pastes: names, dates, numbers, lists, tables "
    "and key facts, often as JSON.",
    "translation": "You translate text between English, French, German, Spanish, Italian and Portuguese.",
    "summarization": "You summarize texts the user pastes: news articles, reports, emails, stories and "
    "meeting notes.",
    "stem": "You explain science and engineering: physics, chemistry, biology, computer science, medicine "
    "and technology.",
    "humanities": "You discuss the humanities: philosophy, literature, art, music, religion, economics and "
    "social sciences.",
}

# The first words of the user turn, one drawn per batch: a 135M target follows a system message only loosely,
# an opening word keeps its questions on the domain (the rest of the turn is its own).
OPENERS: dict[str, tuple[str, ...]] = {
    "writing": ("Write a", "Can you write", "Compose a", "Help me write", "Draft an email", "Rewrite this"),
    "coding": ("Write a Python function", "How do I", "Fix this code:", "Explain this code:", "Write a SQL query",
               "In JavaScript,", "Write a bash script"),
    "math": ("Solve", "If a", "A store sells", "What is the probability", "Calculate", "Find the value of"),
    "roleplay": ("Pretend you are", "Act as a", "You are a", "Imagine you are", "Play the role of"),
    "qa": ("Who was", "What is", "When did", "Where is", "Why do", "How many"),
    "extraction": ("Extract", "List all the names in", "From the following text,", "Find the dates in",
                   "Convert this into JSON:"),
    "translation": ("Translate into French:", "Translate into German:", "Translate into Spanish:",
                    "Translate to English:", "How do you say"),
    "summarization": ("Summarize", "Give me a short summary of", "TL;DR:", "Summarize this article:",
                      "Write a one-paragraph summary of"),
    "stem": ("Explain how", "What is the difference between", "Why does", "How does", "Describe the process"),
    "humanities": ("What did", "Discuss", "Compare", "What is the meaning of", "Analyze the theme of"),
}


@dataclass
class CorpusConversation:
    """One conversation: input_ids (L,) long, the first `prompt_length` of them the chat-templated prompt, and
    the `source` its prompt record named ("" where the shard did not record it)."""

    input_ids: torch.Tensor
    prompt_length: int
    source: str = ""


# ----------------------------------------------------------------------------------------------- tokens
def prompt_key(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()


def pad_token_id(tokenizer, target) -> int:
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id, target.config.get_text_config().eos_token_id):
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def eos_token_ids(target) -> set[int]:
    eos = target.generation_config.eos_token_id
    if eos is None:
        eos = target.config.get_text_config().eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


# ----------------------------------------------------------------------------------------------- questions
def magpie_prefix(tokenizer, system: str) -> str:
    """The chat template opened up to the first character of a user turn, after `system`."""
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "\x00"}], tokenize=False
    )
    return text[: text.index("\x00")]


@torch.no_grad()
def sample_turns(model, tokenizer, prefix: str, count: int, max_new_tokens: int, seed: int) -> list[str]:
    """`count` sampled continuations of `prefix` (temperature 1, top-p 0.95), cut at the end of the turn."""
    torch.manual_seed(seed)
    ids = tokenizer(prefix, return_tensors="pt", add_special_tokens=False).input_ids.expand(count, -1)
    eos = sorted(eos_token_ids(model))
    out = model.generate(
        input_ids=ids.to(model.device), attention_mask=torch.ones_like(ids).to(model.device),
        max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_p=0.95, top_k=0,
        pad_token_id=pad_token_id(tokenizer, model), eos_token_id=eos or None,
    )
    texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=False)
    return [_turn_text(text, tokenizer) for text in texts]


def _turn_text(text: str, tokenizer) -> str:
    for stop in {tokenizer.eos_token, "<|im_end|>", "<|im_start|>", "<end_of_turn>", "<|eot_id|>"} - {None}:
        text = text.split(stop)[0]
    return text.replace(tokenizer.pad_token or "\x00", "").rstrip()


def usable_question(text: str, max_chars: int = 1500) -> bool:
    """A finished, non-trivial question: 12+ characters, not truncated mid-turn past `max_chars`."""
    return 12 <= len(text) <= max_chars and not text.lower().startswith(("<", "system"))


def write_questions(
    model, tokenizer, out_dir: str | os.PathLike, per_domain: int, batch_size: int = 64,
    max_new_tokens: int = 96, domains: Sequence[str] | None = None, progress: bool = True,
) -> dict[str, int]:
    """Append Magpie questions to `out_dir/questions.jsonl` until each domain has `per_domain` (resumable:
    the file is reread, each batch appended). Returns the count per domain."""
    path = Path(out_dir) / QUESTIONS_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    seen = {r["prompt"] for r in records}
    counts = {d: sum(r["source"] == f"magpie-{d}" for r in records) for d in (domains or DOMAINS)}
    bar = tqdm(total=per_domain * len(counts), initial=sum(min(c, per_domain) for c in counts.values()),
               desc="magpie questions", unit="q", disable=not progress)
    for domain in counts:
        attempt = 0
        while counts[domain] < per_domain and attempt < 4 * per_domain // batch_size + 4:
            seed = zlib.crc32(f"{domain}/{counts[domain]}/{attempt}".encode())
            opener = OPENERS[domain][seed % len(OPENERS[domain])]
            prefix = magpie_prefix(tokenizer, DOMAINS[domain]) + opener
            turns = sample_turns(model, tokenizer, prefix, batch_size, max_new_tokens, seed)
            fresh = [(opener + t).strip() for t in turns if len(t.strip()) >= 8]
            fresh = [q for q in fresh if usable_question(q) and q not in seen]
            fresh = list(dict.fromkeys(fresh))[: per_domain - counts[domain]]
            with path.open("a", encoding="utf-8") as f:
                for text in fresh:
                    f.write(json.dumps({"prompt": text, "source": f"magpie-{domain}"}) + "\n")
            seen.update(fresh)
            counts[domain] += len(fresh)
            bar.update(len(fresh))
            attempt += 1
    bar.close()
    return counts


# ----------------------------------------------------------------------------------------------- answers
@torch.no_grad()
def answer_batch(
    model, prompt_ids: list[list[int]], max_new_tokens: int, pad_id: int, eos_ids: set[int],
    capture_layers: list[int] | None = None,
) -> tuple[list[torch.Tensor], list[tuple[np.ndarray, np.ndarray]] | None]:
    """Greedy answers (each trimmed after its first end-of-sequence token) of one left-padded batch, and with
    `capture_layers` the target's features of every conversation as it generated them: (hidden (L - 1, d) the
    final normed states, aux (L - 1, k * d) the layers `capture_layers`), float16 (see `features.py`)."""
    input_ids, attention_mask = left_pad(prompt_ids, pad_id)  # (B, P) each
    width = input_ids.shape[1]
    final = model.config.get_text_config().num_hidden_layers  # the final normed state's index
    capture = {} if capture_layers is None else dict(
        output_hidden_states=sorted(set(capture_layers) | {final}), return_dict_in_generate=True)
    out = model.generate(
        input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
        max_new_tokens=max_new_tokens, min_new_tokens=1, do_sample=False, pad_token_id=pad_id, **capture,
    )
    sequences = out.sequences if capture else out
    answers = [trim_at_eos(row, eos_ids) for row in sequences[:, width:].cpu()]  # (S,) each
    if not capture:
        return answers, None
    layers = {i: torch.cat([step[i] for step in out.hidden_states], dim=1) for i in capture["output_hidden_states"]}
    aux = torch.cat([layers[i] for i in capture_layers], dim=-1)  # (B, W + S - 1, k * d)
    spans = [slice(width - len(ids), width + a.numel() - 1) for ids, a in zip(prompt_ids, answers)]
    return answers, feature_rows(layers[final], aux, spans)


def trim_at_eos(answer: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """`answer` (S,) up to and including its first end-of-sequence token (all of it when there is none)."""
    stops = [i for i, t in enumerate(answer.tolist()) if t in eos_ids]
    return answer[: stops[0] + 1] if stops else answer


def loop_end(answer: list[int], span: int) -> int | None:
    """Length of `answer` up to the end of the first `span`-token run it has already produced (a greedy loop:
    what follows repeats it), or None when no span recurs."""
    seen: set[tuple[int, ...]] = set()
    for end in range(span, len(answer) + 1):
        gram = tuple(answer[end - span : end])
        if gram in seen:
            return end
        seen.add(gram)
    return None


Continue = Callable[[list[list[int]], int], list[torch.Tensor]]  # (contexts, steps) -> greedy pieces (S <= steps,)


def answers_until_loop(
    model, prompts: list[list[int]], max_new_tokens: int, batch_size: int, pad_id: int | None, eos_ids: set[int],
    span: int, segment: int, on_done: Callable[[int], Any] | None = None, continue_batch: Continue | None = None,
) -> list[torch.Tensor]:
    """Greedy answers that end at an end-of-sequence token, at `max_new_tokens`, or where they start repeating a
    `span`-token run of themselves (`loop_end`: a base model's greedy loops; the rest would be copies). They are
    generated `segment` tokens at a time: a finished answer leaves its batch and a waiting prompt (or an
    unfinished answer, prefilled with what it has) takes its place, so no batch idles until its longest row
    ends. Greedy continuation from a prefix is the same greedy answer. `continue_batch` generates the pieces
    instead of `model.generate` (`answer_batch`), e.g. a serving engine given a whole shard as one batch (then
    `pad_id` may be None: the engine pads for itself)."""
    if continue_batch is None:
        if pad_id is None:
            raise ValueError("answers_until_loop pads model.generate's batches: pass pad_id, or continue_batch.")
        continue_batch = lambda contexts, steps: answer_batch(model, contexts, steps, pad_id, eos_ids)[0]  # noqa: E731
    answers = [torch.empty(0, dtype=torch.long) for _ in prompts]
    queue = list(range(len(prompts)))
    while queue:
        batch, queue = queue[:batch_size], queue[batch_size:]
        contexts = [prompts[i] + answers[i].tolist() for i in batch]
        steps = min(segment, max_new_tokens - min(answers[i].numel() for i in batch))
        for i, piece in zip(batch, continue_batch(contexts, steps), strict=True):
            answer = torch.cat([answers[i], piece])[:max_new_tokens]  # (S,)
            end = loop_end(answer.tolist(), span)
            answers[i] = answer[:end] if end is not None else answer
            finished = end is not None or answer.numel() >= max_new_tokens or piece.numel() < steps \
                or bool(piece.numel() and int(piece[-1]) in eos_ids)
            if not finished:
                queue.append(i)
            elif on_done is not None:
                on_done(1)
    return answers


FEATURE_DTYPES = ("float16", "bfloat16")  # how features are stored: float16 unless a target's states exceed it


def feature_rows(hidden: torch.Tensor, aux: torch.Tensor, spans: list[slice],
                 dtype: str = "float16") -> list[tuple[np.ndarray, np.ndarray]]:
    """Per conversation, its positions `spans[row]` of hidden (B, W, d) and aux (B, W, k * d), as arrays in the
    storage `dtype` of `features.py`: "float16", where a value beyond its range is refused rather than stored as
    inf, or "bfloat16" (float32's range: Gemma's residual stream exceeds float16's), kept as its 16 bits (int16,
    numpy has no bfloat16)."""
    if dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature dtype must be one of {FEATURE_DTYPES}, got {dtype!r}.")
    if dtype == "float16":
        limit = torch.finfo(torch.float16).max
        if bool(hidden.abs().max() > limit) or bool(aux.abs().max() > limit):
            raise ValueError("A target hidden state exceeds the float16 range: store these features as bfloat16 "
                             "(`hf-dynaspec features --feature-dtype bfloat16`).")

    def stored(x: torch.Tensor) -> np.ndarray:
        return x.half().cpu().numpy() if dtype == "float16" else x.to(torch.bfloat16).view(torch.int16).cpu().numpy()

    return [(stored(hidden[row, span]), stored(aux[row, span])) for row, span in enumerate(spans)]


def stored_features(array: np.ndarray, dtype: str) -> torch.Tensor:
    """The tensor view of a stored feature array (`feature_rows`): float16 as it is, bfloat16 from its bits."""
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch: input_ids (B, P) and attention_mask (B, P), P the longest prompt."""
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)  # (B, P)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


ShardCallback = Callable[[int, list[CorpusConversation], list, float], None]


def write_answers(
    model, tokenizer, records: Sequence[dict[str, Any]], out_dir: str | os.PathLike, max_new_tokens: int,
    batch_size: int, per_shard: int = 512, max_prompt_tokens: int = 768, progress: bool = True,
    chat_template: bool = True, capture_layers: list[int] | None = None, on_shard: ShardCallback | None = None,
    stop_repeats: int = 0, segment: int = 64, continue_batch: Continue | None = None,
    eos_ids: set[int] | None = None,
) -> dict[str, Any]:
    """Answer every record's `prompt` not yet in `out_dir/index.json` and append compressed shards. Prompts run
    shortest first (little padding); `chat_template=False` encodes them as plain text (base models: the text
    is continued as it is). With `capture_layers`, the target's features are kept as it generates and handed,
    with the shard number and conversations, to `on_shard` before the shard is recorded (e.g.
    `features.CapturedFeatures`: no second pass over the corpus). `stop_repeats=n` ends an answer once it
    repeats an n-token span of itself (`answers_until_loop`); with it, `continue_batch` may generate instead of
    `model` (which may then be None; `eos_ids` must be given). Returns the index."""
    if continue_batch is not None and (not stop_repeats or eos_ids is None):
        raise ValueError("continue_batch generates the segments of stop_repeats answers: set stop_repeats and eos_ids.")
    if stop_repeats and capture_layers is not None:
        raise ValueError("stop_repeats generates in segments and cannot capture features as it goes: leave "
                         "capture_layers unset and recompute the features (`hf-dynaspec features`).")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = read_index(out) or {"version": CORPUS_VERSION, "shards": [], "done": []}
    todo = pending_prompts(tokenizer, records, set(index["done"]), max_prompt_tokens, chat_template)
    order = sorted(todo, key=lambda k: len(todo[k][0]))
    pad_id = None  # an engine (`continue_batch`) pads for itself
    if continue_batch is None:
        pad_id, eos_ids = pad_token_id(tokenizer, model), eos_token_ids(model)
    bar = tqdm(total=len(order), desc="answers", unit="prompt", disable=not progress)
    for lo in range(0, len(order), per_shard):
        keys, rows, t0 = order[lo : lo + per_shard], [], time.perf_counter()
        prompts, answers = [todo[k][0] for k in keys], []
        if stop_repeats:  # the whole shard in one queue: finished answers make room for waiting prompts
            answers = answers_until_loop(model, prompts, max_new_tokens, batch_size, pad_id, eos_ids, stop_repeats,
                                         segment, on_done=bar.update, continue_batch=continue_batch)
        else:
            for start in range(0, len(prompts), batch_size):
                batch = prompts[start : start + batch_size]
                batch_answers, features = answer_batch(model, batch, max_new_tokens, pad_id, eos_ids, capture_layers)
                answers += batch_answers
                rows += features or []
                bar.update(len(batch))
        convs = [CorpusConversation(torch.cat([torch.tensor(ids), a]), len(ids), todo[k][1])
                 for k, ids, a in zip(keys, prompts, answers)]
        seconds = time.perf_counter() - t0
        if on_shard is not None:
            on_shard(len(index["shards"]), convs, rows, seconds)
        _write_shard(out, index, keys, [todo[k][1] for k in keys], convs, seconds)
        bar.set_postfix(tokens=sum(s["num_tokens"] for s in index["shards"]))
    bar.close()
    return index


def pending_prompts(tokenizer, records: Sequence[dict[str, Any]], done: set[str], max_prompt_tokens: int,
                    chat_template: bool) -> dict[str, tuple[list[int], str]]:
    """prompt hash -> (prompt ids, source) of the records not answered yet (prompts over the cap skipped)."""
    todo: dict[str, tuple[list[int], str]] = {}
    for record in records:
        key = prompt_key(record["prompt"])
        if key not in done and key not in todo:
            ids = encode_prompt(tokenizer, record["prompt"], chat_template)[0].tolist()
            if len(ids) <= max_prompt_tokens:
                todo[key] = (ids, record.get("source", ""))
    return todo


def read_index(out: Path) -> dict[str, Any] | None:
    return read_versioned_json(out / INDEX_NAME, "version", CORPUS_VERSION)


def read_versioned_json(path: Path, key: str, version: int) -> dict[str, Any] | None:
    """A folder's JSON index (None when absent); a `key` other than `version` is refused with both named."""
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    if index.get(key) != version:
        raise ValueError(f"{path} has {key} {index.get(key)}, expected {version}: written by another version.")
    return index


def _write_shard(out: Path, index: dict[str, Any], keys: list[str], sources: list[str],
                 convs: list[CorpusConversation], seconds: float) -> None:
    """One compressed shard, then the index (atomically): an interruption loses at most this shard."""
    lengths = np.array([c.input_ids.numel() for c in convs], dtype=np.int64)
    ids = torch.cat([c.input_ids for c in convs]).numpy()
    dtype = np.uint16 if ids.max(initial=0) < 2**16 else np.int32
    name = f"answers_{len(index['shards']):05d}.npz"
    np.savez_compressed(
        out / name, input_ids=ids.astype(dtype), offsets=np.concatenate([[0], lengths.cumsum()]),
        prompt_lengths=np.array([c.prompt_length for c in convs], dtype=np.int64),
        sources=np.array(sources, dtype=str),  # (n,) fixed-width unicode: loads without pickle
    )
    answer_tokens = int(sum(c.input_ids.numel() - c.prompt_length for c in convs))
    per_source: dict[str, int] = {}
    for source, conv in zip(sources, convs):
        per_source[source] = per_source.get(source, 0) + int(conv.input_ids.numel())
    index["shards"].append({
        "file": name, "num_conversations": len(convs), "num_tokens": int(lengths.sum()),
        "answer_tokens": answer_tokens, "seconds": round(seconds, 1),
        "answer_tokens_per_s": round(answer_tokens / max(seconds, 1e-9), 1), "tokens_per_source": per_source,
    })
    index["done"].extend(keys)
    tmp = out / (INDEX_NAME + ".tmp")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, out / INDEX_NAME)


def load_corpus(out_dir: str | os.PathLike) -> list[CorpusConversation]:
    """Every conversation of a corpus folder, in shard order. Shards written before sources were stored give
    their conversations the shard's one source when it has one, else ""."""
    out = Path(out_dir)
    index = read_index(out)
    if index is None:
        raise FileNotFoundError(f"{out / INDEX_NAME} is missing: write the corpus with `write_answers` first.")
    convs = []
    for shard in index["shards"]:
        with np.load(out / shard["file"], allow_pickle=False) as data:
            ids = torch.from_numpy(data["input_ids"].astype(np.int64))
            offsets, prompt_lengths = data["offsets"].tolist(), data["prompt_lengths"].tolist()
            only = list(shard["tokens_per_source"]) if len(shard.get("tokens_per_source", {})) == 1 else [""]
            sources = data["sources"].tolist() if "sources" in data else only * len(prompt_lengths)
        convs += [CorpusConversation(ids[lo:hi], p, src)
                  for lo, hi, p, src in zip(offsets[:-1], offsets[1:], prompt_lengths, sources)]
    return convs
