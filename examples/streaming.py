"""Streaming: a TextStreamer prints accepted tokens as each tree is verified.

    python examples/streaming.py                  # SmolLM2-135M-Instruct (offline GGUF) and its shipped drafter
    python examples/streaming.py --target gemma3   # Gemma 3 270M and its shipped drafter
"""

from _common import chat_ids, load_models
from transformers import TextStreamer

args, target, tokenizer, drafter = load_models(__doc__)
inputs = chat_ids(tokenizer, "Tell me a short story about a robot.")
streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
target.generate(**inputs, assistant_model=drafter, max_new_tokens=args.max_new_tokens, streamer=streamer)
