"""The target's cache during tree decoding: which keys each row attends to, and keeping accepted paths.

Decoding appends a verified tree's nodes to the cache, then keeps only each row's accepted path. Rows of a batch
accept paths of different lengths, so the cache cannot stay one dense block: each row's path is gathered to the
front of the new block, the block is cut to the longest path, and the slots past a shorter row's path become
holes that its later queries never attend to. `KeyLayout` says which keys are real for each row (`valid`, as
transformers' 2D attention mask says for left padding) and at which position (`positions`: a row's real keys
numbered 0, 1, ... as plain decoding numbers them, which sliding windows count from). A batch of one row never
has holes (its path is the longest): its layout stays dense (`valid` None) and its masks are those of a single
sequence. Holes cost attention over a few extra masked keys; compacting rows instead would move every row's whole
cache each step (transformers' cache classes keep one length per layer for all rows).

Every layer must be a `DynamicLayer` of full length (sliding windows are applied by the masks, so a rejected
node never evicts a key a later step still sees).

    python -m pytest tests/test_batch.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer


@dataclass
class KeyLayout:
    """Per row of the cache (B rows, K keys): valid (B, K) bool, None when every key is real for every row;
    positions (B, K) long, the position of each real key (holes: 0); lengths (B,) long, each row's real keys
    (the position its next token takes)."""

    valid: torch.Tensor | None
    positions: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def dense(cls, batch: int, length: int, device: torch.device) -> KeyLayout:
        positions = torch.arange(length, device=device).expand(batch, length)
        return cls(None, positions, torch.full((batch,), length, device=device))

    @classmethod
    def from_attention_mask(cls, attention_mask: torch.Tensor) -> KeyLayout:
        """Left-padded prompts (B, T): plain decoding's positions, cumsum(mask) - 1 (padding: 0)."""
        valid = attention_mask.bool()
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        return cls(None if bool(valid.all()) else valid, positions, valid.sum(-1))

    def valid_or_all(self) -> torch.Tensor:
        """valid (B, K), all True when dense."""
        if self.valid is not None:
            return self.valid
        return torch.ones(self.positions.shape, dtype=torch.bool, device=self.positions.device)

    def appended(self, accepted: list[int]) -> KeyLayout:
        """After each row kept `accepted[b]` (host ints: no device read) of a block cut to A = max(accepted)
        slots: slots j < accepted[b] real, at positions lengths[b] + j."""
        device = self.lengths.device
        width = max(accepted)
        counts = torch.tensor(accepted, device=device)  # (B,)
        slots = torch.arange(width, device=device)
        real = slots[None, :] < counts[:, None]  # (B, A)
        positions = torch.where(real, self.lengths[:, None] + slots[None, :], 0)
        dense = self.valid is None and min(accepted) == width
        valid = None if dense else torch.cat([self.valid_or_all(), real], dim=1)
        return KeyLayout(valid, torch.cat([self.positions, positions], dim=1), self.lengths + counts)

    def rows(self, index: torch.Tensor) -> KeyLayout:
        """The layout of rows `index` (B',)."""
        valid = None if self.valid is None else self.valid[index]
        return KeyLayout(valid, self.positions[index], self.lengths[index])


def keep_paths(cache: DynamicCache, past_length: int, paths: list[list[int]]) -> list[int]:
    """Keep cache entries [0, past_length) and, for each row b, the new entries at `paths[b]` (indices into the
    block of verified nodes, root first) gathered to the block's front; the block is cut to the longest path (one
    row: no holes). Returns the accepted counts. The gather reads every kept entry before any is written."""
    accepted = [len(p) for p in paths]
    width = max(accepted)
    moved = any(p != list(range(len(p))) for p in paths)  # else every path is the block's first slots
    index = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths])  # (B, A): padded with a kept slot
    for layer in _full_layers(cache):
        if moved:
            idx = index.to(layer.keys.device)[:, None, :, None] + past_length  # (B, 1, A, 1)
            keys = layer.keys.gather(2, idx.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))  # (B, H, A, D)
            values = layer.values.gather(2, idx.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
            layer.keys[:, :, past_length : past_length + width] = keys
            layer.values[:, :, past_length : past_length + width] = values
        layer.keys = layer.keys[:, :, : past_length + width]
        layer.values = layer.values[:, :, : past_length + width]
    return accepted


def keep_rows(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep only rows `index` (B',) of every layer (rows that finished stop costing verification work)."""
    for layer in _full_layers(cache):
        rows = index.to(layer.keys.device)
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)


def crop_cache(cache: Cache, length: int) -> None:
    """Drop every entry at or after `length` (explicit slicing: `crop`'s sign convention varies). A static layer
    keeps its tensors (fixed addresses) and moves its write position back, on the device."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(length)
        elif getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def _full_layers(cache: DynamicCache) -> list[DynamicLayer]:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"Tree verification needs a DynamicCache of full-attention layers, got {type(layer).__name__}: "
                "use the default cache (no cache_implementation) with a full-attention target."
            )
    return cache.layers
