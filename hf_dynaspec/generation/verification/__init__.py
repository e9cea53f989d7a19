"""Verification: `verifier` checks a batch of trees in one target forward and commits the accepted paths, `verify`
walks a tree against the target's picks, `walk_head` / `prefilter` / `head_times` / `head_learner` apply the LM head
along the walk in the layout learned fastest, `cache` keeps the target's cache with holes, `grouped_attention` reads
grouped key / value heads in place."""
