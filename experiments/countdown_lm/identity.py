"""Experiment v3's identity study (issue 38, item 1; no training): how well does each keyless similarity tell "the
same solution" from "a different solution" among the correct responses of a puzzle?

Truth: ModeBench's identity (setpo_client.keys.countdown_expression). Pairs: as SetPO meets them in training, the
correct members of groups of 8 consecutive samples of a puzzle, each pair of two different texts (an exact copy
is the same to every kernel). For each candidate:
- pooled ROC AUC of its similarity (same solution = positive), with a 95 % bootstrap interval over puzzles;
- at its operating point (a pair is "identical" when its kernel entry is >= 0.95, SATURATION_THRESHOLD), the share
  of same-solution pairs scored identical and of different-solution pairs scored different;
- what the training signal sees: in each group with >= 3 correct members, the scoped z-scored marginals
  (setpo_core.solutions, as the service computes them) averaged over members whose solution is alone in the group
  minus over members that share theirs (the key kernel on the truth is the ceiling).
Thresholds are chosen on the base model's validation samples (maximum Youden J of the identical/different call),
and the table is reported on v2's validation runs (the policies training produces). No test-split file is read.

    .venv/bin/python -m experiments.countdown_lm.identity [--out out/identity] [--figures docs/figures]
"""

import argparse
import gzip
import json
import random
import re
from pathlib import Path

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.metrics import roc_auc_score

from setpo_client.keys import countdown_expression
from setpo_core.diversity import SATURATION_THRESHOLD, cosine_kernel
from setpo_core.solutions import hybrid_kernel, key_kernel, scoped_marginals, standardized

RESULTS = Path(__file__).parent / "results"
ANSWER = re.compile(r"<answer>.*?</answer>", re.DOTALL)
GROUP = 8
THRESHOLDS = np.round(np.arange(0.80, 0.996, 0.005), 3)
TAUS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def groups_of(samples: Path) -> list[dict]:
    """Per group of GROUP consecutive samples of a puzzle: its correct responses and their truth keys."""
    by_puzzle: dict[str, list[dict]] = {}
    with gzip.open(samples, "rt") as lines:  # as experiment-keep stores them
        rows_read = [json.loads(line) for line in lines]
    for row in rows_read:
        by_puzzle.setdefault(row["problem_id"], []).append(row)
    groups = []
    for puzzle, rows in by_puzzle.items():
        for start in range(0, len(rows) - GROUP + 1, GROUP):
            texts = [r["response"] for r in rows[start : start + GROUP] if r["correct"]]
            if len(texts) >= 2:
                groups.append({"puzzle": puzzle, "texts": texts, "truth": [countdown_expression(t) for t in texts]})
    return groups


def views(text: str) -> dict[str, str]:
    """The parts of a response a keyless form may embed: all of it, its answer span, the rest (its reasoning)."""
    found = ANSWER.findall(text)
    return {"whole": text, "answer": found[-1] if found else "", "reasoning": ANSWER.sub("", text).strip()}


def embed_all(groups: list[dict], model) -> None:
    """Adds each group's cosine matrices (whole, answer, reasoning) in float64, unit vectors from MiniLM."""
    for view in ("whole", "answer", "reasoning"):
        texts = sorted({views(t)[view] for g in groups for t in g["texts"]})
        vectors = model.encode(texts, batch_size=128, normalize_embeddings=True, convert_to_tensor=True).double()
        index = {t: i for i, t in enumerate(texts)}
        for g in groups:
            rows = vectors[[index[views(t)[view]] for t in g["texts"]]]
            g[f"cos_{view}"] = cosine_kernel(rows[None])[0].double().numpy()


def jaccard(texts: list[str]) -> np.ndarray:
    sets = [set(t.split()) for t in texts]
    return np.array([[len(a & b) / len(a | b) for b in sets] for a in sets])


def cluster_ids(cos: np.ndarray, threshold: float, method: str) -> np.ndarray:
    """Cluster labels of a group's members: agglomerative clustering of 1 - cos, cut at 1 - threshold."""
    if len(cos) < 2:
        return np.zeros(len(cos), dtype=int)
    distance = squareform(np.clip(1 - cos, 0, None), checks=False)
    return fcluster(linkage(distance, method=method), t=1 - threshold, criterion="distance")


