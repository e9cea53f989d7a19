"""The decoding loop: prefill, then (draft a tree -> verify it -> emit the accepted path) until done.

Three files make the decoding path, each handing the next what it needs through arguments and return values:
this loop, drafting (`candidates.py`: `extend`, `draft -> VerifyTree`, `accept`) and verification
(`verify.py`: `verify_forward -> (logits, hidden)`, `walk_tree -> WalkResult`, `keep_accepted`).

`speculative_decode` is what `target.generate(..., assistant_model=drafter)` runs (see `hook.py`). It receives
what transformers prepared (processors, stopping criteria, cache, streamer) and returns transformers' own
output types, so streamers, stop strings, EOS, `max_new_tokens` and `return_dict_in_generate` behave as in
plain decoding. Tokens are appended one at a time through the stopping criteria, so generation ends exactly
where plain decoding would, even inside an accepted path.

    python examples/generate.py --tiny
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList

from ..generation_config import DraftSettings, resolve_draft_settings
from ..modeling import DynaSpecDrafter
from ..target_states import hidden_state_request, select_hidden_states
from .calibration import measure_walk_head, step_costs
from .candidates import DynaSpecCandidateGenerator
from .learned import keep_policy, start_policy
from .policy import Plan, StepPolicy, lookup_tree
from .stats import DynaSpecGenerateOutput, SpeculativeStats
from .syncs import HostSyncCounter
from .tree import VerifyTree
from .verify import (
    keep_accepted,
    verify_forward,
    walk_tree,
)
from .walk_head import WalkHead, prefilter_blocker


@dataclass
class _Run:
    """State of one generate() call."""

    input_ids: torch.LongTensor  # (1, L + 1): committed tokens, the root (last token) not yet in the cache
    padding: torch.LongTensor  # (1, P) left padding: seen by processors and stopping criteria, not the model
    cache: DynamicCache
    generation_config: GenerationConfig
    logits_processor: LogitsProcessorList
    stopping_criteria: StoppingCriteriaList
    streamer: object | None
    stats: SpeculativeStats
    keep_scores: bool
    scores: list[torch.Tensor] = field(default_factory=list)
    raw_logits: list[torch.Tensor] = field(default_factory=list)
    finished: bool = False
    walk_head: WalkHead | None = None  # verification computes LM-head rows along the likeliest walk (prefill)
    token_list: list[int] = field(default_factory=list)  # input_ids[0] on the host, kept by `emit`

    def full_ids(self) -> torch.LongTensor:
        """The sequence as plain generate() sees it, left padding included."""
        return torch.cat([self.padding, self.input_ids], dim=-1) if self.padding.numel() else self.input_ids

    def emit(self, tokens: list[int], scores: list[torch.Tensor], raw: list[torch.Tensor]) -> int:
        """Append tokens until a stopping criterion fires; returns how many were kept. The criteria see every
        prefix, as in plain decoding, and their verdicts are read on the host together (one read)."""
        length = self.input_ids.shape[1]
        ids = torch.cat([self.input_ids, self.input_ids.new_tensor([tokens])], dim=-1)  # (1, L + k)
        padded = torch.cat([self.padding, ids], dim=-1) if self.padding.numel() else ids
        width = self.padding.shape[1] + length
        stops = torch.stack([
            self.stopping_criteria(padded[:, : width + i + 1], scores[i] if scores else None).all()
            for i in range(len(tokens))
        ]).tolist()  # (k,) the one read
        kept = stops.index(True) + 1 if True in stops else len(tokens)
        self.finished = True in stops
        self.input_ids = ids[:, : length + kept]
        self.token_list.extend(int(t) for t in tokens[:kept])
        if self.keep_scores:
            self.scores.extend(scores[:kept])
            self.raw_logits.extend(raw[:kept])
        if self.streamer is not None and kept:
            self.streamer.put(self.input_ids[:, -kept:].cpu())
        return kept


def speculative_decode(
    target: torch.nn.Module,
    input_ids: torch.LongTensor,
    drafter: DynaSpecDrafter,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer: object | None = None,
    model_kwargs: dict | None = None,
) -> DynaSpecGenerateOutput | torch.LongTensor:
    """Lossless tree speculative decoding of a batch-1 prompt; see the module docstring."""
    model_kwargs = model_kwargs or {}
    settings = resolve_draft_settings(generation_config, drafter.generation_config, drafter.config,
                                      target.device.type)
    stats = SpeculativeStats(synchronize=settings.synchronize_timers)
    with stats.timer("setup"):
        drafter.bind(target)
    padding, input_ids = strip_left_padding(input_ids, model_kwargs.get("attention_mask"))
    check_generation_inputs(input_ids, generation_config)
    keep_scores = bool(
        generation_config.return_dict_in_generate
        and (generation_config.output_scores or generation_config.output_logits)
    )
    run = _Run(
        input_ids=input_ids,
        padding=padding,
        # a cache of full layers (no config): sliding-window layers keep every position and the tree masks apply
        # each node's window, so rejected drafts never evict a token a later step still sees
        cache=DynamicCache(),
        generation_config=generation_config,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        streamer=streamer,
        stats=stats,
        keep_scores=keep_scores,
    )
    with torch.no_grad():
        features, next_tokens = prefill(target, run, drafter.config.feature_layer_ids, settings.verify_head)
        if not run.finished:
            with run.stats.timer("setup"):
                costs = step_costs(settings, target, run.walk_head)
            key = policy_key(settings, generation_config)
            policy = None if costs is None else start_policy(drafter, target, key, costs, settings.draft_depth)
            generator = DynaSpecCandidateGenerator(drafter, settings, run.stats,
                                                   max_length=generation_config.max_length)
            generator.extend(features, next_tokens, run.token_list[1:])
            with counting_host_reads(target, run.stats, settings.count_host_reads):
                while not run.finished:
                    speculative_step(target, generator, run, policy)
            if policy is not None:
                keep_policy(drafter, target, key, policy)
    if streamer is not None:
        streamer.end()
    return build_output(run)


def policy_key(settings: DraftSettings, generation_config: GenerationConfig) -> tuple:
    """What a learned policy is carried across calls under: the draft settings and the sampling mode (what the
    drafter proposes and how the target accepts it)."""
    sampling = (generation_config.temperature, generation_config.top_k, generation_config.top_p)
    return settings, bool(generation_config.do_sample), sampling if generation_config.do_sample else None


@contextmanager
def counting_host_reads(target: torch.nn.Module, stats: SpeculativeStats, enabled: bool) -> Iterator[None]:
    """With `enabled`, count the host reads made inside the block into `stats`: those inside the target's own
    forward (hooks around it) into `target_host_reads`, the rest into `host_reads`."""
    if not enabled:
        yield
        return
    inner, outer = HostSyncCounter(), HostSyncCounter()

    def enter(*_: object) -> None:  # a hook returns None: anything else would replace the forward's inputs
        inner.__enter__()

    def leave(*_: object) -> None:
        inner.__exit__(None, None, None)

    handles = [target.register_forward_pre_hook(enter), target.register_forward_hook(leave)]
    try:
        with outer:  # the inner counter's reads pass through the outer one too
            yield
    finally:
        for handle in handles:
            handle.remove()
        stats.host_reads += outer.total - inner.total
        stats.target_host_reads += inner.total


def prefill(target: torch.nn.Module, run: _Run, feature_layers: list[int], verify_head: str = "auto"
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Target over the prompt -> first token (the target's own choice); sets how verification applies the LM head
    (`verify_head`, see `walk_head_for`). Returns what the drafter reads next: the prompt's features (L, k * d)
    (hidden states `feature_layers`; position i predicts x_{i+1}) and the tokens after them (L,)."""
    prompt = run.input_ids
    run.token_list = prompt[0].tolist()  # the host copy drafting reads (the lookup branch, the root)
    with run.stats.timer("prefill", target.device):
        last_only = {"logits_to_keep": 1} if target._supports_logits_to_keep() else {}
        keep = hidden_state_request(target.config, feature_layers)  # only the layers read, not all of them
        out = target(input_ids=prompt, cache=run.cache, use_cache=True, output_hidden_states=keep, **last_only)
        raw = out.logits[:, -1].float()  # (1, V)
    greedy_only = not run.generation_config.do_sample and not len(run.logits_processor) and not run.keep_scores
    with run.stats.timer("setup"):  # measured once per target shape and machine (kept on disk), then memoised
        run.walk_head = walk_head_for(target, verify_head, greedy_only, out.hidden_states[-1][0, -1:], raw)
    with run.stats.timer("prefill", target.device):
        scores = run.logits_processor(run.full_ids(), raw.clone()) if len(run.logits_processor) else raw
        token = choose_token(scores[0], run.generation_config.do_sample)
        run.emit([token], [scores], [raw])
    features = select_hidden_states(out.hidden_states, feature_layers)[0]  # (L, k * d)
    return features, torch.cat([prompt[0, 1:], prompt.new_tensor([token])])  # (L, k * d), (L,) x_{i+1}


