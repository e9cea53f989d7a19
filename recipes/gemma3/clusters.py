"""Cluster count and budgets for a 262,144-token vocabulary, measured before any drafter is trained.

For each cluster count M, the vocabulary is clustered as `hf-dynaspec init` does it (spherical k-means over the
target's LM-head rows) and a router of the drafter's shape (`ClusterRouter`) is trained alone, on the target's
features of the corpus (the three layers an EAGLE-3 drafter reads), to name the cluster of the next answer token
(the target's own greedy token: the corpus is self-distilled). On held-out conversations (the split `train`
uses) it reports, for each top-k budget, the recall (next token inside the shortlist) and the mean shortlist
size, beside a static frequency shortlist (FR-Spec) of the same size (results.md there and a generated block of
recipes/gemma3/training.md). A trained drafter's router reads the
drafter's own decoder input, not these features: this proxy ranks settings, the trained drafter's Spec-Bench
run gives the real figures.

    python recipes/gemma3/clusters.py --data runs/gemma3/features --out benchmarks/results/cpu-gemma3-clusters
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from hf_dynaspec.balanced_clusters import balanced_vocabulary  # noqa: E402
from hf_dynaspec.bench import write_doc_block  # noqa: E402
from hf_dynaspec.clustering import VocabClusters, cluster_vocabulary  # noqa: E402
from hf_dynaspec.machine import machine_description  # noqa: E402
from hf_dynaspec.router import ClusterRouter  # noqa: E402
from hf_dynaspec.targets import load_target  # noqa: E402
from hf_dynaspec.training.arguments import HELDOUT_FRACTION  # noqa: E402
from hf_dynaspec.training.data import load_dataset  # noqa: E402
from hf_dynaspec.training.trainer import split_heldout  # noqa: E402


def answer_positions(convs, max_positions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (n, k * d) float32 of at most `max_positions` positions drawn at random among those whose next
    token is an answer token, and that token (n,). Only the drawn rows are read from the memory maps."""
    where = [conv.loss_mask[1:].nonzero(as_tuple=True)[0] for conv in convs]  # positions t, x_{t+1} an answer
    owner = torch.cat([torch.full((len(w),), i) for i, w in enumerate(where)])  # (N,) conversation of each
    position = torch.cat(where)  # (N,)
    pick = torch.randperm(len(owner), generator=torch.Generator().manual_seed(seed))[:max_positions].sort().values
    owners, counts = torch.unique_consecutive(owner[pick], return_counts=True)  # pick sorted: owners grouped
    feats, labels = [], []
    for i, rows in zip(owners.tolist(), position[pick].split(counts.tolist())):  # rows (m,) ascending
        feats.append(torch.as_tensor(convs[i].features[rows]).float())  # (m, k * d)
        labels.append(convs[i].input_ids[rows + 1])  # (m,)
    return torch.cat(feats), torch.cat(labels)


