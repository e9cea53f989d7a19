"""Drafting: `candidates` is the drafter's side of a step (its cache, catch-up and trees, and transformers'
`CandidateGenerator` contract), `lockstep` drafts several rows in one forward per depth, `tree` grows and trims
trees as tensors, `graphs` replays draft steps as CUDA graphs, `lookup` finds the lookup branch."""
