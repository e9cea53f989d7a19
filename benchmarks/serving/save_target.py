"""Save a target the way vLLM loads it: a Hugging Face folder (safetensors + tokenizer), dequantised from the
offline GGUF packages (`hf_dynaspec.targets.load_target`). Runs in the main environment.

    python benchmarks/serving/save_target.py smollm2 /tmp/serving/smollm2
"""

from __future__ import annotations

import sys
from pathlib import Path

from hf_dynaspec.targets import load_target


def main() -> None:
    name, out = sys.argv[1], Path(sys.argv[2])
    if (out / "config.json").is_file():
        return
    model, tokenizer = load_target(name)
    model.hf_quantizer = None  # the weights are dequantised: save plain tensors
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"saved {name} to {out}")


if __name__ == "__main__":
    main()
