"""A drafter folder ready to share on the Hub: weights and configs, the target's tokenizer, a model card built
with huggingface_hub's `ModelCard` / `ModelCardData` (validated metadata), and a `custom_generate/` folder so
users who never import hf_dynaspec can run `target.generate(..., custom_generate="<repo or folder>",
trust_remote_code=True)`. The repo id is filled in by `publish_files(folder, repo_id)` right before the
upload that gives the drafter one; until then the card and `custom_generate/` point at the local folder.

    python -c "from hf_dynaspec.sharing import SHARED_PATTERNS; print(SHARED_PATTERNS)"
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from .generation_config import TREE_FIELDS, resolve_draft_settings

TREE_TUNING = "tree_tuning.json"  # the evidence for a drafter's default tree (the recipes' tune_tree.py --write)
# what `hf-dynaspec push` uploads: the drafter's own files, never optimizer state or training checkpoints
SHARED_PATTERNS = (
    "config.json", "generation_config.json", "*.safetensors", "README.md", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "tokenizer.model", "custom_generate/generate.py",
    "custom_generate/requirements.txt", TREE_TUNING,
)
REPO_PLACEHOLDER = "<drafter repo id>"

GENERATE_PY = '''"""custom_generate for a DynaSpec drafter: `target.generate(**inputs, custom_generate=<this repo or folder>,
trust_remote_code=True)` decodes with DynaSpec speculative decoding and this drafter, which is loaded once per
process and device. Greedy output equals plain greedy; sampling keeps the target's distribution."""

DRAFTER = {location!r}
_LOADED = {{}}


def generate(model, *args, assistant_model=None, **kwargs):
    import hf_dynaspec  # noqa: F401  (installs the generate() hook)
    from hf_dynaspec import DynaSpecDrafter

    if assistant_model is None:
        key = (DRAFTER, str(model.device))
        if key not in _LOADED:
            _LOADED[key] = DynaSpecDrafter.from_pretrained(DRAFTER).to(model.device).eval()
        assistant_model = _LOADED[key]
    return model.generate(*args, assistant_model=assistant_model, **kwargs)