def kernels(g: dict, t_sharp: float, t_cluster: float, tau: float) -> dict[str, np.ndarray]:
    """Every candidate's (G, G) kernel for one group, values in [0, 1]; reference rows (task keys) last."""
    cos = g["cos_whole"]
    same_cluster = cluster_ids(cos, t_cluster, "average")
    clustered = (same_cluster[:, None] == same_cluster[None, :]).astype(float)
    answers = ["".join(views(t)["answer"].split()) for t in g["texts"]]
    truth_ids = torch.tensor([[sorted(set(g["truth"])).index(k) for k in g["truth"]]])
    return {
        "embedding, whole response": cos,
        "embedding, answer span": g["cos_answer"],
        "embedding, reasoning (answer span removed)": g["cos_reasoning"],
        f"sharpened: 1 where cos >= {t_sharp:g}, else cos": np.where(cos >= t_sharp, 1.0, cos),
        # a temperature sharpens without ties: the same ranks (AUC) as cos, a steeper kernel
        f"temperature: exp(-(1 - cos) / {tau:g})": np.exp(-(1 - cos) / tau),
        f"cluster keys (average linkage at {t_cluster:g}), key kernel": clustered,
        f"cluster keys (average linkage at {t_cluster:g}), hybrid": np.maximum(cos, clustered),
        "token-set Jaccard, whole response": jaccard(g["texts"]),
        "reference (task key): answer string, key kernel": np.array(
            [[float(a == b) for b in answers] for a in answers]
        ),
        "reference (task key): ModeBench identity, hybrid": hybrid_kernel(
            torch.from_numpy(cos)[None].float(), truth_ids
        )[0]
        .double()
        .numpy(),
        "reference (task key): ModeBench identity, key kernel": key_kernel(truth_ids)[0].double().numpy(),
    }


