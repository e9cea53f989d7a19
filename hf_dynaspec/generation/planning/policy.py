"""The step policy: before each decoding step, the tree worth verifying, down to no draft at all
(`step_policy="auto"`, the default; "off" drafts and verifies the whole configured tree every step).

Units: one plain decoding step (a target forward over one token) costs 1. A step that verifies the root and
draft nodes S costs c(|S| + 1) (`VerifyCosts`, the target's forward over that many tokens, measured once per
target by `calibration`) plus the drafter's work w and the step's own overhead o (everything of a step but
the target's forward and the drafter's: planning, building and walking the tree, emitting, the caches' commit;
every kind of step pays it, a plain one too), and emits on average

    E(S) = 1 + sum_{i in S} a_i         a_i = a_parent(i) * p_i,  a_root = 1

tokens (the 1: the target's own token after the last accepted one). p_i estimates the chance that the target
picks node i's token once the walk reaches its parent: min(1, kappa_d * q_i) for a drafter node at depth d (q_i
its draft probability given the parent, kappa_d the drafter's calibration at that depth on this sequence so
far, its recent steps weighted most: `Calibration`) and rho_d for a lookup node (the lookup branch's acceptance
rate at depth d so far, likewise). The policy maximises
expected tokens per unit of cost, E / (c + w + o), over three kinds of step:

- plain: the root alone, rate 1 / (c(1) + o) = 1 / (1 + o); the drafter reads the accepted tokens when it next
  drafts;
- lookup: the root and the best prefix of the lookup branch (prompt lookup), no drafter work;
- drafted: a tree of depth D (1..draft_depth), w = catch-up (the drafter reading the tokens accepted since it
  last drafted, one call) + (D - 1) expansions, each measured online in seconds and divided by a plain step's
  seconds (a verification's seconds / c(n), also online; o likewise, from each step's seconds left over once
  its verification and drafting are taken out: small beside a CPU's forward, not beside a GPU's). Without o a
  plain step looks cheaper than it is next to a drafted one. Before drafting, E for depth D is predicted from the
  root's proposals (A_1 = sum of the root children's p_i, known once the drafter has caught up; else its recent
  mean) scaled by what trees of this sequence kept per depth so far (`DepthProfile`).

After drafting, `trim` keeps the best-ranked m* nodes (the drafter's work is spent: only c and o count),

    m* = argmax_m  (1 + a_(1) + ... + a_(m)) / (c(m + 1) + o)      a_(1) >= a_(2) >= ...  (a parent ranks first)

and `record` updates kappa / rho from the nodes the walk tested, the costs from the step's seconds, and the
predicted (E of the verified tree) against the realised accepted length (`speculative_stats`). A drafted step is
also forced after `probe_gap` undrafted steps, so estimates frozen by plain steps are refreshed; the gap starts at
`probe_every`, doubles after each probe that the trim cut to the root (it paid for drafting and tested nothing),
up to `MAX_PROBE_GAP`, and is back at `probe_every` once a step verifies drafts: where no draft is worth
verifying, looking for one costs less and less. Verification never trusts a draft: output is exact whatever the
policy decides.

A batch of B rows is one decision, not B: one forward verifies every row's tree padded to a block of N tokens
per row (c = c_B(N), measured at that batch size), and the drafting rows grow their trees in lockstep
(`lockstep`: one drafter forward per round for all of them; a round for S rows costs s + S u, the line through
the rounds timed so far), so the batch maximises

    sum_b E_b / (c_B(N) + o + [D >= 1] s_c + (D - 1) s + sum_b w_b)        N = max_b n_b,  D = max_b depth_b

over one option per row (`choose_options`; o: the batch's step overhead, one per step; w_b: the row's share of
the catch-up and its (depth_b - 1) u; the catch-up's shared part s_c is paid once too; where rows draft one after
another, nothing is shared and u is one row's round); trimming keeps a common block (`trim_trees`: below it, a
row's nodes are free), and the rows due a probe probe together where they draft in lockstep, else one per step
(`probing_rows`). The depth profile learns from what each row's own trim keeps of its drafted tree, not the
batch's (a lone drafting row's tree is cut by a block every row pays for). With one row all of this reduces to
the rules above.

    python -m pytest tests/test_policy.py -q
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..drafting.tree import VerifyTree, close_under_ancestors, subtree
from .step_arms import StepArms

PROBE_EVERY = 8  # undrafted steps in a row before a drafted step refreshes the estimates
MAX_PROBE_GAP = 8 * PROBE_EVERY  # the longest probe gap, while probes keep being trimmed to the root (`StepPolicy.gap`)
MIN_SEEN = 3  # verifications of one size before their seconds correct the measured cost of that size
STALE_AFTER = 64  # verifications (of any size) after which a size's observed cost, not seen since, is forgotten
DECAY = 0.8  # weight of the old value in the running means of costs and per-depth profiles
CARRY_WEIGHT = 64.0  # tested nodes per depth that an earlier call's calibration is worth in the next call
CALIBRATION_DECAY = 0.85  # weight of the counts so far at each step that tests drafts (a sequence's acceptance drifts)
DRAFT_PRIOR_WEIGHT = 1.0  # observations a depth's kappa prior (the depth above's kappa; kappa_0 = 1) is worth
LOOKUP_PRIOR_WEIGHT = 0.5  # observations a depth's rho prior (the depth above's rho; rho_0 = 1/2) is worth


def batch_bucket(batch: int) -> int:
    """The power of two at or above `batch` (1, 2, 4, 8, ...): the batch sizes costs are measured at."""
    return 1 << max(0, batch - 1).bit_length()


def are_positive_costs(values: object) -> bool:
    """A non-empty list / tuple of positive finite numbers (booleans refused): a valid cost table c(1), c(2), ..."""
    return isinstance(values, (list, tuple)) and len(values) > 0 and all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0 for c in values
    )


@dataclass(frozen=True)
class VerifyCosts:
    """c(n): the cost of a target forward over n tokens in decoding steps (c(1) = 1 after normalising).
    Beyond the measured sizes c grows by its last step (never shrinks)."""

    costs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not are_positive_costs(self.costs):
            raise ValueError(f"verify costs must be positive finite numbers c(1), c(2), ..., got {self.costs!r}.")

    def __call__(self, n: int) -> float:
        known = len(self.costs)
        if n <= known:
            return float(self.costs[n - 1])
        slope = max(0.0, self.costs[-1] - self.costs[-2]) if known > 1 else 0.0
        return float(self.costs[-1] + (n - known) * slope)


def relaid_costs(costs: VerifyCosts, unit: float, old: Sequence[float], new: Sequence[float]) -> VerifyCosts:
    """c(n) once verification applies the LM head to its walk rows in another layout: each forward's seconds,
    c(n) * `unit` (`unit`: seconds of c(1)), less the `old` layout's head seconds for its w = min(n, R) walk rows,
    plus the `new` one's, over the same for n = 1 (`old` / `new`: seconds for 1..R walk rows). Non-decreasing."""
    def seconds(n: int) -> float:
        w = min(n, len(old))
        return max(costs(n) * unit - old[w - 1] + new[w - 1], 1e-3 * unit)

    base, table = seconds(1), [1.0]
    for n in range(2, len(costs.costs) + 1):
        table.append(max(table[-1], seconds(n) / base))
    return VerifyCosts(tuple(table))


