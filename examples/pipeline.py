"""pipeline("text-generation", assistant_model=drafter): nothing else changes.

    python examples/pipeline.py                  # SmolLM2-135M-Instruct (offline GGUF) and its shipped drafter
    python examples/pipeline.py --target gemma3   # Gemma 3 270M and its shipped drafter
"""

from _common import load_models
from transformers import pipeline

args, target, tokenizer, drafter = load_models(__doc__)
generator = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
messages = [{"role": "user", "content": "Name three prime numbers."}] if tokenizer.chat_template else "Primes:"
print(generator(messages, max_new_tokens=args.max_new_tokens, do_sample=False)[0]["generated_text"])
