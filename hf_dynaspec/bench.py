"""Spec-Bench style evaluation: every method on the same prompts, greedy, batch 1, in one process.

For each prompt (chat template applied, or a base model's `--prompt-format`) and each method it records wall
time, new tokens, and for the speculative methods the mean accepted length, mean shortlist size and recall, draft / verify time, and whether
the output equals plain greedy (any mismatch is reported loudly). Results aggregate per category and overall:
tokens/s, speedup over plain generate (ratio of summed times) and over the full-vocabulary / static-shortlist
drafters, mean accepted length (tokens per target step), acceptance recovery vs the full-vocabulary head.
Records are appended to `records.jsonl` as they come: a stopped run resumes where it stopped, and only with the
same models and settings (`run.json` beside the records).

    hf-dynaspec bench --target tiny --drafter /tmp/tiny-drafter --limit 2 --max-new-tokens 16
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .bench_prompts import round_robin
from .evaluation import load as load_evaluation
from .generation.loop.stats import SpeculativeStats
from .generation_config import DynaSpecGenerationConfig, split_implementation
from .machine import machine_description
from .targets import encode_formatted

# transformers' own speculative options that need no extra model: plain generate() keyword arguments
HF_METHODS = {
    "prompt-lookup": dict(prompt_lookup_num_tokens=10),
    "early-exit": dict(assistant_early_exit=None),  # filled in: 1/6 of the target's layers
}
METHODS = {
    "plain": None,
    **{name: None for name in HF_METHODS},
    "defaults": {},  # the drafter's shipped settings, nothing overridden
    "dynaspec": dict(head_mode="dynamic"),
    "dynaspec-dyspec": dict(head_mode="dynamic", tree_policy="dyspec"),
    "full": dict(head_mode="full"),
    "full-chain": dict(head_mode="full", tree_policy="chain"),
    "static": dict(head_mode="static"),
    "context": dict(head_mode="context"),
    "union": dict(head_mode="union"),
}
@dataclass
class Record:
    method: str
    category: str
    question_id: str
    seconds: float
    new_tokens: int
    matches_plain: bool = True
    stats: dict | None = None  # SpeculativeStats.to_dict() of a speculative method (None: plain / transformers')
    output_ids: list[int] | None = None  # plain's new tokens (every exact method's): analyses reread, not regenerate
    machine: str | None = None  # `machine_description()` of the process that ran it (None: records predating it)


@dataclass
class Summary:
    method: str
    category: str
    tokens_per_s: float
    speedup: float
    mean_accepted_length: float
    mean_shortlist_size: float
    shortlist_recall: float | None
    draft_share: float
    router_share: float
    head_share: float
    verify_share: float
    extend_share: float | None  # None: the records predate the timing of the drafter's extend
    mismatches: int
    prompts: int
    extra: dict = field(default_factory=dict)


def write_doc_block(path: str | Path, name: str, text: str) -> None:
    """Put generated `text` between `<!-- name:begin -->` and `<!-- name:end -->` in a markdown file (appended
    when the markers are absent, into a new file when there is none): docs quote measured figures only through
    such blocks."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text}\n{end}"
    doc = path.read_text() if path.is_file() else ""
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    path.write_text(pattern.sub(lambda _: block, doc) if pattern.search(doc) else doc + "\n" + block + "\n")


def parse_methods(text: str) -> list[str]:
    """Split "plain,dynaspec[num_draft_nodes=8,draft_depth=4],full" on the commas outside brackets."""
    return [m.strip() for m in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text) if m.strip()]


def method_settings(method: str) -> dict | None:
    """Speculative settings of a method name; "dynaspec[num_draft_nodes=8,draft_depth=4]" varies a base
    method's settings (integers or names), for tuning trees on the same prompts."""
    base, _, params = method.partition("[")
    if base not in METHODS:
        raise ValueError(f"unknown method {base!r}; choose from {list(METHODS)}")
    settings = METHODS[base]
    if not params:
        return settings
    if settings is None:
        raise ValueError(f"{base!r} takes no speculative settings")
    extra = {}
    for item in params.rstrip("]").split(","):
        key, _, value = item.partition("=")
        extra[key.strip()] = parse_value(value.strip())
    return split_implementation({**settings, **extra})  # "verify_head=rows" is an implementation setting