@dataclass
class Calibration:
    """Per depth d (1-based): drafter nodes tested (sum of q) and accepted -> kappa_d; lookup nodes tested and
    accepted -> rho_d. Each depth's prior is the depth above's estimate (kappa_0 = 1: trust q, worth
    `draft_weight` observations; rho_0 = 1/2, worth `lookup_weight`): a depth seldom reached starts from the rate
    of the one above it, not from a fixed guess that a long accepted chain would contradict at every depth. The
    lookup prior is worth half an observation: along a copied passage the chance that the next token is accepted
    too grows with depth, and with the recent-weighted counts below a deep depth holds few observations, so a
    heavier pull toward the depth above under-predicted long chains (replays of logged steps per prior weight:
    `benchmarks/calibration_replay.py`, benchmarks/results/cpu-*-calibration-replay).

    The counts are weighted toward the sequence's recent steps: before each step that tests drafts, the counts so
    far are multiplied by `decay` (an exponential memory of about 1 / (1 - decay) such steps). How often the target
    agrees with the drafter drifts along a sequence (a list, a repeated passage, a change of subject): rates pooled
    over the whole sequence mispredict a run's accepted length by far more than recent ones (replays of logged
    steps per decay: `benchmarks/calibration_replay.py`, benchmarks/results/cpu-smollm2-calibration-replay)."""

    drafted_expected: dict[int, float] = field(default_factory=dict)
    drafted_accepted: dict[int, float] = field(default_factory=dict)
    lookup_tested: dict[int, float] = field(default_factory=dict)
    lookup_accepted: dict[int, float] = field(default_factory=dict)
    decay: float = CALIBRATION_DECAY
    draft_weight: float = DRAFT_PRIOR_WEIGHT
    lookup_weight: float = LOOKUP_PRIOR_WEIGHT

    def kappa(self, depth: int) -> float:
        return shrunk_rate(self.drafted_accepted, self.drafted_expected, depth, prior=1.0, weight=self.draft_weight)

    def rho(self, depth: int) -> float:
        return shrunk_rate(self.lookup_accepted, self.lookup_tested, depth, prior=0.5, weight=self.lookup_weight)

    def update(self, tree: VerifyTree, path: Sequence[int]) -> None:
        """Count the nodes whose parent is on the accepted `path`: each was tested by the target (the counts so
        far weighted by `decay` first; a root alone tests nothing and changes nothing)."""
        if tree.num_nodes == 1:
            return
        for counts in (self.drafted_expected, self.drafted_accepted, self.lookup_tested, self.lookup_accepted):
            for depth in counts:
                counts[depth] *= self.decay
        on_path = set(path)
        q = conditional_draft_probs(tree)
        for node in range(1, tree.num_nodes):
            if tree.parent_list[node] not in on_path:
                continue
            depth, accepted = tree.depth_list[node], float(node in on_path)
            tested, hits = ((self.lookup_tested, self.lookup_accepted) if tree.grafted_list[node]
                            else (self.drafted_expected, self.drafted_accepted))
            tested[depth] = tested.get(depth, 0.0) + (1.0 if tree.grafted_list[node] else q[node])
            hits[depth] = hits.get(depth, 0.0) + accepted

    def carried(self, weight: float = CARRY_WEIGHT) -> Calibration:
        """This calibration as the prior of the next call: per depth and source, the counts scaled down to at
        most `weight` tested (the rates kept, their weight bounded so that a new sequence moves them)."""
        def scaled(tested: dict[int, float], hits: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
            factor = {d: min(1.0, weight / n) if n > 0 else 1.0 for d, n in tested.items()}
            return ({d: n * factor[d] for d, n in tested.items()},
                    {d: h * factor.get(d, 1.0) for d, h in hits.items()})
        drafted = scaled(self.drafted_expected, self.drafted_accepted)
        lookup = scaled(self.lookup_tested, self.lookup_accepted)
        return Calibration(*drafted, *lookup, decay=self.decay, draft_weight=self.draft_weight,
                           lookup_weight=self.lookup_weight)


def shrunk_rate(hits: dict[int, float], tested: dict[int, float], depth: int, prior: float, weight: float) -> float:
    """r_d = (weight * r_(d-1) + hits_d) / (weight + tested_d), r_0 = prior: each depth shrunk toward the one
    above it."""
    rate = prior
    for d in range(1, depth + 1):
        rate = (weight * rate + hits.get(d, 0.0)) / (weight + tested.get(d, 0.0))
    return rate


def conditional_draft_probs(tree: VerifyTree) -> list[float]:
    """q_i = q(path to i) / q(path to parent) for every node (n,) (1 at the root and at lookup nodes)."""
    log_q, parents = tree.log_q_list, tree.parent_list
    return [math.exp(log_q[i] - log_q[max(parents[i], 0)]) for i in range(len(log_q))]


def acceptance_estimates(tree: VerifyTree, calibration: Calibration) -> list[float]:
    """a_i = a_parent * p_i for every node (n,), a_0 = 1 (module docstring)."""
    q = conditional_draft_probs(tree)
    a = [1.0] * tree.num_nodes
    for node in range(1, tree.num_nodes):  # parents precede children
        depth = tree.depth_list[node]
        p = calibration.rho(depth) if tree.grafted_list[node] else min(1.0, calibration.kappa(depth) * q[node])
        a[node] = a[tree.parent_list[node]] * p
    return a


def accepted_variance(tree: VerifyTree, a: Sequence[float]) -> float:
    """Var(L) of the accepted length L = 1 + sum_i X_i under the estimates a (n,) (`acceptance_estimates`): X_i = 1
    when node i is accepted, E[X_i] = a_i; a node is accepted only with all its ancestors and never beside a
    sibling (one path), so E[X_i X_j] = a_i for j an ancestor of i (or i itself), 0 otherwise, and

        E[(L - 1)^2] = sum_i a_i (2 d_i - 1),     Var(L) = sum_i a_i (2 d_i - 1) - (sum_i a_i)^2      (i >= 1)"""
    drafts = range(1, tree.num_nodes)
    mean = sum(a[i] for i in drafts)
    return max(0.0, sum(a[i] * (2 * tree.depth_list[i] - 1) for i in drafts) - mean * mean)


def trim(tree: VerifyTree, costs: VerifyCosts, calibration: Calibration, overhead: float = 0.0
         ) -> tuple[VerifyTree, float]:
    """The subtree of the best-ranked m* nodes, and its expected accepted length E (module docstring; one row of
    `trim_trees`)."""
    return trim_trees([tree], costs, [calibration], overhead)[0]


@dataclass
class Running:
    """An exponential running mean (None until the first value)."""

    value: float | None = None
    count: int = 0

    def add(self, x: float, decay: float = DECAY) -> None:
        self.value = x if self.value is None else decay * self.value + (1.0 - decay) * x
        self.count += 1


@dataclass
class Timings:
    """The drafter's and the target's seconds as the policy measures them online (running means): a plain step
    (a verification's seconds / c(n)), and per number of rows doing it together, a catch-up and one round of
    drafter expansions. They belong to the drafter and target, not to a sequence: the rows of a batch share one.
    `together`: the rows of a step catch up and draft in lockstep (`lockstep.drafts_together`: one forward for
    all), else one after another."""

    plain: Running = field(default_factory=Running)
    catch_ups: dict[int, Running] = field(default_factory=dict)  # rows catching up together -> seconds
    levels: dict[int, Running] = field(default_factory=dict)  # rows drafting together -> seconds of one round
    together: bool = True
    unit: dict[int, Running] = field(default_factory=dict)  # rows -> seconds of a verification of one token
    ratio: dict[tuple[int, int], Running] = field(default_factory=dict)  # (bucket, n) -> observed c(n)
    shapes: set[tuple[int, int]] = field(default_factory=set)  # (rows, n) verified at least once
    verifications: int = 0  # verifications observed so far
    seen_at: dict[tuple[int, int], int] = field(default_factory=dict)  # (bucket, n) -> verification last seen
    overhead: Running = field(default_factory=Running)  # seconds of a step outside its forward and drafting
    head_layout: str | None = None  # the LM head layout its verifications were observed in (None: not followed)
    arms: StepArms = field(default_factory=StepArms)  # the policy's steps against the whole tree's (`step_arms`)

    def observe(self, rows: int, nodes: int, seconds: float) -> None:
        """A verification of `nodes` tokens per row for `rows` rows took `seconds`: one token's seconds at this
        many rows, and, once those are known, c(n) as observed at the rows' batch bucket (the measured table's).
        The first verification of each shape is not counted: it pays the kernels' one-time setup for that shape
        (on a CPU, several times a later one's seconds). An observed c(n) not seen for `STALE_AFTER` verifications
        starts afresh when next seen (`fresh_ratio`)."""
        self.verifications += 1
        if (rows, nodes) not in self.shapes:
            self.shapes.add((rows, nodes))
            return
        if nodes == 1:
            self.unit.setdefault(rows, Running()).add(seconds)
            return
        unit = self.unit.get(rows)
        if unit is not None and unit.count >= MIN_SEEN:
            key = (batch_bucket(rows), nodes)
            if self.fresh_ratio(key) is None:
                self.ratio[key] = Running()
            self.ratio[key].add(seconds / unit.value)
            self.seen_at[key] = self.verifications

    def forget_verifications(self, layout: str | None) -> None:
        """Verification now applies the LM head in `layout` (`decoding.follow_learned_layout`): the verification
        costs observed under another layout are forgotten; plain-step seconds and the drafter's timings are
        kept."""
        if layout == self.head_layout:
            return
        self.head_layout = layout
        self.unit.clear()
        self.ratio.clear()
        self.seen_at.clear()

    def fresh_ratio(self, key: tuple[int, int]) -> Running | None:
        """The observed c(n) at (bucket, n), unless it was last seen more than `STALE_AFTER` verifications ago. The
        policy picks sizes by their costs, so a cost observed too high (a burst of load on the machine, a step that
        paid for more walk rows than most) would keep its size from ever being verified, and corrected, again:
        forgotten, the size is priced from the measurement until verifications of it are seen anew."""
        seen = self.ratio.get(key)
        if seen is None or self.verifications - self.seen_at.get(key, 0) > STALE_AFTER:
            return None
        return seen

    def costs(self, measured: VerifyCosts, rows: int) -> VerifyCosts:
        """The measured c(n) corrected by what this call's verifications took: at each n seen `MIN_SEEN` times at
        this batch bucket (and lately: `fresh_ratio`), the observed c(n); between and beyond them, the measured
        c(n) times the ratio at the nearest n seen below (the measurement's shape, the observed level). A cold
        first-call measurement is rough: the steps themselves correct it."""
        bucket, table, scale = batch_bucket(rows), [1.0], 1.0
        for n in range(2, len(measured.costs) + 1):
            seen = self.fresh_ratio((bucket, n))
            if seen is not None and seen.count >= MIN_SEEN:
                scale = seen.value / measured(n)
            table.append(max(table[-1], measured(n) * scale))
        return VerifyCosts(tuple(table))

    def observe_overhead(self, seconds: float) -> None:
        """A step's seconds outside the target's forward and the drafter's work (planning, trees, walk, emit,
        commit). The first step's is not counted: it pays one-time setup of its own."""
        if self.plain.value is not None:
            self.overhead.add(max(0.0, seconds))

    def overhead_cost(self) -> float:
        """o: a step's overhead in plain steps (0 before a step is measured)."""
        if self.overhead.value is None or not self.plain.value:
            return 0.0
        return self.overhead.value / self.plain.value

    def observe_level(self, rows: int, seconds: float) -> None:
        """One round of expansions for `rows` rows drafting together took `seconds`."""
        self.levels.setdefault(rows, Running()).add(seconds)

    def observe_catch_up(self, rows: int, seconds: float) -> None:
        """`rows` rows reading their accepted paths together took `seconds`."""
        self.catch_ups.setdefault(rows, Running()).add(seconds)

    def level_costs(self) -> tuple[float, float]:
        """(shared, per row): one round of expansions for S rows costs shared + S * per_row plain steps (`line`)."""
        return self.line(self.levels)

    def catch_up_costs(self) -> tuple[float, float]:
        """(shared, per row): S rows catching up cost shared + S * per_row plain steps (`line`)."""
        return self.line(self.catch_ups)

    def line(self, seen: dict[int, Running]) -> tuple[float, float]:
        """(shared, per row) in plain steps from seconds seen per row count. Together: the line through them, least
        squares over the row counts (one count seen: all of it shared); one row after another: nothing shared.
        (0, 0) before anything is measured."""
        if not seen or not self.plain.value:
            return 0.0, 0.0
        points = sorted((rows, running.value / self.plain.value) for rows, running in seen.items())
        if not self.together:
            return 0.0, points[0][1] / points[0][0]
        mean_rows = sum(r for r, _ in points) / len(points)
        mean_cost = sum(c for _, c in points) / len(points)
        spread = sum((r - mean_rows) ** 2 for r, _ in points)
        slope = max(0.0, sum((r - mean_rows) * (c - mean_cost) for r, c in points) / spread) if spread else 0.0
        return max(0.0, mean_cost - slope * mean_rows), slope



@dataclass
class DepthProfile:
    """What drafted trees of this sequence kept per depth d (running means): the expected accepted drafter
    tokens at d per unit of A_1 (the root children's mass), and the drafter nodes kept at d."""

    mass: dict[int, Running] = field(default_factory=dict)
    nodes: dict[int, Running] = field(default_factory=dict)
    root_mass: Running = field(default_factory=Running)  # A_1 of recent drafted steps

    def add(self, tree: VerifyTree, a: Sequence[float], root_mass: float, depth: int) -> None:
        """A verified tree drafted `depth` deep, its estimates a (n,) and the A_1 it was drafted from."""
        per_mass = {d: 0.0 for d in range(1, depth + 1)}
        per_nodes = dict(per_mass)
        for node in range(1, tree.num_nodes):
            d = tree.depth_list[node]
            if not tree.grafted_list[node] and d in per_mass:
                per_mass[d] += a[node] / max(root_mass, 1e-6)
                per_nodes[d] += 1.0
        for d in per_mass:
            self.mass.setdefault(d, Running()).add(per_mass[d])
            self.nodes.setdefault(d, Running()).add(per_nodes[d])
        self.root_mass.add(root_mass)

    def predict(self, depth: int, root_mass: float) -> tuple[float, float]:
        """(expected accepted drafter tokens, drafter nodes) of a tree `depth` deep from this A_1."""
        mass = sum(self.mass[d].value for d in range(1, depth + 1) if d in self.mass)
        nodes = sum(self.nodes[d].value for d in range(1, depth + 1) if d in self.nodes)
        return root_mass * mass, nodes


@dataclass(frozen=True)
class Plan:
    """One step's choice: kind "plain", "lookup" or "draft"; the draft depth; the lookup tokens to graft
    (lookup steps) and A_1, the root children's mass it was planned with (drafted steps)."""

    kind: str
    depth: int = 0
    lookup: tuple[int, ...] = ()
    root_mass: float = 0.0
    probe: bool = False  # a forced drafted step at full depth (refreshes the estimates; not re-planned)


@dataclass(frozen=True)
class Option:
    """A step a row may take: its plan, the tokens it is expected to emit (E), the tree tokens it verifies (n,
    the root included) and the drafter's work it costs this row alone (w, in plain steps: its catch-up and its
    share of each round of expansions; the rounds' shared part is the batch's, `choose_options`)."""

    plan: Plan
    expected: float
    nodes: int
    work: float = 0.0


def choose_options(menus: Sequence[Sequence[Option]], costs: VerifyCosts, shared_level: float = 0.0,
                   shared_catch_up: float = 0.0, overhead: float = 0.0) -> list[Option]:
    """One option per row (each menu non-empty), maximising the batch's expected tokens per unit of cost

        R = sum_b E_b / (c(N) + o + [D >= 1] s_c + (D - 1) s + sum_b w_b)        N = max_b n_b,  D = max_b depth_b

    (one forward runs every row's tree padded to N tokens; every step pays the `overhead` o once; the drafting
    rows catch up together, costing `shared_catch_up` s_c once plus each stale row's share, and grow their trees
    in D - 1 rounds, each costing `shared_level` s once plus each row's share; the shares are in w). For each
    block size N and deepest draft D, Dinkelbach's iteration: every row takes argmax E - R w over its options with
    n <= N and depth <= D, R the rate of the last choice, until R stops rising (the exact optimum for that N and
    D). One row: argmax E / (c(n) + o + (depth - 1) s + w)."""
    best: list[Option] = [min(menu, key=lambda o: o.nodes) for menu in menus]
    best_rate = 0.0
    depths = sorted({o.plan.depth for menu in menus for o in menu})
    for block in sorted({o.nodes for menu in menus for o in menu}):
        by_block = [[o for o in menu if o.nodes <= block] for menu in menus]
        for deepest in depths:
            fitting = [[o for o in menu if o.plan.depth <= deepest] for menu in by_block]
            if not all(fitting):
                continue
            fixed = (costs(block) + overhead + max(0, deepest - 1) * shared_level
                     + (shared_catch_up if deepest >= 1 else 0.0))
            rate = 0.0
            while True:
                picks = [max(menu, key=lambda o: o.expected - rate * o.work) for menu in fitting]
                new = sum(o.expected for o in picks) / (fixed + sum(o.work for o in picks))
                if new <= rate * (1.0 + 1e-12):
                    break
                rate = new
                if rate > best_rate:
                    best, best_rate = picks, rate
    return best


def trim_trees(trees: Sequence[VerifyTree], costs: VerifyCosts, calibrations: Sequence[Calibration],
               overhead: float = 0.0) -> list[tuple[VerifyTree, float]]:
    """Every row's tree cut to what the batch's verification pays for, each with its expected accepted length E.
    The drafter's work is spent: only the forward's cost c(N) and the step's `overhead` o count, for a block of N
    tokens per row,

        N* = argmax_N  sum_b E_b(N) / (c(N) + o)     E_b(N) = 1 + a_(1) + ... + a_(N - 1) of row b's ranked nodes

    Below the block a node is free, so each row keeps its best-ranked min(N* - 1, m_b) nodes (a parent ranks
    before its children; a lookup chain keeps a prefix). One row: m* = argmax_m (1 + a_(1..m)) / (c(m + 1) + o)."""
    ranked = []
    for tree, calibration in zip(trees, calibrations):
        a = acceptance_estimates(tree, calibration)
        order = sorted(range(1, tree.num_nodes), key=lambda i: (-a[i], tree.depth_list[i], i))
        ranked.append((order, [a[i] for i in order]))
    largest = max(1 + len(order) for order, _ in ranked)

    def total(block: int) -> float:
        return sum(1.0 + sum(gains[: block - 1]) for _, gains in ranked)

    block = max(range(1, largest + 1), key=lambda n: (total(n) / (costs(n) + overhead), -n))
    result = []
    for tree, (order, gains) in zip(trees, ranked):
        keep = close_under_ancestors(tree.parent_list, order[: block - 1])
        result.append((subtree(tree, [0, *keep]), 1.0 + sum(gains[: len(keep)])))
    return result


def probing_rows(policies: Sequence[StepPolicy], rooms: Sequence[int], quiet_steps: int) -> list[int]:
    """The rows whose step is a forced probe. A row probes while the drafter's cost is unknown or after many
    shallow drafts; a row whose estimates plain steps froze, once the batch has gone the row's probe gap
    (`StepPolicy.gap`) without any row drafting (`quiet_steps`), so that no row probes while drafting pays. Rows
    drafting in lockstep (`Timings.together`) probe together: every row due, for about the drafting of one. Rows
    drafting one after another probe one at a time (a probe's drafting delays every row): the most overdue, so a
    batch of B rows probes each row every B * gap steps."""
    due = [b for b, (policy, room) in enumerate(zip(policies, rooms)) if room >= 1 and policy.probe_due()]
    urgent = [b for b in due if not policies[b].timings.levels
              or policies[b].shallow >= 2 * policies[b].probe_every]  # unmeasured, or drafting only shallow
    together = policies[0].timings.together
    if urgent:
        return urgent if together else urgent[:1]
    due = [b for b in due if quiet_steps >= policies[b].gap()]
    if not due:
        return []
    return due if together else [max(due, key=lambda b: policies[b].undrafted)]


@dataclass
class StepPolicy:
    """The policy of one row of a generate() call (module docstring): `options` (or `plan`, for one row) before a
    step, `record` the verified step. Costs are in plain steps; seconds come from the
    caller."""

    costs: VerifyCosts
    max_depth: int  # the drafter's configured depth
    probe_every: int = PROBE_EVERY
    calibration: Calibration = field(default_factory=Calibration)
    profile: DepthProfile = field(default_factory=DepthProfile)
    timings: Timings = field(default_factory=Timings)
    undrafted: int = 0  # steps since the last drafted one
    shallow: int = 0  # drafted steps since the last one at full depth
    probe_gap: int = 0  # undrafted steps before a probe (0: `probe_every`); doubles per probe trimmed away

    def carried(self) -> StepPolicy:
        """A policy for the next call of the same drafter, target and settings: what this one learned (the
        calibration, as a bounded prior; the depth profile and the timings) kept, its step counters reset."""
        return StepPolicy(
            costs=self.costs, max_depth=self.max_depth, probe_every=self.probe_every,
            calibration=self.calibration.carried(), profile=copy.deepcopy(self.profile),
            timings=copy.deepcopy(self.timings),
        )

    def probe_due(self) -> bool:
        """Whether a forced probe is due: the drafter's cost unknown, estimates frozen by `gap()` undrafted steps,
        or too many shallow drafts since the last one at full depth."""
        return (not self.timings.levels or self.undrafted >= self.gap()
                or self.shallow >= 2 * self.probe_every)

    def gap(self) -> int:
        """Undrafted steps before the next probe: `probe_every`, doubled per probe trimmed to the root since the last
        drafted step that verified drafts."""
        return self.probe_gap or self.probe_every

    def plan(self, root_probs: Sequence[float] | None, lookup: Sequence[int], room: int) -> Plan:
        """One row's best step (`options`, `choose_options`), or a probe when one is due (`probing_rows`: for one
        row, the batch's quiet steps are its undrafted ones)."""
        if probing_rows([self], [room], self.undrafted):
            return self.probe(root_probs, room)
        menu, costs = [self.options(root_probs, lookup, room)], self.current_costs()
        shared_catch_up = self.timings.catch_up_costs()[0] if root_probs is None else 0.0
        return choose_options(menu, costs, self.timings.level_costs()[0], shared_catch_up,
                              self.timings.overhead_cost())[0].plan

    def current_costs(self, rows: int = 1) -> VerifyCosts:
        """c(n) at this batch size as measured, corrected by the call's own verifications (`Timings.costs`)."""
        return self.timings.costs(self.costs, rows)

    def probe(self, root_probs: Sequence[float] | None, room: int) -> Plan:
        """A forced drafted step at full depth (within `room`)."""
        return Plan("draft", min(self.max_depth, room), root_mass=self._root_mass(root_probs), probe=True)

    def options(self, root_probs: Sequence[float] | None, lookup: Sequence[int], room: int,
                drafts: bool = True) -> list[Option]:
        """The steps this row may take, given the root's draft probabilities (None: the drafter has not read the
        latest tokens, and drafting pays for that catch-up), the lookup branch and `room` (drafts a path may still
        hold): plain, each prefix of the lookup branch, and (with `drafts`, once the drafter's cost is measured)
        a drafted tree per depth, its E predicted from A_1 and the depth profile. A drafted step planned without
        the root's probabilities is planned again after the catch-up (`decoding.choose_trees`)."""
        options = [Option(Plan("plain"), 1.0, 1)]
        if room < 1:
            return options
        lookup_gains = self._lookup_gains(lookup[:room])
        for k in range(1, len(lookup_gains) + 1):
            options.append(Option(Plan("lookup", lookup=tuple(lookup[:k])), 1.0 + sum(lookup_gains[:k]), 1 + k))
        if not drafts or not self.timings.levels:
            return options
        root_mass = self._root_mass(root_probs)
        work = self.timings.catch_up_costs()[1] if root_probs is None else 0.0  # the shared parts: the batch's
        _, per_row = self.timings.level_costs()
        lookup_share = sum(lookup_gains) * (1.0 - min(1.0, root_mass))  # where the root's drafts miss
        for depth in range(1, min(self.max_depth, room) + 1):
            gain, nodes = self.profile.predict(depth, root_mass)
            options.append(Option(Plan("draft", depth, root_mass=root_mass), 1.0 + gain + lookup_share,
                                  1 + round(nodes) + len(lookup_gains), work))
            work += per_row
        return options

    def expected(self, tree: VerifyTree) -> float:
        """E of a tree verified whole (lookup and plain steps)."""
        return sum(acceptance_estimates(tree, self.calibration))

    def spread(self, tree: VerifyTree) -> float:
        """Var of the accepted length of a tree about to be verified, under this row's estimates
        (`accepted_variance`): the noise its prediction expects of one step."""
        return accepted_variance(tree, acceptance_estimates(tree, self.calibration))

    def record(self, plan: Plan, tree: VerifyTree, path: Sequence[int], seconds: dict[str, float],
               verified: int | None = None, rows: int = 1, drafting: int = 1, drafted: VerifyTree | None = None,
               catching: int = 1) -> None:
        """After verification of `tree`: `seconds` of "verify" and, on drafted steps, "catch_up" (for `catching`
        rows together) and "draft" (its rounds of expansions, `plan.depth - 1`, for `drafting` rows in lockstep);
        `verified`: the nodes per row the forward ran for `rows` rows (a batch pads every row's tree to the
        largest; None: this tree's). A batch's rows share their timings: record the verification once per step
        (`seconds` without "verify" for the other rows), and rows working together their catch-up and rounds once
        (one row's `seconds`: the deepest row's rounds). `drafted`: the tree
        as drafted, before the batch's trim (None: `tree`); the depth profile keeps what this row's own trim at
        this batch size keeps of it, what drafting gives the row whatever the other rows did this step."""
        timings, nodes = self.timings, verified or tree.num_nodes
        if "verify" in seconds:
            timings.plain.add(seconds["verify"] / self.current_costs(rows)(nodes))
            timings.observe(rows, nodes, seconds["verify"])
        if plan.kind == "draft":
            own = (tree if drafted is None else
                   trim(drafted, self.current_costs(rows), self.calibration, timings.overhead_cost())[0])
            self.profile.add(own, acceptance_estimates(own, self.calibration), plan.root_mass, plan.depth)
            if "catch_up" in seconds:
                timings.observe_catch_up(catching, seconds["catch_up"])
            if "draft" in seconds and plan.depth > 1:
                timings.observe_level(drafting, seconds["draft"] / (plan.depth - 1))
            elif not timings.levels and plan.depth <= 1:  # no rounds: depth 1 drafts cost no expansion
                timings.observe_level(drafting, 0.0)
            self.undrafted = 0
            self.shallow = 0 if plan.depth >= self.max_depth else self.shallow + 1
            self.probe_gap = self.next_gap(plan, tree)
        else:
            self.undrafted += 1
        self.calibration.update(tree, path)

    def next_gap(self, plan: Plan, tree: VerifyTree) -> int:
        """The probe gap after a drafted step verifying `tree`: `probe_every` (0) once drafts were verified; twice
        the gap (up to `MAX_PROBE_GAP`) after a probe that the trim cut to the root (its drafting spent, no draft
        tested: with the root's fresh proposals the policy itself found no draft worth verifying); else as it
        was."""
        if tree.num_nodes > 1:
            return 0
        return min(2 * self.gap(), MAX_PROBE_GAP) if plan.probe else self.probe_gap

    def _root_mass(self, root_probs: Sequence[float] | None) -> float:
        """A_1: sum of min(1, kappa_1 q) over the root's children (capped at 1), or its recent mean when the
        drafter has not read the latest tokens."""
        if root_probs is None:
            recent = self.profile.root_mass.value
            return 1.0 if recent is None else recent
        return min(1.0, sum(min(1.0, self.calibration.kappa(1) * q) for q in root_probs))

    def _lookup_gains(self, lookup: Sequence[int]) -> list[float]:
        """a of each lookup token along its chain (rho_1, rho_1 rho_2, ...)."""
        gains, a = [], 1.0
        for depth in range(1, len(lookup) + 1):
            a *= self.calibration.rho(depth)
            gains.append(a)
        return gains
