"""The clustered LM head (kernels/torch-ext/dynaspec_gathered_head/cluster_head.py): the Triton kernel (under its
interpreter on CPU) against the PyTorch reference, and the reference against a plain loop over each row's clusters,
over awkward shapes and dtypes: uneven clusters, unused slots (-1), widths that are no multiple of a block.

    python -m pytest tests/test_cluster_head.py -q
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is first imported

import pytest  # noqa: E402
import torch  # noqa: E402

from hf_dynaspec import ops  # noqa: E402

kernels = ops.load_kernel_package()
needs_interpreter = pytest.mark.skipif(
    not (kernels.HAS_TRITON and kernels.is_interpreter_mode()), reason="needs triton with TRITON_INTERPRET=1"
)


def layout(sizes: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(row_ids (V,) a random permutation, offsets (M + 1,)) of clusters with these sizes."""
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    return torch.randperm(int(offsets[-1]), generator=generator), offsets


def loop_spec(hidden, weight, row_ids, offsets, clusters, width) -> torch.Tensor:
    """Row by row, slot by slot, lane by lane: the definition, in float64."""
    out = torch.full((hidden.shape[0], clusters.shape[1] * width), float("-inf"), dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for k, c in enumerate(clusters[t].tolist()):
            if c < 0:
                continue
            for j, position in enumerate(range(int(offsets[c]), int(offsets[c + 1]))):
                out[t, k * width + j] = hidden[t].double() @ weight[row_ids[position]].double()
    return out


CASES = [  # (cluster sizes, clusters per row, width)
    ([5, 1, 7, 3], [[2, 0], [1, -1], [3, 2]], 7),
    ([4, 4, 4, 4, 4, 4], [[5, 1, 0]], 4),  # equal sizes: no masked lane
    ([9, 2, 30, 1], [[2, 3, 0, 1], [-1, -1, -1, -1]], 30),  # a row with no cluster at all
    ([3] * 10, [[9]], 5),  # width above every cluster
]


@pytest.mark.parametrize("sizes, chosen, width", CASES)
def test_reference_is_the_definition(sizes, chosen, width):
    row_ids, offsets = layout(sizes)
    clusters = torch.tensor(chosen)
    hidden, weight = torch.randn(clusters.shape[0], 24), torch.randn(int(offsets[-1]), 24)
    got = kernels.cluster_lm_head_reference(hidden, weight, row_ids, offsets, clusters, width)
    torch.testing.assert_close(got.double(), loop_spec(hidden, weight, row_ids, offsets, clusters, width),
                               rtol=1e-5, atol=1e-5)
    ids, live = kernels.cluster_lanes(row_ids, offsets, clusters, width)
    assert torch.equal(live, torch.isfinite(got))
    for t, row in enumerate(chosen):  # each row's live lanes are exactly its clusters' tokens
        mine = {int(i) for c in row if c >= 0 for i in row_ids[offsets[c]:offsets[c + 1]]}
        assert sorted(ids[t][live[t]].tolist()) == sorted(mine)


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sizes, chosen, width", CASES)
def test_triton_kernel_matches_the_reference(sizes, chosen, width, dtype):
    row_ids, offsets = layout(sizes, seed=1)
    clusters = torch.tensor(chosen)
    hidden = torch.randn(clusters.shape[0], 40).to(dtype)  # d = 40: no multiple of the d block
    weight = torch.randn(int(offsets[-1]), 40).to(dtype)
    want = kernels.cluster_lm_head_reference(hidden, weight, row_ids, offsets, clusters, width)
    got = kernels.cluster_lm_head_triton(hidden, weight, row_ids, offsets, clusters, width, block_lanes=4,
                                         block_d=16)
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    live = torch.isfinite(want)
    torch.testing.assert_close(got[live], want[live], rtol=1e-5, atol=1e-4)


def test_bad_inputs_are_refused():
    row_ids, offsets = layout([2, 2])
    hidden, weight = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError, match="clusters must be"):
        kernels.cluster_lm_head_reference(hidden, weight, row_ids, offsets, torch.tensor([[0]]), 2)
    with pytest.raises(ValueError, match="share d"):
        kernels.cluster_lm_head_reference(hidden, torch.randn(4, 9), row_ids, offsets, torch.tensor([[0], [1]]), 2)
    with pytest.raises(ValueError, match="width"):
        kernels.cluster_lm_head_reference(hidden, weight, row_ids, offsets, torch.tensor([[0], [1]]), 0)