def parse_value(text: str) -> bool | int | float | str:
    """"8" -> 8, "0.3" -> 0.3, "true" -> True, "dyspec" -> "dyspec"."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@torch.no_grad()
def run_method(target, drafter, method: str, input_ids: torch.Tensor, max_new_tokens: int):
    """(sequences, seconds, stats or None) of one method on one prompt."""
    settings = method_settings(method)
    start = time.perf_counter()
    if settings is None:
        extra = dict(HF_METHODS.get(method, {}))
        if "assistant_early_exit" in extra:
            extra["assistant_early_exit"] = max(1, target.config.get_text_config().num_hidden_layers // 6)
        out = target.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False, **extra)
        return out, time.perf_counter() - start, None
    config = DynaSpecGenerationConfig(**settings, max_new_tokens=max_new_tokens, do_sample=False,
                                      return_dict_in_generate=True)
    out = target.generate(input_ids, generation_config=config, assistant_model=drafter)
    return out.sequences, time.perf_counter() - start, out.speculative_stats


RUN_NAME = "run.json"  # beside records.jsonl: what its records were measured with


def run_identity(target, drafter, max_new_tokens: int, prompt_format: str) -> dict:
    """What every record of one results folder shares: the target (name, dtype), the drafter (a digest of its
    weights), the token budget and the prompt format. (The drafter's default tree may change between resumes:
    `tune_tree.py --write` stores one after measuring with explicit trees.)"""
    digest = hashlib.sha256()
    for name, tensor in sorted(drafter.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return {"target": target.config._name_or_path, "target_dtype": str(target.dtype),
            "drafter_weights_sha256": digest.hexdigest()[:16],
            "max_new_tokens": max_new_tokens, "prompt_format": prompt_format}


def check_resumable(records_path: Path, identity: dict) -> None:
    """Refuse to add records to a folder measured with other models or settings (its `RUN_NAME`); a folder
    without one takes this run's."""
    run_path = records_path.with_name(RUN_NAME)
    if run_path.is_file():
        before = json.loads(run_path.read_text())
        changed = {k: (before.get(k), v) for k, v in identity.items() if before.get(k) != v}
        if changed and records_path.is_file():
            detail = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ValueError(
                f"{records_path} holds records measured otherwise ({detail}): resuming would mix them. Write to "
                "another --out, or --restart to measure anew."
            )
    run_path.parent.mkdir(parents=True, exist_ok=True)
    run_path.write_text(json.dumps(identity, indent=1) + "\n")


def run_bench(
    target, tokenizer, drafter, prompts: list[dict], methods: Iterable[str], max_new_tokens: int,
    warmup: int = 1, records_path: str | Path | None = None, repeats: int = 1, prompt_format: str = "chat",
) -> list[Record]:
    """Every method on every prompt, timed `repeats` times (the median counts), each prompt encoded in
    `prompt_format` (`targets.PROMPT_FORMATS`: "chat" for instruction models, "qa" / "plain" for base models).
    With `records_path` (JSONL), records are appended as they come and the prompts already there (all methods
    done) are skipped: a stopped run resumes. Prompts run one category at a time in turn (`round_robin`), so a
    run stopped part-way covers every category."""
    methods = list(methods)
    for method in methods:
        method_settings(method)  # fail fast on a bad name
    if "plain" not in methods:
        methods.insert(0, "plain")
    if records_path is not None:
        check_resumable(Path(records_path), run_identity(target, drafter, max_new_tokens, prompt_format))
    records, done = load_records(records_path, methods)
    todo = round_robin([row for row in prompts if row["question_id"] not in done])
    for row in todo[:warmup]:  # warm-up: first calls pay allocation and dispatch costs
        for method in methods:
            run_method(target, drafter, method, encode_formatted(tokenizer, row["prompt"], prompt_format), 8)
    machine = machine_description()
    for row in tqdm(todo, desc="bench", unit="prompt", initial=len(prompts) - len(todo), total=len(prompts)):
        rows = bench_prompt(target, tokenizer, drafter, row, methods, max_new_tokens, repeats, prompt_format, machine)
        records += rows
        if records_path is not None:
            with open(records_path, "a") as file:
                file.writelines(json.dumps(asdict(r)) + "\n" for r in rows)
    return records