def walk_head_for(target: torch.nn.Module, wanted: str, greedy_only: bool, hidden: torch.Tensor, raw: torch.Tensor
                  ) -> WalkHead | None:
    """How verification applies the target's LM head (None: every node's logits in the verification pass).

    On CPU the head's cost grows with its rows: "auto" applies it only along the walk, in the layout and with the
    rows at once that are cheapest here (measured once per target), the greedy-only "prefilter" among them when
    `greedy_only` (no sampling, logits processors or kept scores) and the head qualifies; a target whose logits
    its head does not reproduce from the final hidden state (1, d) (`raw` (1, V): unknown post-processing)
    verifies with full logits. A named layout is used as asked, or refused with the reason."""
    if wanted == "full":
        return None
    walk_path = (target.device.type == "cpu" and target.get_output_embeddings() is not None
                 and target._supports_logits_to_keep())
    if not walk_path:
        if wanted == "auto":
            return None
        raise ValueError(f"verify_head={wanted!r} applies the LM head along the walk, for a CPU target whose model "
                         f"takes `logits_to_keep`; this one runs on {target.device.type!r}. Use 'auto' or 'full'.")
    blocker = prefilter_blocker(target) if greedy_only else (
        "it gives greedy picks only: do_sample=False with no logits processors (such as repetition_penalty) and "
        "no output_scores / output_logits")
    if wanted == "prefilter" and blocker is not None:
        raise ValueError(f"verify_head='prefilter' cannot apply: {blocker}. Use 'auto' or another layout.")
    if wanted == "auto":
        layouts = ("rows", "columns") + (("prefilter",) if blocker is None else ())
    else:
        layouts = (wanted,)
    walk_head = measure_walk_head(target, layouts=layouts)
    if walk_head.reproduces(hidden, raw):
        return walk_head
    if wanted != "auto":
        raise ValueError(f"verify_head={wanted!r}: this target's logits are not its LM head's output (post-processing"
                         " the walk head does not know). Use 'full' or 'auto'.")
    return None


