"""Template for a drafter repo's `custom_generate/generate.py`.

With it in the drafter's Hub repo, users who never imported hf_dynaspec can run
`target.generate(**inputs, custom_generate="<drafter repo id>", trust_remote_code=True)`: transformers calls
`generate(model, ...)` below with every generate() argument. Set DRAFTER_REPO to the repo's id.
"""

DRAFTER_REPO = "{repo_id}"


def generate(model, *args, assistant_model=None, **kwargs):
    import hf_dynaspec  # noqa: F401  (installs the generate() hook)
    from hf_dynaspec import DynaSpecDrafter

    if assistant_model is None:
        assistant_model = DynaSpecDrafter.from_pretrained(DRAFTER_REPO).to(model.device)
    kwargs.pop("custom_generate", None)
    kwargs.pop("trust_remote_code", None)
    return model.generate(*args, assistant_model=assistant_model, **kwargs)
