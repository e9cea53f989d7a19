"""Sampling: temperature / top-p apply to the target; rejection sampling keeps its distribution exactly.

    python examples/sampling.py                  # SmolLM2-135M-Instruct (offline GGUF) and its shipped drafter
    python examples/sampling.py --target gemma3   # Gemma 3 270M and its shipped drafter
"""

import torch
from _common import chat_ids, load_models

args, target, tokenizer, drafter = load_models(__doc__)
inputs = chat_ids(tokenizer, "Give me a name for a cat.")
for seed in range(3):
    torch.manual_seed(seed)
    out = target.generate(**inputs, assistant_model=drafter, do_sample=True, temperature=0.8, top_p=0.95,
                          max_new_tokens=args.max_new_tokens, return_dict_in_generate=True)
    text = tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    print(f"[seed {seed}] {text!r} (mean accepted length {out.speculative_stats.mean_accepted_length:.2f})")