def read_records(path: str | Path) -> list[Record]:
    """The records of a records.jsonl, the latest of each (prompt, method) only: a prompt runs again whole when
    methods were added to a run (outputs are checked against plain's of the same run), and its new records replace
    the earlier ones."""
    lines = [Record(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
    return list({(rec.question_id, rec.method): rec for rec in lines}.values())  # a later record wins


def load_records(path: str | Path | None, methods: list[str]) -> tuple[list[Record], set[str]]:
    """Records of an earlier run of the same methods (`read_records`), and the question ids it finished."""
    if path is None or not Path(path).is_file():
        return [], set()
    records = read_records(path)
    by_prompt: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        by_prompt[rec.question_id].add(rec.method)
    done = {qid for qid, got in by_prompt.items() if got >= set(methods)}
    return [r for r in records if r.question_id in done and r.method in methods], done


def bench_prompt(
    target, tokenizer, drafter, row: dict, methods: list[str], max_new_tokens: int, repeats: int = 1,
    prompt_format: str = "chat", machine: str | None = None,
) -> list[Record]:
    """One prompt through every method ("plain" first), each output checked against plain greedy; the
    median of `repeats` timings counts (outputs and stats of greedy runs are the same every time). `machine`
    is stored in each record: a run resumed in another session may be on another machine."""
    input_ids = encode_formatted(tokenizer, row["prompt"], prompt_format)
    plain, out = None, []
    for method in methods:
        timings = [run_method(target, drafter, method, input_ids, max_new_tokens) for _ in range(max(1, repeats))]
        seq, _, stats = timings[-1]
        seconds = statistics.median(t[1] for t in timings)
        plain = seq if method == "plain" else plain
        rec = Record(method, row["category"], row["question_id"], seconds, seq.shape[1] - input_ids.shape[1],
                     matches_plain=bool(torch.equal(seq, plain)), stats=None if stats is None else stats.to_dict(),
                     output_ids=seq[0, input_ids.shape[1]:].tolist() if method == "plain" else None,
                     machine=machine)
        if not rec.matches_plain:
            tqdm.write(f"MISMATCH: {method} differs from plain greedy on {row['question_id']}")
        out.append(rec)
    return out


def summarize(records: list[Record]) -> list[Summary]:
    """Per (method, category) and per (method, "overall") summaries."""
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for rec in records:
        groups[(rec.method, rec.category)].append(rec)
        groups[(rec.method, "overall")].append(rec)
    plain_time = {cat: sum(r.seconds for r in recs) for (m, cat), recs in groups.items() if m == "plain"}
    out = []
    for (method, category), recs in groups.items():
        seconds = max(sum(r.seconds for r in recs), 1e-9)
        measured = [SpeculativeStats.from_dict(r.stats) for r in recs if r.stats is not None]
        stats = SpeculativeStats.merged(measured)
        out.append(Summary(
            method=method, category=category,
            tokens_per_s=sum(r.new_tokens for r in recs) / seconds,
            speedup=plain_time.get(category, seconds) / seconds,
            mean_accepted_length=stats.mean_accepted_length if stats.steps else 1.0,
            mean_shortlist_size=stats.mean_shortlist_size,
            shortlist_recall=stats.shortlist_recall if stats.recall_checks else None,
            draft_share=stats.time("draft") / seconds,
            router_share=stats.time("router") / seconds,
            head_share=stats.time("head") / seconds,
            verify_share=stats.time("verify") / seconds,
            extend_share=stats.time("extend") / seconds if "extend" in stats.seconds else None,
            mismatches=sum(not r.matches_plain for r in recs),
            prompts=len(recs),
            extra={"lookup_share": stats.lookup_share} | host_read_figures(stats),
        ))
    compare_heads(out)
    add_significance(out, groups)
    return sorted(out, key=lambda s: (s.category != "overall", s.category, s.method))


SIGNIFICANCE = 0.05  # a speedup counts as significant when Wilcoxon's p is below this


def paired_speedup(method: list[Record], baseline: list[Record], module) -> dict | None:
    """Speedup of `method` over `baseline` on the prompts both ran (paired by question id), its bootstrap
    95% interval and Wilcoxon p-value (the local `paired_speedup` evaluate module); None without 2 pairs."""
    base = {r.question_id: r.seconds for r in baseline}
    pairs = [(r.seconds, base[r.question_id]) for r in method if r.question_id in base]
    if len(pairs) < 2:
        return None
    mine, theirs = zip(*pairs)
    return module.compute(predictions1=list(mine), predictions2=list(theirs))


def add_significance(summaries: list[Summary], groups: dict[tuple[str, str], list[Record]]) -> None:
    """In `extra`: `speedup_ci` / `p_vs_plain` against plain generate(), and for drafter methods
    `speedup_vs_full_ci` / `p_vs_full` and `speedup_vs_static_ci` / `p_vs_static` against their head twins."""
    module = load_evaluation("paired_speedup")
    by_key = counterparts(summaries)
    for s in summaries:
        recs = groups[(s.method, s.category)]
        baselines = {"plain": groups.get(("plain", s.category))} if s.method != "plain" else {}
        if head_key(s.method, s.category) is not None:
            for twin in ("full", "static"):
                other = by_key.get(head_key(s.method, s.category, twin))
                if other is not None and other.method != s.method:
                    baselines[twin] = groups[(other.method, s.category)]
        for name, baseline in baselines.items():
            result = paired_speedup(recs, baseline or [], module)
            if result is None:
                continue
            suffix = "" if name == "plain" else f"_vs_{name}"
            s.extra[f"speedup{suffix}_ci"] = result["ci"]
            s.extra[f"p_vs_{name}"] = result["p_value"]


def significance_mark(summary: Summary, against: str) -> str:
    """"*" when the speedup against `against` is significant (Wilcoxon p < SIGNIFICANCE), else ""."""
    p = summary.extra.get(f"p_vs_{against}")
    return "*" if p is not None and p < SIGNIFICANCE else ""


def head_key(method: str, category: str, head_mode: str | None = None) -> tuple | None:
    """(category, settings with `head_mode` replaced): methods differing only in their head share a key."""
    settings = method_settings(method)
    if settings is None or "head_mode" not in settings:  # plain, transformers' methods, the drafter's defaults
        return None
    frozen = {k: tuple(sorted(v.items())) if isinstance(v, dict) else v for k, v in settings.items()}
    return category, tuple(sorted({**frozen, "head_mode": head_mode or settings["head_mode"]}.items()))


def counterparts(summaries: list[Summary]) -> dict[tuple, Summary]:
    """Summaries by `head_key`, to find a drafter method's full-head and static-head twins."""
    return {key: s for s in summaries if (key := head_key(s.method, s.category)) is not None}


def compare_heads(summaries: list[Summary]) -> None:
    """Each drafter method against the same drafter and tree with the full-vocabulary head and with the
    static shortlist (the methods whose settings differ only in `head_mode`): `speedup_vs_full`,
    `recovery_vs_full` (accepted length ratio) and `speedup_vs_static`, in `extra`. Methods without that
    counterpart in the run get no entry."""
    by_key = counterparts(summaries)
    for s in summaries:
        if head_key(s.method, s.category) is None:
            continue
        full = by_key.get(head_key(s.method, s.category, "full"))
        static = by_key.get(head_key(s.method, s.category, "static"))
        if full is not None:
            s.extra["recovery_vs_full"] = s.mean_accepted_length / full.mean_accepted_length
            s.extra["speedup_vs_full"] = s.tokens_per_s / full.tokens_per_s
        if static is not None:
            s.extra["speedup_vs_static"] = s.tokens_per_s / static.tokens_per_s


def headline_table(summaries: list[Summary], method: str) -> str:
    """Per category: `method` against plain generate() and against its full-head and static-head twins
    (empty when the run lacks them). Speedups carry their bootstrap 95% interval; "*" marks a significant
    difference (Wilcoxon signed-rank over prompts, p < SIGNIFICANCE)."""
    by_key, by_name = counterparts(summaries), {(s.method, s.category): s for s in summaries}
    rows = ["| category | plain tok/s | speedup | vs full head | vs static | accepted: this / full / static | "
            "recovery vs full | shortlist (recall) | from lookup | mismatches (all methods) |", "|" + "---|" * 10]
    categories = sorted({s.category for s in summaries}, key=lambda c: (c == "overall", c))
    for category in categories:
        s, plain = by_name.get((method, category)), by_name.get(("plain", category))
        full = by_key.get(head_key(method, category, "full"))
        static = by_key.get(head_key(method, category, "static"))
        if s is None or plain is None or full is None or static is None:
            return ""
        mismatches = sum(x.mismatches for x in summaries if x.category == category)
        name = f"**{category}**" if category == "overall" else category
        rows.append(
            f"| {name} | {plain.tokens_per_s:.1f} | {speedup_cell(s, 'plain')} | {speedup_cell(s, 'full')} | "
            f"{speedup_cell(s, 'static')} | {s.mean_accepted_length:.2f} / {full.mean_accepted_length:.2f} / "
            f"{static.mean_accepted_length:.2f} | {s.extra['recovery_vs_full']:.1%} | {s.mean_shortlist_size:,.0f} "
            f"({s.shortlist_recall or 0:.1%}) | {s.extra.get('lookup_share', 0):.0%} | {mismatches} |"
        )
    return "\n".join(rows)


def speedup_cell(summary: Summary, against: str) -> str:
    """"1.24x* (1.20-1.28)": the speedup against plain / the full / the static twin, its 95% interval (when
    computed) and the significance mark."""
    suffix = "" if against == "plain" else f"_vs_{against}"
    value = summary.speedup if against == "plain" else summary.extra[f"speedup{suffix}"]
    ci = summary.extra.get(f"speedup{suffix}_ci")
    interval = f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
    return f"{value:.2f}x{significance_mark(summary, against)}{interval}"


def markdown_table(summaries: list[Summary]) -> str:
    head = ("| category | method | tok/s | speedup | vs full | vs static | accepted length | recovery vs full | "
            "shortlist | recall | draft % (router, head) | extend % | verify % | mismatches |")
    rows = [head, "|" + "---|" * 14]

    def fmt(value: float | None, spec: str) -> str:
        return "" if value is None else format(value, spec)

    for s in summaries:
        x = s.extra
        rows.append(
            f"| {s.category} | {s.method} | {s.tokens_per_s:.1f} | {s.speedup:.2f}x | "
            f"{fmt(x.get('speedup_vs_full'), '.2f')} | {fmt(x.get('speedup_vs_static'), '.2f')} | "
            f"{s.mean_accepted_length:.2f}{lookup_note(s)} | {fmt(x.get('recovery_vs_full'), '.1%')} | {s.mean_shortlist_size:.0f} | "
            f"{fmt(s.shortlist_recall, '.1%')} | {s.draft_share:.0%} ({s.router_share:.1%}, {s.head_share:.0%}) | "
            f"{fmt(s.extend_share, '.0%')} | {s.verify_share:.0%} | {s.mismatches} |"
        )
    return "\n".join(rows)


def host_read_figures(stats: SpeculativeStats) -> dict[str, float]:
    """Host reads per decoding step, ours and the target forward's, where the runs counted them
    (`count_host_reads=true`); {} otherwise."""
    if not stats.host_reads and not stats.target_host_reads:
        return {}
    return {"host_reads_per_step": stats.host_reads_per_step,
            "target_host_reads_per_step": stats.target_host_reads / max(1, stats.steps)}


def host_reads_table(summaries: list[Summary]) -> str:
    """The overall host reads per step of the methods that counted them ("" when none did)."""
    counted = [s for s in summaries if s.category == "overall" and "host_reads_per_step" in s.extra]
    if not counted:
        return ""
    rows = ["| method | host reads per step (ours) | in the target's forward | accepted length |", "|---|---|---|---|"]
    rows += [f"| {s.method} | {s.extra['host_reads_per_step']:.1f} | {s.extra['target_host_reads_per_step']:.1f} | "
             f"{s.mean_accepted_length:.2f} |" for s in counted]
    return "\n## Host reads (methods run with count_host_reads=true; their timings include the counting)\n\n" + \
        "\n".join(rows) + "\n"


def lookup_note(summary: Summary) -> str:
    """" (12% lookup)": the share of emitted tokens that were lookup-branch drafts, when there were any."""
    share = summary.extra.get("lookup_share", 0.0)
    return f" ({share:.0%} lookup)" if share > 0 else ""


def machine_counts(records: list[Record]) -> dict[str, int]:
    """{machine: prompts measured there}, from the records ("not recorded" for records predating the field).
    A run resumed across sessions may span machines: each prompt's methods still ran in one process, so the
    speedups stay paired per prompt, while pooled tokens/s mix the machines' speeds."""
    prompts: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        prompts[rec.machine or "not recorded"].add(rec.question_id)
    return {machine: len(ids) for machine, ids in sorted(prompts.items(), key=lambda kv: -len(kv[1]))}


def meta_value(value) -> str:
    """A meta entry as results.md shows it: {name: count} (the "machines") as "name (count prompts); ..."."""
    if isinstance(value, dict):
        return "; ".join(f"{name} ({count} prompts)" for name, count in value.items())
    return str(value)


def write_results(records: list[Record], out_dir: str | Path, meta: dict) -> list[Summary]:
    """results.json / results.md of `records`; `meta` gains the records' `machine_counts` ("machines")."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = meta | {"machines": machine_counts(records)}
    summaries = summarize(records)
    payload = {"meta": meta, "summaries": [asdict(s) for s in summaries], "records": [asdict(r) for r in records]}
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    header = "\n".join(f"- {key}: {meta_value(value)}" for key, value in meta.items())
    headlines = [
        f"## {method} per category\n\n{table}\n"
        for method in dict.fromkeys(s.method for s in summaries)
        if (method_settings(method) or {}).get("head_mode") == "dynamic"
        and (table := headline_table(summaries, method))
    ]
    (out / "results.md").write_text(f"{header}\n\n{''.join(headlines)}\n## All methods\n\n{markdown_table(summaries)}\n"
                                    f"{host_reads_table(summaries)}")
    return summaries


def earlier_meta(out_dir: str | Path) -> dict:
    """The meta of the run's results.json, {} before its first one."""
    path = Path(out_dir) / "results.json"
    return json.loads(path.read_text())["meta"] if path.is_file() else {}


def rewrite_results(out_dir: str | Path) -> list[Summary]:
    """Summaries, tables and plots of a finished run rebuilt from its records.jsonl (and the meta of its
    results.json): no generation."""
    out = Path(out_dir)
    records = read_records(out / "records.jsonl")
    meta = earlier_meta(out)
    meta["prompts"] = len({r.question_id for r in records})  # the records are the truth (a run may have grown)
    summaries = write_results(records, out, meta)
    plot_results(summaries, out)
    return summaries


def plot_results(summaries: list[Summary], out_dir: str | Path) -> list[Path]:
    """speedup.png and accepted_length.png per category and method; shortlist_vs_acceptance.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    categories = sorted({s.category for s in summaries}, key=lambda c: (c == "overall", c))
    methods = list(dict.fromkeys(s.method for s in summaries))
    by_key = {(s.method, s.category): s for s in summaries}
    paths = []
    for field_name, label in (("speedup", "speedup over plain generate()"), ("mean_accepted_length", "tokens per target step")):
        fig, ax = plt.subplots(figsize=(max(8, len(categories) * 0.9), 4))
        width = 0.8 / max(1, len(methods))
        for i, method in enumerate(methods):
            values = [getattr(by_key[(method, c)], field_name) if (method, c) in by_key else 0 for c in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=method)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))], categories, rotation=45, ha="right")
        ax.set_ylabel(label)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside, right
        fig.tight_layout()
        path = out / f"{'speedup' if field_name == 'speedup' else 'accepted_length'}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    fig, ax = plt.subplots(figsize=(5, 4))
    for s in summaries:
        if s.category != "overall" and s.mean_shortlist_size > 0:
            ax.scatter(s.mean_shortlist_size, s.mean_accepted_length, label=s.method, s=12)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    ax.set_xscale("log")
    ax.set_xlabel("mean shortlist size (tokens)")
    ax.set_ylabel("mean accepted length")
    path = out / "shortlist_vs_acceptance.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths + [path]