'''

def architecture_text(config) -> str:
    """One line on the drafter's architecture, for its model card."""
    if config.drafter_architecture == "eagle3":
        return (f"an EAGLE-3 drafter (the target's hidden states {config.target_layer_ids} fused by `fc`, one "
                "decoder layer over [embedding; feature]; exportable to vLLM / SGLang with `hf-dynaspec export`)")
    return "an EAGLE-1-style drafter (one decoder layer over the target's final hidden states)"


CARD = """---
{{ card_data }}
---

# DynaSpec drafter for {{ base_model }}

Lossless speculative decoding of `{{ base_model }}` in transformers' `generate()`, with
hf-dynaspec: the same tokens as plain greedy decoding, sooner; sampling
keeps the target's distribution. License: {{ license }}.

```python
out = target.generate(**inputs, assistant_model="{{ repo_id }}", max_new_tokens=64)  # after `import hf_dynaspec`
```

<!-- speed:begin -->
{{ speed }}
<!-- speed:end -->

## What it is

{{ architecture_sentence }}, a router over {{ num_clusters }} vocabulary clusters and the cluster table.
It borrows the target's embeddings and LM head, and scores only the tokens of the clusters its router picks.
Target weights it was trained and measured on: {{ target_weights }}.

## Install

hf-dynaspec is installed from its source (`pip install -e .` in a checkout; it is not on PyPI yet).
`import hf_dynaspec` also registers the drafter with `AutoModel` / `AutoModelForCausalLM`.

## Use

```python
import hf_dynaspec
from hf_dynaspec import DynaSpecDrafter
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

target = AutoModelForCausalLM.from_pretrained("{{ base_model }}")
tokenizer = AutoTokenizer.from_pretrained("{{ base_model }}")
drafter = DynaSpecDrafter.from_pretrained("{{ repo_id }}")
inputs = tokenizer("The capital of France is", return_tensors="pt")
out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=64)

# or: pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model="{{ repo_id }}")
# or, without importing hf_dynaspec in your code:
# target.generate(**inputs, custom_generate="{{ repo_id }}", trust_remote_code=True)
```

Default decoding settings (`generation_config.json`; override per call with a `DynaSpecGenerationConfig`):
{{ defaults }}. The draft tree by the target's device (the drafter's `device_trees`, else hf-dynaspec's
defaults for that device): {{ trees }}.
{% for title, text in sections %}
## {{ title }}

{{ text }}
{% endfor %}"""


def card_data(base_model: str, license: str, tags: list[str] | None = None) -> ModelCardData:
    """Validated card metadata: the target as `base_model`, related as an adapter (the drafter runs with the
    target's embeddings and head; it is not a fine-tune of it)."""
    return ModelCardData(
        base_model=base_model, base_model_relation="adapter", library_name="hf-dynaspec", license=license,
        pipeline_tag="text-generation", tags=["speculative-decoding", "dynaspec", "draft-model", *(tags or [])],
    )


LICENSE_NAMES = {"apache-2.0": "Apache-2.0", "gemma": "the Gemma terms of use (https://ai.google.dev/gemma/terms)"}
NOT_MEASURED = "Speed at the shipped defaults: not measured yet (`python benchmarks/headline.py` writes it here)."


def build_card(drafter: Any, target_weights: str, license: str = "apache-2.0",
               sections: list[tuple[str, str]] = (), repo_id: str | None = None,
               speed: str = NOT_MEASURED) -> ModelCard:
    """The model card of `drafter`: its target, the one-line use and `speed` (the generated `speed` block) on the
    first screen; `sections` ((title, markdown), ...) follow the Use section."""
    config = drafter.config
    base_model = config.target_name_or_path or config.target_model_type
    architecture = architecture_text(config)
    fields = drafter.generation_config.speculative_fields()
    defaults = ", ".join(f"`{k}={v!r}`" for k, v in fields.items() if k != "device_trees")
    return ModelCard.from_template(
        card_data(base_model, license), template_str=CARD, base_model=base_model,
        num_clusters=config.num_clusters, architecture_sentence=architecture[:1].upper() + architecture[1:],
        target_weights=target_weights, repo_id=repo_id or REPO_PLACEHOLDER,
        license=LICENSE_NAMES.get(license, license), speed=speed, defaults=defaults, trees=trees_text(drafter), sections=list(sections),
    )


def nested(markdown: str) -> str:
    """`markdown` set under a card section (##): its first title dropped, its other titles one level deeper,
    fenced code left as it is."""
    lines, fenced = [], False
    for i, line in enumerate(markdown.strip().splitlines()):
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            if i == 0:
                continue
            line = "#" + line  # ## -> ###: under the card's own ## section
        lines.append(line)
    return "\n".join(lines).strip()


def step_policy_section(runs: list[Path]) -> tuple[str, str]:
    """("Step policy", markdown): the per-prompt comparison (`benchmarks/step_policy.py`, its
    `step-policy/results.md`) of each bench run in `runs`, the newest first."""
    parts = ["How the default (`step_policy='auto'`: each step verifies only the tree its expected payoff covers, "
             "down to a plain step) compares with the whole configured tree (`step_policy='off'`) and plain "
             "`generate()` per prompt, from `benchmarks/step_policy.py`:"]
    for run in runs:
        report = run / "step-policy" / "results.md"
        if not report.is_file():
            raise FileNotFoundError(f"{report} is missing: run `python benchmarks/step_policy.py --bench {run} --rerun`")
        parts.append(nested(report.read_text()))
    return "Step policy", "\n\n".join(parts)


def trees_text(drafter: Any, device_types: tuple[str, ...] = ("cpu", "cuda")) -> str:
    """"CPU: `num_draft_nodes=12`, ...; CUDA: ...": the tree `generate()` uses on each device type."""
    parts = []
    for device_type in device_types:
        settings = resolve_draft_settings(None, drafter.generation_config, drafter.config, device_type)
        parts.append(f"{device_type.upper()}: " + ", ".join(f"`{k}={getattr(settings, k)!r}`" for k in TREE_FIELDS))
    return "; ".join(parts)


def write_custom_generate(folder: Path, location: str) -> None:
    """`custom_generate/generate.py` (loading the drafter from `location`) and its requirements."""
    target = Path(folder) / "custom_generate"
    target.mkdir(parents=True, exist_ok=True)
    (target / "generate.py").write_text(GENERATE_PY.format(location=location))
    (target / "requirements.txt").write_text("hf-dynaspec\n")


def save_for_sharing(drafter: Any, folder: str | Path, tokenizer: Any = None, target_weights: str = "",
                     sections: list[tuple[str, str]] = (), license: str = "apache-2.0") -> Path:
    """Everything a drafter repo holds, in `folder` (see the module docstring)."""
    folder = Path(folder)
    drafter.save_pretrained(folder, tokenizer=tokenizer)
    card = build_card(drafter, target_weights or "not recorded", license, sections)
    card.save(folder / "README.md")
    write_custom_generate(folder, str(folder.resolve()))
    return folder


def copy_tree_tuning(source: str | Path, folder: str | Path) -> bool:
    """Copy the tuning evidence of a drafter's default tree (`TREE_TUNING`) from a checkpoint folder into the
    shared folder; False when the checkpoint has none."""
    found = Path(source) / TREE_TUNING
    if found.is_file():
        (Path(folder) / TREE_TUNING).write_text(found.read_text())
    return found.is_file()


def publish_files(folder: str | Path, repo_id: str) -> list[str]:
    """Fill `repo_id` into the card, write `custom_generate/` loading from it, and return the files to upload
    (`SHARED_PATTERNS`)."""
    folder = Path(folder)
    card = folder / "README.md"
    if card.is_file():
        card.write_text(card.read_text().replace(REPO_PLACEHOLDER, repo_id))
    write_custom_generate(folder, repo_id)
    return shared_files(folder)


def shared_files(folder: str | Path) -> list[str]:
    """The files of `folder` (relative paths) that match `SHARED_PATTERNS`."""
    folder = Path(folder)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return [f for f in files if any(matches(f, pattern) for pattern in SHARED_PATTERNS)]


def matches(path: str, pattern: str) -> bool:
    """fnmatch within one folder level: "*.safetensors" is a top-level file, never ckpt/step-9/x.safetensors."""
    return path.count("/") == pattern.count("/") and fnmatch.fnmatch(path, pattern)