def speculative_step(
    target: torch.nn.Module, generator: DynaSpecCandidateGenerator, run: _Run, policy: StepPolicy | None = None
) -> None:
    """Choose and build the step's tree (`choose_tree`), verify it in one target forward, emit the accepted
    tokens, update both caches and tell the policy what happened."""
    past_length = run.input_ids.shape[1] - 1  # the root (last token) is not in the target cache yet
    room = run.generation_config.max_length - run.full_ids().shape[1] - 1  # drafts a path may hold (+ bonus)
    plan, tree, predicted, seconds = choose_tree(generator, run, policy, room)
    start = time.perf_counter()
    with run.stats.timer("verify", target.device):
        logits, features = verify_forward(target, run.cache, tree, past_length, run.walk_head,
                                          generator.feature_layers)
        walk = walk_tree(
            tree, logits, run.full_ids(), run.logits_processor, run.generation_config.do_sample, run.keep_scores
        )
    seconds["verify"] = time.perf_counter() - start
    run.emit(walk.new_tokens, walk.scores, walk.logits)
    keep_accepted(run.cache, past_length, walk.path)
    generator.accept(tree, walk, None if run.finished else features, plan.kind == "draft")
    run.stats.add_prediction(plan.kind, predicted, len(walk.new_tokens), tree.num_nodes - 1)
    if policy is not None:
        policy.record(plan, tree, walk.path, seconds)


