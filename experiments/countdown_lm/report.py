"""Tables and plots over seeds: base, GRPO and SetPO+GRPO on the test split, mean ± std over seeds."""

import json
import shutil
from pathlib import Path
from statistics import fmean, pstdev

from setpo_trainer.eval.metrics import pass_at_k

EVAL_KEYS = ["distinct_correct_mean", "diversity_width", "average_mode", "mean_pairwise_similarity", "set_score"]
TRAIN_KEYS = [
    "reward_first",
    "reward_last",
    "seconds_per_step",
    "setpo_time_share",
    "saturation",
    "set_score",
    "marginal_std",
]


def method_names(results: dict) -> dict[str, str]:
    return {"base": "base", "grpo": "GRPO", "setpo": f"SetPO+GRPO (λ = {results['lambda']:g})"}


def pass_curve(counts: list[tuple[int, int]]) -> list[float]:
    """Unbiased pass@k for k = 1..n, averaged over puzzles (counts: (n, correct) per puzzle)."""
    n = counts[0][0]
    return [fmean(pass_at_k(n, c, k) for _, c in counts) for k in range(1, n + 1)]


def mean_pass_curve(counts: list[tuple[int, int]]) -> float:
    return fmean(pass_curve(counts))


def run_metrics(result: dict) -> dict:
    curve = pass_curve(result["counts"])
    n = len(curve)
    row = {f"pass@{k}": curve[k - 1] for k in sorted({1, 8, n})}
    row[f"avg@{n}"] = result["accuracy"][f"avg@{n}"]
    row.update({key: result["diversity"][key] for key in EVAL_KEYS if key in result["diversity"]})
    train = result.get("train")
    if train:
        row.update({f"train_{key}": train[key] for key in TRAIN_KEYS if train.get(key) is not None})
    return row


def spread(rows: list[dict]) -> dict:
    """key -> [mean, std over seeds, per-seed values]."""
    return {key: [fmean(r[key] for r in rows), pstdev(r[key] for r in rows), [r[key] for r in rows]] for key in rows[0]}


def write(
    out: Path,
    runs: dict[str, list[dict]],
    chosen: float,
    timings: dict,
    plan,
    embedder_view: dict,
    figures: Path | None = None,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "lambda": chosen,
        "seeds": list(plan.seeds),
        "timings_s": timings,
        "embedder_view": embedder_view,
        "methods": {method: spread([run_metrics(r) for r in results]) for method, results in runs.items()},
        "curves": {method: [pass_curve(r["counts"]) for r in results] for method, results in runs.items()},
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results) + "\n")
    for path in plot(results, out):
        if figures:
            figures.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, figures / f"countdown_lm_{path.name}")
    return results


def table(results: dict) -> str:
    """Methods as columns, metrics as rows: mean ± std over seeds (the base model is one model, no spread)."""
    methods = list(results["methods"])
    keys = list(dict.fromkeys(key for m in methods for key in results["methods"][m]))
    names = method_names(results)
    lines = ["| metric | " + " | ".join(names.get(m, m) for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for key in keys:
        cells = []
        for m in methods:
            if key not in results["methods"][m]:
                cells.append("—")
                continue
            mean, std, values = results["methods"][m][key]
            cells.append(f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ± {std:.3f}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"base": "grey", "grpo": "tab:blue", "setpo": "tab:orange"}
    labels = method_names(results)
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, curves in results["curves"].items():
        ks = range(1, len(curves[0]) + 1)
        mean = [fmean(c[k - 1] for c in curves) for k in ks]
        std = [pstdev(c[k - 1] for c in curves) for k in ks]
        ax.plot(
            ks,
            mean,
            color=colors.get(method),
            label=f"{labels.get(method, method)} ({len(curves)} seed{'s' * (len(curves) > 1)})",
        )
        ax.fill_between(
            ks,
            [m - s for m, s in zip(mean, std)],
            [m + s for m, s in zip(mean, std)],
            color=colors.get(method),
            alpha=0.2,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (test split)")
    ax.legend()
    fig.tight_layout()
    passk = out / "pass_at_k.png"
    fig.savefig(passk, dpi=110)
    plt.close(fig)

    keys = [
        k
        for k in ("distinct_correct_mean", "diversity_width", "average_mode")
        if all(k in v for v in results["methods"].values())
    ]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.4 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for x, (method, metrics) in enumerate(results["methods"].items()):
            mean, std, values = metrics[key]
            ax.bar(x, mean, yerr=std if len(values) > 1 else None, color=colors.get(method), alpha=0.7, capsize=4)
            ax.scatter([x] * len(values), values, color="black", s=10, zorder=3)  # one dot per seed
        ax.set_xticks(
            range(len(results["methods"])), [labels.get(m, m).split(" (")[0] for m in results["methods"]], fontsize=8
        )
        ax.set_title(key.replace("_", " "), fontsize=9)
    fig.tight_layout()
    distinct = out / "distinct.png"
    fig.savefig(distinct, dpi=110)
    plt.close(fig)
    return [passk, distinct]
