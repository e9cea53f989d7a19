"""Gemma 3 as an EAGLE-3 target in vLLM 0.32 (imported by vLLM only). vLLM's own Gemma3ForCausalLM returns no
intermediate hidden states, so any EAGLE-3 draft on it fails at load ("Model does not support EAGLE3 interface but
aux_hidden_state_outputs was requested"). This subclass captures them as vLLM's Llama does (`EagleModelMixin`:
the residual stream entering layer i, `hidden + residual`, i.e. transformers' `output_hidden_states[i]`), and the
plugin registers it under vLLM's own name; without a draft model nothing is captured and it runs as before.
Single process only (no pipeline parallelism).
"""

from __future__ import annotations

from itertools import islice

import torch
from vllm.distributed import get_pp_group
from vllm.model_executor.models import gemma3
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM, Gemma3Model
from vllm.model_executor.models.interfaces import EagleModelMixin, SupportsEagle3


class Gemma3ModelEagle3(Gemma3Model, EagleModelMixin):
    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs):
        if get_pp_group().world_size > 1:
            raise ValueError("The DynaSpec plugin's Gemma 3 captures hidden states on one pipeline stage: run vLLM "
                             "with pipeline_parallel_size=1.")
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        aux: list[torch.Tensor] = []
        self._maybe_add_hidden_state(aux, self.start_layer, hidden, residual)
        for index, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            hidden, residual = layer(positions, hidden, residual, **kwargs)
            self._maybe_add_hidden_state(aux, index + 1, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return (hidden, aux) if aux else hidden


class Gemma3ForCausalLMEagle3(Gemma3ForCausalLM, SupportsEagle3):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        # vLLM's __init__ builds `gemma3.Gemma3Model` (and ties the head to its embeddings): have it build the
        # capturing subclass instead; a second model would register its attention layers twice
        original = gemma3.Gemma3Model
        gemma3.Gemma3Model = Gemma3ModelEagle3
        try:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        finally:
            gemma3.Gemma3Model = original