def choose_tree(generator: DynaSpecCandidateGenerator, run: _Run, policy: StepPolicy | None, room: int
                ) -> tuple[Plan, VerifyTree, float | None, dict[str, float]]:
    """The step's plan and tree, its expected accepted length (None without a policy) and the drafter's seconds
    ("catch_up", "draft"). Without a policy: the whole configured tree. With one: `policy.plan` first with what
    is known for free (the root's proposals are stale until the drafter catches up on the last accepted path);
    a drafted plan pays the catch-up, then is planned again with the fresh proposals (a probe is kept)."""
    if policy is None:
        return Plan("draft"), generator.draft(run.input_ids, max_depth=room, committed=run.token_list), None, {}
    lookup = generator.lookup(run.token_list)[: max(0, room)]
    plan = policy.plan(generator.root_probs(), lookup, room)
    seconds: dict[str, float] = {}
    if plan.kind == "draft" and generator.pending:
        start = time.perf_counter()
        generator.catch_up()
        seconds["catch_up"] = time.perf_counter() - start
        if not plan.probe:
            plan = policy.plan(generator.root_probs(), lookup, room)
    if plan.kind == "draft":
        start = time.perf_counter()
        tree = generator.draft(run.input_ids, max_depth=room, committed=run.token_list, depth=plan.depth)
        seconds["draft"] = time.perf_counter() - start
        tree, predicted = policy.trim(tree)
        return plan, tree, predicted, seconds
    tree = lookup_tree(run.token_list[-1], plan.lookup)  # the root alone when plan.lookup is empty
    return plan, tree, policy.expected(tree), seconds


def choose_token(scores: torch.Tensor, do_sample: bool) -> int:
    """The target's pick from processed scores (V,): argmax, or a sample of softmax(scores)."""
    if do_sample:
        return int(torch.multinomial(torch.softmax(scores.float(), dim=-1), 1))
    return int(scores.argmax())


def check_generation_inputs(input_ids: torch.LongTensor, generation_config: GenerationConfig) -> None:
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"DynaSpec speculative decoding runs one sequence at a time (batch size 1), got input_ids of shape "
            f"{tuple(input_ids.shape)}. Call generate() once per prompt, or drop `assistant_model` for batches."
        )
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: pass at least one token (e.g. the BOS token).")
    unsupported = [
        name for name in ("output_attentions", "output_hidden_states") if getattr(generation_config, name, False)
    ]
    if unsupported:
        raise ValueError(
            f"{unsupported} are not supported with a DynaSpec drafter (tree verification mixes positions); "
            "use output_scores / output_logits, or generate without `assistant_model`."
        )


def strip_left_padding(
    input_ids: torch.LongTensor, attention_mask: torch.Tensor | None
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Split (1, L) ids into (left padding, real tokens); padding anywhere else is refused."""
    if attention_mask is None or bool(attention_mask.all()):
        return input_ids[:, :0], input_ids
    mask = attention_mask[0].bool()
    first = int(mask.nonzero()[0]) if mask.any() else mask.numel()
    if not bool(mask[first:].all()):
        raise ValueError(
            "The attention mask has padding after the first real token; pad on the left "
            "(tokenizer.padding_side = 'left') or pass the prompt without padding."
        )
    return input_ids[:, :first], input_ids[:, first:]


def build_output(run: _Run) -> DynaSpecGenerateOutput | torch.LongTensor:
    run.stats.settle()
    sequences = run.full_ids()
    config = run.generation_config
    if not config.return_dict_in_generate:
        return sequences
    return DynaSpecGenerateOutput(
        sequences=sequences,
        scores=tuple(run.scores) if config.output_scores else None,
        logits=tuple(run.raw_logits) if config.output_logits else None,
        cache=run.cache,
        speculative_stats=run.stats,
    )
