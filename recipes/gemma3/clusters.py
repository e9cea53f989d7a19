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

from hf_dynaspec.bench import machine_description, write_doc_block  # noqa: E402
from hf_dynaspec.clustering import VocabClusters, cluster_vocabulary  # noqa: E402
from hf_dynaspec.router import ClusterRouter  # noqa: E402
from hf_dynaspec.targets import load_target  # noqa: E402
from hf_dynaspec.training.data import load_dataset  # noqa: E402
from hf_dynaspec.training.trainer import HELDOUT_FRACTION, split_heldout  # noqa: E402


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
                      sizes: torch.Tensor, budgets: list[int]) -> list[dict]:
    """Per top-k budget: recall (next token's cluster among the top k) and mean shortlist size in tokens."""
    order = router(x).argsort(dim=-1, descending=True)  # (n, M) clusters, best first
    rows = []
    for k in budgets:
        top = order[:, :k]  # (n, k)
        recall = (top == clusters_of_next[:, None]).any(-1).float().mean().item()
        rows.append({"k": k, "recall": recall, "mean_size": sizes[top].sum(-1).float().mean().item()})
    return rows


def static_recall(frequent: torch.Tensor, next_tokens: torch.Tensor, size: int) -> float:
    """Recall of the `size` most frequent training answer tokens (frequent (V,): token ids, most frequent first)."""
    keep = torch.zeros(frequent.numel(), dtype=torch.bool)  # (V,)
    keep[frequent[:size]] = True
    return keep[next_tokens].float().mean().item()


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train, held = [], []
    for folder in args.data:  # the split `hf-dynaspec train` makes, folder by folder
        part_train, part_held = split_heldout(load_dataset(folder), HELDOUT_FRACTION)
        train, held = train + part_train, held + part_held
    x_train, y_train = answer_positions(train, args.max_positions, seed=0)
    x_held, y_held = answer_positions(held, args.max_positions, seed=1)
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-4)
    x_train, x_held = (x_train - mean) / std, (x_held - mean) / std
    target, _ = load_target(args.target)
    weight = target.get_output_embeddings().weight.detach().float()  # (V, d)
    vocab = weight.shape[0]
    frequent = torch.argsort(torch.bincount(y_train, minlength=vocab), descending=True, stable=True)
    results = {"machine": machine_description(), "train_positions": len(y_train),
               "heldout_positions": len(y_held), "vocab_size": vocab, "settings": []}
    for num_clusters in args.clusters:
        t0 = time.perf_counter()
        clusters: VocabClusters = cluster_vocabulary(weight, num_clusters, seed=0)
        seconds_kmeans = time.perf_counter() - t0
        router = train_router(x_train, clusters.cluster_of_token[y_train], num_clusters, args.router_hidden,
                              args.epochs)
        rows = shortlist_figures(router, x_held, clusters.cluster_of_token[y_held], clusters.sizes(), args.budgets)
        for row in rows:
            row["static_recall_same_size"] = static_recall(frequent, y_held, round(row["mean_size"]))
        results["settings"].append({"num_clusters": num_clusters, "kmeans_seconds": seconds_kmeans,
                                    "largest_cluster": int(clusters.sizes().max()), "budgets": rows})
        print(json.dumps(results["settings"][-1]))
    results["static_32768_recall"] = static_recall(frequent, y_held, 32768)
    write_results(Path(args.out), results)


def write_results(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    vocab = results["vocab_size"]
    lines = [f"Router-only proxy on {results['heldout_positions']:,} held-out answer positions "
             f"({results['train_positions']:,} trained on), {results['machine']}. `python recipes/gemma3/clusters.py`",
             "", "| clusters | top-k | mean shortlist | % of vocabulary | router recall | static recall, same size |",
             "|---|---|---|---|---|---|"]
    figure, axis = plt.subplots(figsize=(6, 4))
    for setting in results["settings"]:
        rows = setting["budgets"]
        for row in rows:
            lines.append(f"| {setting['num_clusters']} | {row['k']} | {row['mean_size']:,.0f} | "
                         f"{100 * row['mean_size'] / vocab:.1f}% | {row['recall']:.3f} | "
                         f"{row['static_recall_same_size']:.3f} |")
        axis.plot([r["mean_size"] for r in rows], [r["recall"] for r in rows], marker="o",
                  label=f"router, {setting['num_clusters']} clusters")
    lines += ["", f"Static shortlist of 32,768 tokens: recall {results['static_32768_recall']:.3f}."]
    rows = results["settings"][0]["budgets"]
    axis.plot([r["mean_size"] for r in rows], [r["static_recall_same_size"] for r in rows], "k--",
              label="static frequency shortlist")
    axis.set(xscale="log", xlabel="mean shortlist (tokens)", ylabel="recall of the next token",
             title=f"Next-token recall of shortlists, {vocab:,}-token vocabulary")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "recall_vs_size.png", dpi=120)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    write_doc_block(Path(__file__).with_name("training.md"), "clusters", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
