"""The decoding loop: prefill, then (draft a tree per row -> verify every row's tree in one forward -> commit
each row's accepted path) until every row is done.

Three parts make the decoding path, each handing the next what it needs through arguments and return values:
this loop, drafting (`candidates.py`, one generator per row: `extend`, `draft -> VerifyTree`, `accept`; the rows
that draft in one step grow their trees in lockstep, one drafter forward per round: `lockstep.py`) and
verification (`verifier.Verifier`: `verify(trees) -> walks`, `commit(paths)`).

`speculative_decode` is what `target.generate(..., assistant_model=drafter)` runs (see `hook.py`), for a batch
of left-padded rows (B, T) or one sequence. It receives what transformers prepared (processors, stopping
criteria, cache, streamer) and returns transformers' own output types, so stop strings, EOS, `max_new_tokens`,
`num_return_sequences` and `return_dict_in_generate` behave as in plain decoding. Tokens are appended one at a
time through the stopping criteria, per row, so each row ends exactly where plain decoding would end it, even
inside an accepted path; a row that has ended leaves the batch (no more drafting or verification) and its
output is padded with `pad_token_id` as plain decoding pads it.

    python examples/generate.py --tiny
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList, PrefixConstrainedLogitsProcessor
from transformers.generation.stopping_criteria import StoppingCriteriaList

from ...generation_config import DraftSettings, resolve_draft_settings
from ...modeling import DynaSpecDrafter
from ...target_states import hidden_state_request, select_hidden_states
from ..drafting.candidates import DynaSpecCandidateGenerator
from ..drafting.lockstep import catch_up_together, draft_together, drafts_together
from ..drafting.tree import VerifyTree, lookup_tree
from ..planning.calibration import head_times, step_costs, walk_head_for
from ..planning.learned import keep_policy, start_policy
from ..planning.policy import (
    Option,
    Plan,
    StepPolicy,
    VerifyCosts,
    choose_options,
    probing_rows,
    relaid_costs,
    trim_trees,
)
from ..verification.cache import KeyLayout
from ..verification.verifier import Verifier
from ..verification.walk_head import WalkHead
from .stats import DynaSpecGenerateOutput, SpeculativeStats
from .syncs import HostSyncCounter

LAYOUT_SWITCH_MARGIN = 0.95  # the policy's costs follow a learned layout at least 5% faster than theirs


@dataclass
class _Run:
    """One row of a generate() call: its sequence, and the drafter and step policy that serve it."""

    input_ids: torch.LongTensor  # (1, L + 1): committed tokens, the root (last token) not yet in the cache
    padding: torch.LongTensor  # (1, P) left padding: seen by processors and stopping criteria, not the model
    generation_config: GenerationConfig
    logits_processor: LogitsProcessorList
    stopping_criteria: StoppingCriteriaList
    streamer: object | None
    stats: SpeculativeStats
    keep_scores: bool
    scores: list[torch.Tensor] = field(default_factory=list)
    raw_logits: list[torch.Tensor] = field(default_factory=list)
    finished: bool = False
    token_list: list[int] = field(default_factory=list)  # input_ids[0] on the host, kept by `emit`
    generator: DynaSpecCandidateGenerator | None = None
    policy: StepPolicy | None = None

    def full_ids(self) -> torch.LongTensor:
        """The sequence as plain generate() sees it, left padding included."""
        return torch.cat([self.padding, self.input_ids], dim=-1) if self.padding.numel() else self.input_ids

    def room(self) -> int:
        """Drafts a path may still hold (tokens left before max_length, less the bonus token)."""
        return self.generation_config.max_length - self.full_ids().shape[1] - 1

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


@dataclass
class _Batch:
    """A generate() call: every row (input order), the verifier of the rows still decoding (`running`: their
    indices, in the verifier's cache order) and the call's own statistics (setup, prefill, verify; with one row,
    that row's statistics object)."""

    rows: list[_Run]
    verifier: Verifier
    running: list[int]
    stats: SpeculativeStats
    settings: DraftSettings
    quiet_steps: int = 0  # steps in a row without any row drafting (`policy.probing_rows`)
    measured_head: WalkHead | None = None  # the walk head the policy's costs are measured with (`planning_costs`)
    costs_layout: str | None = None  # with a layout learner: the layout the policy's costs are for

    def running_rows(self) -> list[_Run]:
        return [self.rows[i] for i in self.running]


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
    """Lossless tree speculative decoding of a batch of prompts (B, T); see the module docstring."""
    model_kwargs = model_kwargs or {}
    check_generation_inputs(input_ids, model_kwargs, streamer, logits_processor)
    settings = resolve_draft_settings(generation_config, drafter.generation_config, drafter.config,
                                      target.device.type)
    warn_beyond_window(drafter.config.layer_sliding_window, generation_config.max_length)
    stats = SpeculativeStats(synchronize=settings.synchronize_timers)
    with stats.timer("setup"):
        drafter.bind(target)
    rows, ids, attention_mask = split_rows(input_ids, model_kwargs.get("attention_mask"), generation_config,
                                           logits_processor, stopping_criteria, streamer, stats)
    with torch.no_grad():
        batch, features = prefill(target, rows, ids, attention_mask, drafter.config.feature_layer_ids, settings,
                                  stats)
        if batch.running:
            start_rows(batch, target, drafter, features)
            with counting_host_reads(target, stats, settings.count_host_reads):
                while batch.running:
                    speculative_step(target, batch)
            decoded = [row for row in rows if row.policy is not None]
            if decoded:  # the policy of the row that took the most steps: the most it learned
                longest = max(decoded, key=lambda row: row.stats.steps)
                keep_policy(drafter, target, policy_key(settings, generation_config), longest.policy)
            if batch.verifier.learner is not None:
                batch.verifier.learner.save()  # what the call learned of the head's layouts, for the next process
    if streamer is not None:
        streamer.end()
    return build_output(batch, generation_config)


def split_rows(input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, generation_config: GenerationConfig,
               logits_processor: LogitsProcessorList, stopping_criteria: StoppingCriteriaList,
               streamer: object | None, stats: SpeculativeStats
               ) -> tuple[list[_Run], torch.LongTensor, torch.Tensor | None]:
    """One `_Run` per row (its left padding apart), and what the target's cache holds: the batch without the
    padding columns every row shares (B, T') and its attention mask (None: no padding left)."""
    batch = input_ids.shape[0]
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    pads = [left_padding(mask[b]) for b in range(batch)]
    keep_scores = bool(
        generation_config.return_dict_in_generate
        and (generation_config.output_scores or generation_config.output_logits)
    )
    rows = [
        _Run(input_ids=input_ids[b : b + 1, pad:], padding=input_ids[b : b + 1, :pad],
             generation_config=generation_config, logits_processor=logits_processor,
             stopping_criteria=stopping_criteria, streamer=streamer,
             stats=stats if batch == 1 else SpeculativeStats(synchronize=stats.synchronize), keep_scores=keep_scores)
        for b, pad in enumerate(pads)
    ]
    shared = min(pads)
    ids, mask = input_ids[:, shared:], mask[:, shared:]
    return rows, ids, None if bool(mask.all()) else mask


def left_padding(mask: torch.Tensor) -> int:
    """The left padding of one row's attention mask (T,); padding anywhere else is refused."""
    first = int(mask.nonzero()[0]) if mask.any() else mask.numel()
    if first == mask.numel():
        raise ValueError("A row of the batch is all padding: pass at least one token per row (e.g. the BOS token).")
    if not bool(mask[first:].all()):
        raise ValueError(
            "The attention mask has padding after the first real token; pad on the left "
            "(tokenizer.padding_side = 'left') or pass the prompt without padding."
        )
    return first


def prefill(target: torch.nn.Module, rows: list[_Run], ids: torch.LongTensor, attention_mask: torch.Tensor | None,
            feature_layers: list[int], settings: DraftSettings, stats: SpeculativeStats
            ) -> tuple[_Batch, list[torch.Tensor]]:
    """Target over the prompts (B, T') -> each row's first token (the target's own choice); builds the verifier
    (the LM head's layout: `walk_head_for`). Returns the batch and, per row, what its drafter reads first: the
    prompt's features (L_b, k * d) (hidden states `feature_layers`; position i predicts x_{i+1}, the row's
    token_list[i + 1])."""
    config = rows[0].generation_config
    cache = DynamicCache()
    keys = (KeyLayout.dense(ids.shape[0], ids.shape[1], ids.device) if attention_mask is None
            else KeyLayout.from_attention_mask(attention_mask))
    with stats.timer("prefill", target.device):
        last_only = {"logits_to_keep": 1} if target._supports_logits_to_keep() else {}
        padded = {} if attention_mask is None else {"attention_mask": attention_mask.long(),
                                                    "position_ids": keys.positions}
        keep = hidden_state_request(target.config, feature_layers)  # only the layers read, not all of them
        out = target(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=keep, **padded, **last_only)
        raw = out.logits[:, -1].float()  # (B, V)
    greedy_only = not config.do_sample and not len(rows[0].logits_processor) and not rows[0].keep_scores
    with stats.timer("setup"):  # measured once per target shape and machine (kept on disk), then memoised
        walk_head, learner = walk_head_for(target, settings.verify_head, greedy_only, out.hidden_states[-1][0, -1:],
                                           raw[:1], len(rows))
        times = head_times(target, walk_head) if len(rows) > 1 else None  # one row: its walk rows, as calibrated
    times_of = (lambda head: head_times(target, head)) if len(rows) > 1 else None
    verifier = Verifier(target, cache, keys, walk_head, tuple(feature_layers), rows[0].logits_processor,
                        bool(config.do_sample), rows[0].keep_scores, times, learner, times_of)
    all_features = select_hidden_states(out.hidden_states, feature_layers)  # (B, T', k * d)
    features = []
    with stats.timer("prefill", target.device):
        for b, row in enumerate(rows):
            row.token_list = row.input_ids[0].tolist()  # the host copy drafting reads (the lookup branch, root)
            scores = row.logits_processor(row.full_ids(), raw[b : b + 1].clone()) if len(row.logits_processor) \
                else raw[b : b + 1]
            token = choose_token(scores[0], bool(config.do_sample))
            length = row.input_ids.shape[1]
            row.emit([token], [scores], [raw[b : b + 1]])
            features.append(all_features[b, ids.shape[1] - length :])  # (L_b, k * d): the row's real tokens
    batch = _Batch(rows, verifier, list(range(len(rows))), stats, settings, measured_head=walk_head,
                   costs_layout=walk_head.layout if walk_head is not None else None)
    drop_finished(batch)
    return batch, features


def start_rows(batch: _Batch, target: torch.nn.Module, drafter: DynaSpecDrafter, features: list[torch.Tensor]
               ) -> None:
    """Each running row's drafter (its prompt kept to read when the row first drafts: a row that never drafts
    never pays for it) and step policy (costs at this batch size, what earlier calls learned:
    `learned.start_policy`)."""
    config, settings = batch.rows[0].generation_config, batch.settings
    with batch.stats.timer("setup"):
        costs = planning_costs(batch, target, len(batch.running))
    for index in batch.running:
        row = batch.rows[index]
        if costs is not None:  # the rows share one drafter and target: one set of timings
            row.policy = start_policy(drafter, target, policy_key(settings, config), costs, settings.draft_depth)
            row.policy.timings = batch.rows[batch.running[0]].policy.timings
            row.policy.timings.together = drafts_together(settings)
        row.generator = DynaSpecCandidateGenerator(drafter, settings, row.stats, max_length=config.max_length)
        row.generator.defer(features[index], row.token_list[1:])
    if costs is not None:
        follow_learned_layout(batch, target)  # what earlier calls learned of the head's layouts, from the first step


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


def speculative_step(target: torch.nn.Module, batch: _Batch) -> None:
    """Choose and build each running row's tree (`choose_trees`), verify them all in one target forward, emit each
    row's accepted tokens, keep its path in both caches, tell its policy what happened, and let rows that ended
    leave the batch."""
    rows = batch.running_rows()
    step_start = time.perf_counter()
    arm = "tree" if rows[0].policy is None else step_arm(rows[0].policy, target)
    chosen = choose_trees(batch, arm)
    trees = [step.tree for step in chosen]
    start = time.perf_counter()
    with batch.stats.timer("verify", target.device):
        walks, features = batch.verifier.verify(trees, [row.full_ids() for row in rows])
    verify_seconds = time.perf_counter() - start
    verified = max(tree.num_nodes for tree in trees)  # the padded block every row paid for
    for b, (row, step, walk, row_features) in enumerate(zip(rows, chosen, walks, features)):
        plan, tree = step.plan, step.tree
        row.emit(walk.new_tokens, walk.scores, walk.logits)
        row.generator.accept(tree, walk, None if row.finished else row_features, plan.kind == "draft")
        spread = row.policy.spread(tree) if row.policy is not None and tree.num_nodes > 1 else 0.0  # before `record`
        row.stats.add_prediction(plan.kind, step.predicted, len(walk.new_tokens), tree.num_nodes - 1, spread)
        row.stats.tree_steps += arm == "tree" and row.policy is not None
        if row.policy is not None:
            shared = b == 0 and not batch.verifier.exploring  # a step exploring a layout is no cost to plan with
            own = step.seconds if arm == "policy" else {}  # a tree step's drafting times its catch-up too
            timed = {**own, "verify": verify_seconds} if shared else own
            row.policy.record(plan, tree, walk.path, timed, verified, len(rows), step.drafting, step.drafted,
                              step.catching)
    batch.verifier.commit([walk.path for walk in walks])
    if rows[0].policy is not None:  # the rest of the step: what every kind of step pays besides its forward
        drafting = sum(sum(step.seconds.values()) for step in chosen)  # catch-ups, prompt reads, rounds
        step_seconds = time.perf_counter() - step_start
        if arm == "policy":
            rows[0].policy.timings.observe_overhead(step_seconds - verify_seconds - drafting)
        rows[0].policy.timings.arms.record(arm, sum(len(walk.new_tokens) for walk in walks), step_seconds)
    follow_learned_layout(batch, target)
    drop_finished(batch, target)


def step_arm(policy: StepPolicy, target: torch.nn.Module) -> str:
    """Which arm plans this step (`step_arms`): on a CPU target the A/B test's; elsewhere the policy (the arms are
    untested on accelerators, where switching between them adds host reads to the steps that follow a switch)."""
    return policy.timings.arms.next_arm() if target.device.type == "cpu" else "policy"


def drop_finished(batch: _Batch, target: torch.nn.Module | None = None) -> None:
    """Rows that ended leave the verifier's cache; the rest plan with the costs of the smaller batch."""
    keep = [k for k, index in enumerate(batch.running) if not batch.rows[index].finished]
    if len(keep) == len(batch.running):
        return
    batch.running = [batch.running[k] for k in keep]
    if not keep:
        return
    batch.verifier.keep_rows(keep)
    if target is not None and batch.settings.step_policy != "off":
        with batch.stats.timer("setup"):
            costs = planning_costs(batch, target, len(keep))
        for row in batch.running_rows():
            row.policy.costs = costs


def planning_costs(batch: _Batch, target: torch.nn.Module, rows: int) -> VerifyCosts | None:
    """The c(n) the step policy plans with at `rows` rows: measured with the head the call started with
    (`calibration.step_costs`), and, once a layout learner chose another layout (`costs_layout`), re-laid for that
    layout's head seconds (`follow_learned_layout`)."""
    costs = step_costs(batch.settings, target, batch.measured_head, rows)
    learner, start = batch.verifier.learner, batch.measured_head
    if costs is None or learner is None or start is None or batch.costs_layout in (None, start.layout):
        return costs
    policy = batch.rows[batch.running[0]].policy
    old, new = learner.walk_seconds(start.layout, rows), learner.walk_seconds(batch.costs_layout, rows)
    unit = policy.timings.plain.value if policy is not None else None
    if old is None or new is None or not unit:
        return costs
    return relaid_costs(costs, unit, old, new)


def follow_learned_layout(batch: _Batch, target: torch.nn.Module) -> None:
    """Once the layout learner's choice at this batch's walk rows beats the layout the policy's costs are for by
    `LAYOUT_SWITCH_MARGIN`, the policy plans with that layout's costs (`planning_costs`: re-laid from the
    measurement, nothing timed) and forgets what it observed of the old layout's verifications
    (`Timings.forget_verifications`)."""
    learner, rows = batch.verifier.learner, batch.running_rows()
    if learner is None or rows[0].policy is None or rows[0].policy.timings.plain.value is None:
        return
    walk_rows = len(rows) * learner.rows
    new, old = learner.choice(walk_rows), batch.costs_layout
    now, before = learner.estimate(new, walk_rows), learner.estimate(old, walk_rows)
    if new == old or now is None or before is not None and now > LAYOUT_SWITCH_MARGIN * before:
        return
    batch.costs_layout = new
    costs = planning_costs(batch, target, len(rows))
    rows[0].policy.timings.forget_verifications(new)  # the rows share one `Timings`
    for row in rows:
        row.policy.costs = costs


@dataclass
class Chosen:
    """A row's step: its plan, the tree to verify, its expected accepted length (None without a policy), the
    drafter's seconds ("catch_up", "draft") and the tree as drafted (before the batch's trim)."""

    plan: Plan
    tree: VerifyTree
    predicted: float | None
    seconds: dict[str, float]
    drafted: VerifyTree
    drafting: int = 1  # rows whose drafting `seconds` covers (lockstep), and whose catch-up
    catching: int = 1


def choose_trees(batch: _Batch, arm: str = "policy") -> list[Chosen]:
    """Each running row's step (`Chosen`). Without a policy, or for the arm "tree" (`step_arms`): the whole configured
    tree per row. Else the batch plans
    as one decision (`policy.choose_options`) in two rounds: first with what is known for free (a root's
    proposals are stale until its drafter catches up on the last accepted path); the rows that chose to draft
    pay their catch-up, then the batch plans again with their fresh proposals (rows still stale may not draft
    then; a probe keeps its plan). The trees are trimmed together (`policy.trim_trees`)."""
    rows = batch.running_rows()
    rooms = [row.room() for row in rows]
    if rows[0].policy is None or arm == "tree":  # the whole configured tree per row
        batch.quiet_steps = 0
        plans = [Plan("draft", batch.settings.draft_depth) for _ in rows]
        seconds = [{} for _ in rows]
        trees = draft_trees(rows, plans, rooms, seconds, drafts_together(batch.settings), batch.stats)
        return [Chosen(plan, tree, None, spent, tree) for plan, tree, spent in zip(plans, trees, seconds)]
    lookups = [row.generator.lookup(row.token_list)[: max(0, room)] for row, room in zip(rows, rooms)]
    probes = probing_rows([row.policy for row in rows], rooms, batch.quiet_steps)
    costs = rows[0].policy.current_costs(len(rows))
    root_probs = [row.generator.root_probs() for row in rows]  # one host read per fresh root
    plans = plan_rows(rows, root_probs, lookups, rooms, costs, probes)
    seconds: list[dict[str, float]] = [{} for _ in rows]
    together = drafts_together(batch.settings)
    stale = [b for b, plan in enumerate(plans) if plan.kind == "draft" and rows[b].generator.pending]
    catching = catch_up_rows(rows, stale, seconds, together, batch.stats)
    if stale:
        for b in stale:
            root_probs[b] = rows[b].generator.root_probs()
        probed = {b: p for b, p in enumerate(plans) if p.probe}
        plans = plan_rows(rows, root_probs, lookups, rooms, costs, probes, fixed=probed)
    trees = draft_trees(rows, plans, rooms, seconds, together, batch.stats)
    trimmed = trim_trees(trees, costs, [row.policy.calibration for row in rows],
                         rows[0].policy.timings.overhead_cost())
    batch.quiet_steps = 0 if any(p.kind == "draft" for p in plans) else batch.quiet_steps + 1
    drafting = sum(plan.kind == "draft" for plan in plans) if together else 1
    return [Chosen(plan, tree, predicted, spent, drafted, drafting, catching)
            for plan, (tree, predicted), spent, drafted in zip(plans, trimmed, seconds, trees)]


def catch_up_rows(rows: list[_Run], stale: list[int], seconds: list[dict[str, float]], together: bool,
                  stats: SpeculativeStats) -> int:
    """Rows `stale` read their accepted paths (together: `lockstep.catch_up_together`, one forward for those
    reading a path and one for those reading their prompt, each's seconds given to its first row and, for
    several rows, to the call's `stats` "extend"); a prompt's reading is timed apart ("read_prompt": not a
    catch-up). Returns the rows one "catch_up" time covers."""
    prompts = [b for b in stale if rows[b].generator.committed == 0]
    paths = [b for b in stale if rows[b].generator.committed > 0]
    for group, name in ((prompts, "read_prompt"), (paths, "catch_up")):
        for part in ([group] if together and group else [[b] for b in group]):
            start = time.perf_counter()
            with stats.timer("extend") if len(part) > 1 else nullcontext():  # one row: its generator times it
                catch_up_together([rows[b].generator for b in part])
            seconds[part[0]][name] = time.perf_counter() - start
    return len(paths) if together and paths else 1


def draft_trees(rows: list[_Run], plans: list[Plan], rooms: list[int], seconds: list[dict[str, float]],
                together: bool, stats: SpeculativeStats) -> list[VerifyTree]:
    """Each row's tree for its plan: drafted (in lockstep when `together` and several rows draft:
    `lockstep.draft_together`, its seconds given to the deepest of them and to the call's `stats` "draft"; one
    by one, each generator times its own), the lookup branch, or the root alone. Adds the drafting seconds to
    `seconds` ("draft")."""
    trees: list[VerifyTree | None] = [None if plan.kind == "draft" else lookup_tree(row.token_list[-1], plan.lookup)
                                      for row, plan in zip(rows, plans)]  # the root alone when plan.lookup is ()
    drafting = [b for b, plan in enumerate(plans) if plan.kind == "draft"]
    if together and len(drafting) > 1:
        start = time.perf_counter()
        with stats.timer("draft"):
            drafted = draft_together([rows[b].generator for b in drafting], [rows[b].token_list for b in drafting],
                                     [rooms[b] for b in drafting], [plans[b].depth for b in drafting])
        deepest = max(drafting, key=lambda b: plans[b].depth)
        seconds[deepest]["draft"] = time.perf_counter() - start
        for b, tree in zip(drafting, drafted):
            trees[b] = tree
        return trees
    for b in drafting:
        start = time.perf_counter()
        trees[b] = rows[b].generator.draft(rows[b].input_ids, max_depth=rooms[b], committed=rows[b].token_list,
                                           depth=plans[b].depth)
        seconds[b]["draft"] = time.perf_counter() - start
    return trees


def plan_rows(rows: list[_Run], root_probs: list[list[float] | None], lookups: list[list[int]], rooms: list[int],
              costs: VerifyCosts, probes: list[int], fixed: dict[int, Plan] | None = None) -> list[Plan]:
    """One plan per row, chosen together (`choose_options`) from each row's root probabilities (None: stale,
    `generator.root_probs`): rows `probes` probe, rows in `fixed` keep their plan, a row whose drafter has not
    caught up may draft only in the first round (`fixed` is None)."""
    first_round, fixed = fixed is None, dict(fixed or {})
    for probe in probes:
        if probe not in fixed:
            fixed[probe] = rows[probe].policy.probe(root_probs[probe], rooms[probe])
    menus = []
    for b, (row, probs, lookup, room) in enumerate(zip(rows, root_probs, lookups, rooms)):
        if b in fixed:  # forced: its drafting is not weighed, and the joint trim sizes its tree
            menus.append([Option(fixed[b], 1.0, 1)])
            continue
        menus.append(row.policy.options(probs, lookup, room, drafts=first_round or probs is not None))
    timings = rows[0].policy.timings
    stale = first_round and any(probs is None for b, probs in enumerate(root_probs) if b not in fixed)
    shared_catch_up = timings.catch_up_costs()[0] if stale else 0.0  # paid once by the rows catching up
    return [option.plan for option in choose_options(menus, costs, timings.level_costs()[0], shared_catch_up,
                                                     timings.overhead_cost())]


def choose_token(scores: torch.Tensor, do_sample: bool) -> int:
    """The target's pick from processed scores (V,): argmax, or a sample of softmax(scores)."""
    if do_sample:
        return int(torch.multinomial(torch.softmax(scores.float(), dim=-1), 1))
    return int(scores.argmax())


# model inputs the decoding loop passes on itself (what transformers prepares for every decoder-only call)
HANDLED_MODEL_INPUTS = ("attention_mask", "position_ids", "use_cache", "cache", "past_key_values", "logits_to_keep")


def check_generation_inputs(input_ids: torch.LongTensor, model_kwargs: dict, streamer: object | None = None,
                            logits_processor: LogitsProcessorList = ()) -> None:
    """Refuse, with what to do instead, what the speculative loop would not honour: a cache the user passed, model
    inputs it does not pass on, a streamer of a batch (generation settings: `hf_dynaspec.assisted_settings`)."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}.")
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: pass at least one token (e.g. the BOS token).")
    user_cache = [model_kwargs.get(name) for name in ("cache", "past_key_values")]
    if any(cache is not None and (getattr(cache, "_is_user_defined", False) or cache.get_seq_length() > 0)
           for cache in user_cache):
        raise ValueError(
            "A DynaSpec drafter decodes with a cache of its own (tree verification keeps and drops draft entries): "
            "drop `past_key_values`, or generate without `assistant_model`."
        )
    ignored = sorted(k for k, v in model_kwargs.items() if k not in HANDLED_MODEL_INPUTS and v is not None)
    if ignored:
        raise ValueError(
            f"The speculative loop passes only input_ids and the attention mask to the target; {ignored} would be "
            "dropped (e.g. a vision-language target's image inputs). Generate without `assistant_model` for them."
        )
    batch_aware = [type(p).__name__ for p in logits_processor if isinstance(p, PrefixConstrainedLogitsProcessor)]
    if batch_aware and input_ids.shape[0] > 1:
        raise ValueError(f"{batch_aware} reads each row's batch index, and the speculative loop walks one row at a "
                         "time: generate the rows one by one, or without `assistant_model`.")
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError("A streamer receives one sequence: with a DynaSpec drafter, stream a batch of one row "
                         "(or generate the batch without `streamer`).")


def warn_beyond_window(window: int | None, max_length: int | None) -> None:
    """A checkpoint's draft layer trained with a sliding window (speculators' default) attends in full here: say
    so when a call may read past the window (its drafts may then differ from its trainer's; output stays exact)."""
    if window and max_length and max_length > window:
        warnings.warn(
            f"The drafter's layer was trained with a {window}-token attention window (its checkpoint's "
            f"sliding_window) and attends in full here: up to {max_length} tokens in this call, so drafts past the "
            "window may differ from vLLM's. The output stays exact.", stacklevel=4,
        )


def build_output(batch: _Batch, generation_config: GenerationConfig) -> DynaSpecGenerateOutput | torch.LongTensor:
    """Every row's sequence, padded on the right with `pad_token_id` to the longest (as plain decoding pads rows
    that ended early); with `return_dict_in_generate`, scores / logits per step (B, V) (a row that had ended: the
    dtype's minimum, where plain decoding would have scored its padding) and the statistics of the call and of
    each row."""
    rows = batch.rows
    sequences = pad_rows([row.full_ids() for row in rows], generation_config)
    if not generation_config.return_dict_in_generate:
        return sequences
    if len(rows) == 1:
        stats, per_row = rows[0].stats.settle(), None
    else:
        per_row = [row.stats.settle() for row in rows]
        stats = SpeculativeStats.merged([batch.stats, *per_row])
    return DynaSpecGenerateOutput(
        sequences=sequences,
        scores=stack_steps([row.scores for row in rows]) if generation_config.output_scores else None,
        logits=stack_steps([row.raw_logits for row in rows]) if generation_config.output_logits else None,
        cache=batch.verifier.cache if len(rows) == 1 else None,
        speculative_stats=stats,
        speculative_stats_per_row=per_row,
    )


def pad_rows(sequences: list[torch.LongTensor], generation_config: GenerationConfig) -> torch.LongTensor:
    """Rows (1, L_b) -> (B, max L_b), right-padded with the pad token."""
    longest = max(s.shape[1] for s in sequences)
    if all(s.shape[1] == longest for s in sequences):
        return torch.cat(sequences)
    pad = generation_config.pad_token_id
    if pad is None:
        raise ValueError("Rows of the batch ended at different lengths and no pad_token_id is set: pass "
                         "pad_token_id=... (plain generate() pads with it too).")
    return torch.cat([torch.nn.functional.pad(s, (0, longest - s.shape[1]), value=int(pad)) for s in sequences])


def stack_steps(per_row: list[list[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Per-row lists of (1, V) per step -> per step (B, V); steps after a row ended hold the dtype's minimum."""
    steps = max(len(scores) for scores in per_row)
    template = next(scores[0] for scores in per_row if scores)
    filler = torch.full_like(template, torch.finfo(template.dtype).min)
    return tuple(torch.cat([scores[t] if t < len(scores) else filler for scores in per_row]) for t in range(steps))
