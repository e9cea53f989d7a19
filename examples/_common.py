"""Shared argument parsing for the examples: a target and its drafter (the one shipped for it in drafters/)."""

from __future__ import annotations

import argparse

import hf_dynaspec  # noqa: F401  (installs the generate() hook)
from hf_dynaspec import DynaSpecDrafter
from hf_dynaspec.targets import SHIPPED_DRAFTERS, load_target


def load_models(description: str):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--target", default="smollm2",
                        help="'smollm2' or 'gemma3' (offline GGUFs, with their shipped drafters), 'tiny', or a Hub id")
    parser.add_argument("--drafter", default=None,
                        help="drafter folder / Hub id (default: the one shipped for --target; 'tiny': a fresh one)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target)
    drafter_path = args.drafter or SHIPPED_DRAFTERS.get(args.target)
    if drafter_path is not None:
        drafter = DynaSpecDrafter.from_pretrained(drafter_path).bind(target)
    else:
        print(f"no drafter ships for {args.target!r}: using a fresh, untrained one (exact output, few accepted drafts)")
        drafter = DynaSpecDrafter.from_target(target, num_clusters=32)
    return args, target, tokenizer, drafter.eval()


def chat_ids(tokenizer, prompt: str):
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    return tokenizer(prompt, return_tensors="pt")
