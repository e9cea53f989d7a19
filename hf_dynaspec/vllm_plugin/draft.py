"""DynaSpecEagle3: vLLM's EAGLE-3 Llama draft model with DynaSpec's shortlisted head in place of its draft
vocabulary (imported by vLLM only; needs vLLM 0.32, see docs/vllm-plugin.md for the contract it meets).

vLLM's proposer calls `combine_hidden_states` once per proposal, then for each of the K chained drafts `forward`
and `compute_logits` (or `get_top_tokens` on its greedy path) on one row per request, and reads
full-vocabulary logits. Here:
- `forward` also returns, beside each row's output, the router's input [input_layernorm(embed);
  hidden_norm(feature)] (2d wide, appended to the first output: the proposer only indexes that output and hands
  its rows to `compute_logits`; the output fed to the next step keeps its width d);
- `compute_logits` runs the router on those rows, keeps each row's top-k_c(t) clusters (k0 -> k1 over the K
  drafts, t counted from `combine_hidden_states`) and scores their tokens with the target's own LM head (vLLM
  shares it with a draft that has none): (rows, V) logits, -inf outside each row's shortlist; with the export's
  `max_union_tokens`, the union of the rows' clusters (one GEMM) holds at most that many tokens;
- `get_top_tokens` returns the shortlist's argmax as target ids without building the (rows, V) tensor.
On a CPU the clusters' rows are scored by vLLM's own prepacked oneDNN matmul (`onednn.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

from ..configuration import cluster_budget
from ..head import HeadOutput
from ..vllm_export import CLUSTERS, ROUTER, head_from_tensors
from .onednn import use_onednn


class DynaSpecEagle3(Eagle3LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        settings = getattr(self.config, "dynaspec", None)
        if not settings or "num_clusters" not in settings:
            raise ValueError("This draft folder has no DynaSpec head settings: export it with `hf-dynaspec export "
                             "DRAFTER OUT --format vllm-dynaspec`.")
        self.dynaspec = settings
        self.num_drafts = vllm_config.speculative_config.num_speculative_tokens
        self._tensors: dict[str, torch.Tensor] = {}  # router and cluster tensors, kept by load_weights
        self._shortlist = None  # (head, router), built on first use: vLLM shares the target's LM head after loading
        self._depth = 0

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        """The router and cluster tensors are the head's; the rest loads as vLLM's EAGLE-3 layer."""

        def layer_weights():
            for name, tensor in weights:
                if name in ROUTER or name in CLUSTERS:
                    self._tensors[name] = tensor.clone()
                else:
                    yield name, tensor

        loaded = super().load_weights(layer_weights())
        missing = sorted((set(ROUTER) | set(CLUSTERS)) - set(self._tensors))
        if missing:
            raise ValueError(f"The draft folder lacks the DynaSpec head's tensors {missing}.")
        return loaded

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        output, fed_back = super().forward(input_ids, positions, hidden_states, inputs_embeds)  # (T, d) each
        embeds = self.model.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        layer = self.model.layers[0]
        router_input = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden_states)], dim=-1)
        return torch.cat([output, router_input.to(output.dtype)], dim=-1), fed_back  # (T, 3d), (T, d)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        self._depth = 0  # one call per proposal, before its drafts
        return super().combine_hidden_states(hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(rows, V) fp32 logits: each row's shortlist scored, -inf elsewhere."""
        return self._head_output(hidden_states).to_vocab(self.config.vocab_size)

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(rows,) target ids: the argmax of each row's shortlist."""
        out = self._head_output(hidden_states)
        return out.ids_at(out.logits.argmax(dim=-1, keepdim=True))[:, 0]

    def _head_output(self, rows: torch.Tensor) -> HeadOutput:
        """The shortlisted head on rows (B, 3d) = [the layer's output; the router's input], at this draft's depth."""
        if self._shortlist is None:
            self._shortlist = head_from_tensors(self._tensors, self.dynaspec, self.lm_head.weight)
            use_onednn(self._shortlist[0])  # vLLM's packed CPU matmul for the clusters, where it has one
        head, router = self._shortlist
        d, settings = self.config.hidden_size, self.dynaspec
        k = cluster_budget(self._depth, self.num_drafts, settings["shortlist_k0"], settings["shortlist_k1"],
                           settings["shortlist_schedule"], settings["num_clusters"])
        self._depth += 1
        features = rows[:, :d].to(head.weight.dtype)
        router_logits = router(rows[:, d:].to(router.up.weight.dtype))
        return head.logits(features, "dynamic", router_logits, k, max_union_tokens=settings.get("max_union_tokens"))
