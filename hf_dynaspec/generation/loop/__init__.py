"""The decoding loop: `decoding` runs a step's phases over the batch (plan, draft, verify, commit, record), `hook`
routes `generate(assistant_model=<drafter>)` to it, `stats` keeps what a call measured, `syncs` counts host reads."""