def train_router(x: torch.Tensor, clusters_of_next: torch.Tensor, num_clusters: int, hidden: int, epochs: int,
                 batch_size: int = 2048, lr: float = 2e-3) -> ClusterRouter:
    """A router fitted alone: softmax cross-entropy on the next token's cluster (x standardised beforehand)."""
    torch.manual_seed(0)
    router = ClusterRouter(x.shape[1], hidden, num_clusters)
    optimizer = torch.optim.AdamW(router.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * ((len(x) + batch_size - 1) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    for _ in tqdm(range(epochs), desc=f"router M={num_clusters}", leave=False):
        for batch in torch.randperm(len(x)).split(batch_size):
            loss = F.cross_entropy(router(x[batch]), clusters_of_next[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return router


@torch.no_grad()
def shortlist_figures(router: ClusterRouter, x: torch.Tensor, clusters_of_next: torch.Tensor,
                      sizes: torch.Tensor, budgets: list[int], groups: torch.Tensor, names: list[str]) -> list[dict]:
    """Per top-k budget: recall (next token's cluster among the top k), overall and per group (groups (n,)
    indexes `names`), and mean shortlist size in tokens."""
    order = router(x).argsort(dim=-1, descending=True)  # (n, M) clusters, best first
    rows = []
    for k in budgets:
        top = order[:, :k]  # (n, k)
        hit = (top == clusters_of_next[:, None]).any(-1).float()  # (n,)
        rows.append({"k": k, "recall": hit.mean().item(), "mean_size": sizes[top].sum(-1).float().mean().item(),
                     "recall_by_group": {name: hit[groups == g].mean().item() for g, name in enumerate(names)
                                         if bool((groups == g).any())}})
    return rows


def static_recall(frequent: torch.Tensor, next_tokens: torch.Tensor, size: int) -> torch.Tensor:
    """(n,) whether each next token is among the `size` most frequent training answer tokens (frequent (V,):
    token ids, most frequent first)."""
    keep = torch.zeros(frequent.numel(), dtype=torch.bool)  # (V,)
    keep[frequent[:size]] = True
    return keep[next_tokens].float()


def held_positions(parts: list[list], max_positions: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Held-out (features, next tokens, group (n,)) drawn folder by folder, up to max_positions in all."""
    drawn = [answer_positions(part, max(1, max_positions // len(parts)), seed=1) for part in parts]
    groups = torch.cat([torch.full((len(y),), g) for g, (_, y) in enumerate(drawn)])
    return torch.cat([x for x, _ in drawn]), torch.cat([y for _, y in drawn]), groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", action="append", required=True, help="features folder(s) (hf-dynaspec features)")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--clusters", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--max-positions", type=int, default=200_000, help="training positions sampled")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--router-hidden", type=int, default=512)
    parser.add_argument("--target", default="gemma3", help="whose LM head is clustered ('tiny' to try the script)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--balanced", choices=("no", "yes", "both"), default="no",
                        help="equal-size clusters (balanced_clusters.py) instead of, or as well as, plain k-means")
    parser.add_argument("--group-budget", type=int, default=8, help="top-k of the per-folder recall table")
    parser.add_argument("--doc", type=Path, default=Path(__file__).with_name("training.md"),
                        help="markdown file for the generated block")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train, held, names = [], [], [Path(folder).name for folder in args.data]
    for folder in args.data:  # the split `hf-dynaspec train` makes, folder by folder
        part_train, part_held = split_heldout(load_dataset(folder), HELDOUT_FRACTION)
        train, held = train + part_train, held + [part_held]
    x_train, y_train = answer_positions(train, args.max_positions, seed=0)
    x_held, y_held, g_held = held_positions(held, args.max_positions)
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-4)
    x_train, x_held = (x_train - mean) / std, (x_held - mean) / std
    target, _ = load_target(args.target)
    weight = target.get_output_embeddings().weight.detach().float()  # (V, d)
    vocab = weight.shape[0]
    frequent = torch.argsort(torch.bincount(y_train, minlength=vocab), descending=True, stable=True)
    results = {"machine": machine_description(), "train_positions": len(y_train), "groups": names,
               "heldout_positions": len(y_held), "vocab_size": vocab, "settings": [],
               "group_budget": args.group_budget}
    kinds = {"no": [False], "yes": [True], "both": [False, True]}[args.balanced]
    for num_clusters in args.clusters:
        for balanced in kinds:
            t0 = time.perf_counter()
            cluster = balanced_vocabulary if balanced else cluster_vocabulary
            clusters: VocabClusters = cluster(weight, num_clusters, seed=0)
            seconds_kmeans = time.perf_counter() - t0
            router = train_router(x_train, clusters.cluster_of_token[y_train], num_clusters, args.router_hidden,
                                  args.epochs)
            rows = shortlist_figures(router, x_held, clusters.cluster_of_token[y_held], clusters.sizes(),
                                     args.budgets, g_held, names)
            for row in rows:
                static = static_recall(frequent, y_held, round(row["mean_size"]))  # (n,)
                row["static_recall_same_size"] = static.mean().item()
                row["static_recall_by_group"] = {name: static[g_held == g].mean().item()
                                                 for g, name in enumerate(names) if bool((g_held == g).any())}
            results["settings"].append({"num_clusters": num_clusters, "balanced": balanced,
                                        "kmeans_seconds": seconds_kmeans,
                                        "largest_cluster": int(clusters.sizes().max()), "budgets": rows})
            print(json.dumps(results["settings"][-1]))
    results["static_32768_recall"] = static_recall(frequent, y_held, 32768).mean().item()
    write_results(Path(args.out), results, args.doc)


def group_lines(results: dict) -> list[str]:
    """Recall per data folder (group) at the --group-budget top-k, router / static of the same size ("" for a
    single folder)."""
    names, k = results.get("groups", []), results.get("group_budget")
    if len(names) < 2:
        return []
    lines = ["", f"Recall per group at top-{k}, router / static list of the router's mean size:", "",
             "| clusters | equal sizes | mean shortlist | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for setting in results["settings"]:
        row = next((r for r in setting["budgets"] if r["k"] == k), None)
        if row is None:
            continue
        cells = " | ".join(f"{row['recall_by_group'][n]:.3f} / {row['static_recall_by_group'][n]:.3f}"
                           if n in row["recall_by_group"] else "-" for n in names)
        lines.append(f"| {setting['num_clusters']} | {'yes' if setting.get('balanced') else 'no'} | "
                     f"{row['mean_size']:,.0f} | {cells} |")
    return lines


def write_results(out: Path, results: dict, doc: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    vocab = results["vocab_size"]
    lines = [f"Router-only proxy on {results['heldout_positions']:,} held-out answer positions "
             f"({results['train_positions']:,} trained on), {results['machine']}. `python recipes/gemma3/clusters.py`",
             "", "| clusters | equal sizes | largest | top-k | mean shortlist | % of vocabulary | router recall | "
             "static recall, same size |", "|---|---|---|---|---|---|---|---|"]
    figure, axis = plt.subplots(figsize=(6, 4))
    for setting in results["settings"]:
        rows, balanced = setting["budgets"], setting.get("balanced", False)
        for row in rows:
            lines.append(f"| {setting['num_clusters']} | {'yes' if balanced else 'no'} | "
                         f"{setting['largest_cluster']:,} | {row['k']} | {row['mean_size']:,.0f} | "
                         f"{100 * row['mean_size'] / vocab:.1f}% | {row['recall']:.3f} | "
                         f"{row['static_recall_same_size']:.3f} |")
        axis.plot([r["mean_size"] for r in rows], [r["recall"] for r in rows], marker="o",
                  linestyle="--" if balanced else "-",
                  label=f"router, {setting['num_clusters']} clusters{', equal sizes' if balanced else ''}")
    lines += ["", f"Static shortlist of 32,768 tokens: recall {results['static_32768_recall']:.3f}."]
    lines += group_lines(results)
    rows = results["settings"][0]["budgets"]
    axis.plot([r["mean_size"] for r in rows], [r["static_recall_same_size"] for r in rows], "k--",
              label="static frequency shortlist")
    axis.set(xscale="log", xlabel="mean shortlist (tokens)", ylabel="recall of the next token",
             title=f"Next-token recall of shortlists, {vocab:,}-token vocabulary")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "recall_vs_size.png", dpi=120)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    write_doc_block(doc, "clusters", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
