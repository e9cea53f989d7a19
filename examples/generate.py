"""generate() with a DynaSpec drafter: the same text as plain greedy, with speculative statistics.

    python examples/generate.py                  # SmolLM2-135M-Instruct (offline GGUF) and its shipped drafter
    python examples/generate.py --target gemma3   # Gemma 3 270M and its shipped drafter
"""

import torch
from _common import chat_ids, load_models

args, target, tokenizer, drafter = load_models(__doc__)
inputs = chat_ids(tokenizer, "Write a haiku about the sea.")
plain = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
out = target.generate(
    **inputs, assistant_model=drafter, max_new_tokens=args.max_new_tokens, do_sample=False,
    return_dict_in_generate=True,
)
print(tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
print("identical to plain greedy:", torch.equal(plain, out.sequences))
print(out.speculative_stats.summary())