def pairs(groups: list[dict], matrices: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(similarity, same solution, puzzle index) of every pair of two different texts in a group; matrices: each
    group's kernel, in order."""
    sims, same, where = [], [], []
    puzzles = {p: i for i, p in enumerate(sorted({g["puzzle"] for g in groups}))}
    for g, k in zip(groups, matrices, strict=True):
        for i in range(len(g["texts"])):
            for j in range(i + 1, len(g["texts"])):
                if g["texts"][i] != g["texts"][j]:
                    sims.append(k[i, j])
                    same.append(g["truth"][i] == g["truth"][j])
                    where.append(puzzles[g["puzzle"]])
    return np.array(sims), np.array(same), np.array(where)


def youden(sims: np.ndarray, same: np.ndarray, thresholds=THRESHOLDS) -> tuple[float, float]:
    """The threshold (of `thresholds`) that best splits identical from different, and its J = TPR + TNR - 1."""
    scores = [
        (same & (sims >= t)).sum() / same.sum() + (~same & (sims < t)).sum() / (~same).sum() - 1 for t in thresholds
    ]
    best = int(np.argmax(scores))
    return float(thresholds[best]), float(scores[best])


def bootstrap_auc(sims: np.ndarray, same: np.ndarray, where: np.ndarray, rounds: int = 500) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    by_puzzle = [np.flatnonzero(where == p) for p in np.unique(where)]
    values = []
    for _ in range(rounds):
        chosen = np.concatenate([by_puzzle[i] for i in rng.integers(0, len(by_puzzle), len(by_puzzle))])
        if same[chosen].all() or not same[chosen].any():
            continue
        values.append(roc_auc_score(same[chosen], sims[chosen]))
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def alignment(groups: list[dict], matrices: list[np.ndarray]) -> float:
    """Mean scoped z-scored marginal of members whose solution is alone in their group minus that of members that
    share it, over groups with >= 3 correct members and both kinds; matrices: each group's kernel, in order."""
    alone, shared = [], []
    for g, matrix in zip(groups, matrices, strict=True):
        if len(g["texts"]) < 3 or len(set(g["truth"])) in (1, len(g["truth"])):
            continue
        kernel = torch.from_numpy(matrix).float()[None]
        scored = torch.ones(1, len(g["texts"]), dtype=torch.bool)
        z = standardized(scoped_marginals(kernel, scored), scored)[0].tolist()
        for key, value in zip(g["truth"], z):
            (alone if g["truth"].count(key) == 1 else shared).append(value)
    return float(np.mean(alone) - np.mean(shared))


def table(groups: list[dict], t_sharp: float, t_cluster: float, tau: float) -> list[dict]:
    every = [kernels(g, t_sharp, t_cluster, tau) for g in groups]  # each group's candidates, computed once
    rows = []
    for name in every[0]:
        matrices = [candidates[name] for candidates in every]
        sims, same, where = pairs(groups, matrices)
        identical = sims >= SATURATION_THRESHOLD
        low, high = bootstrap_auc(sims, same, where)
        rows.append(
            {
                "candidate": name,
                "auc": float(roc_auc_score(same, sims)),
                "auc_95": [low, high],
                "same_scored_identical": float((identical & same).sum() / same.sum()),
                "different_scored_different": float((~identical & ~same).sum() / (~same).sum()),
                "alignment_z": alignment(groups, matrices),
            }
        )
    return rows


def plot(split: dict, folders: list[Path]) -> None:
    """ROC AUC (with its interval) and the marginals' alignment of every candidate, reference rows greyed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = split["rows"][::-1]
    names = [r["candidate"] for r in rows]
    colours = ["0.6" if n.startswith("reference") else "tab:blue" for n in names]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    auc = np.array([r["auc"] for r in rows])
    # a percentile interval need not contain the pooled point: clip, so the bar shows the interval's reach
    errors = np.clip(np.array([[r["auc"] - r["auc_95"][0], r["auc_95"][1] - r["auc"]] for r in rows]).T, 0, None)
    left.barh(names, auc, xerr=errors, color=colours)
    left.set_xlim(0.5, 1.0)
    left.set_xlabel("ROC AUC, same vs different solution (95 % CI)")
    right.barh(names, [r["alignment_z"] for r in rows], color=colours)
    right.set_xlabel("z-scored marginal: alone minus shared")
    figure.suptitle(
        f"Keyless similarities among correct Countdown responses (v2 validation runs, {split['groups']} groups)"
    )
    figure.tight_layout()
    for folder in folders:
        figure.savefig(folder / "countdown_v3_identity.png", dpi=120)
    plt.close(figure)


def main() -> None:
    from sentence_transformers import SentenceTransformer

    from setpo_server.backend import embedded_model_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=Path("out/identity"))
    parser.add_argument("--figures", type=Path, help="also write the plot here (docs/figures)")
    args = parser.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    model = SentenceTransformer(embedded_model_path(), device="cpu")
    choose = groups_of(args.results / "eval/base-validation/samples.jsonl.gz")
    report = [
        g
        for path in sorted(args.results.glob("runs/*/seed[01]/eval-validation/samples.jsonl.gz"))
        for g in groups_of(path)
    ]
    embed_all(choose, model)
    embed_all(report, model)
    cosines = [g["cos_whole"] for g in choose]
    t_sharp, j_sharp = youden(*pairs(choose, cosines)[:2])
    # the cluster cut: the same rule, on the pairs' same-cluster call (1 or 0) at each candidate threshold
    j_cluster = {}
    for t in THRESHOLDS:
        ids = [cluster_ids(cos, t, "average") for cos in cosines]
        same_cluster = [(i[:, None] == i[None, :]).astype(float) for i in ids]
        j_cluster[float(t)] = youden(*pairs(choose, same_cluster)[:2], thresholds=(0.5,))[1]
    t_cluster = max(j_cluster, key=j_cluster.get)
    # the temperature has no identical/different call of its own: the one that best aligns the marginals
    by_tau = {tau: alignment(choose, [np.exp(-(1 - cos) / tau) for cos in cosines]) for tau in TAUS}
    tau = max(by_tau, key=by_tau.get)
    result = {
        "chosen_on": "base model, validation samples",
        "sharpen_threshold": t_sharp,
        "sharpen_youden": j_sharp,
        "cluster_threshold": t_cluster,
        "cluster_youden": j_cluster[t_cluster],
        "temperature": tau,
        "temperature_alignment": by_tau,
        "validation_base": {"groups": len(choose), "rows": table(choose, t_sharp, t_cluster, tau)},
        "validation_runs": {"groups": len(report), "rows": table(report, t_sharp, t_cluster, tau)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "identity.json").write_text(json.dumps(result, indent=1))
    plot(result["validation_runs"], [args.out, *([args.figures] if args.figures else [])])
    for split in ("validation_base", "validation_runs"):
        print(f"\n{split}: {result[split]['groups']} groups; thresholds from the base model's validation samples")
        print("| candidate | ROC AUC [95 %] | same → identical | different → different | z(alone) - z(shared) |")
        print("|---|---|---|---|---|")
        for r in result[split]["rows"]:
            print(
                f"| {r['candidate']} | {r['auc']:.3f} [{r['auc_95'][0]:.3f}, {r['auc_95'][1]:.3f}] | "
                f"{r['same_scored_identical']:.2f} | {r['different_scored_different']:.2f} | {r['alignment_z']:+.3f} |"
            )


if __name__ == "__main__":
    main()
