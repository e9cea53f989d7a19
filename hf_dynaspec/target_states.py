"""The target hidden states a drafter reads: which ones a target forward must return, and how they are joined.

A drafter reads some of the target's `output_hidden_states` (EAGLE-3: a low, a middle and a high layer; EAGLE-1:
the final normed state) concatenated on the last axis. Drafting, verification, feature extraction for training
and the drafter itself all read them through these two functions.

    python -c "import torch; from hf_dynaspec.target_states import select_hidden_states as s; print(s((torch.ones(1, 2, 3),) * 3, [0, 2]).shape)"
"""

from __future__ import annotations

import torch


def select_hidden_states(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """The target hidden states `layer_ids` (indices into its `output_hidden_states` tuple) concatenated on the
    last axis: (B, T, d) each -> (B, T, len(layer_ids) * d)."""
    if not hidden_states or len(hidden_states) <= max(layer_ids) or len(hidden_states) < -min(layer_ids):
        raise ValueError(
            f"The drafter reads the target's hidden states {layer_ids}, but the target returned "
            f"{len(hidden_states or ())}: run it with output_hidden_states=True, and use the drafter's own target."
        )
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)


def hidden_state_request(config, feature_layers: list[int] | tuple[int, ...]) -> list[int]:
    """`output_hidden_states` for a target forward that keeps only what decoding reads: the drafter's feature
    layers and the final normed state (index num_hidden_layers), as non-negative indices (transformers keeps
    None at the other positions of the tuple, so `select_hidden_states` indexes it as usual)."""
    final = config.get_text_config().num_hidden_layers
    return sorted({final} | {i if i >= 0 else final + 1 + i for i in feature_layers})
