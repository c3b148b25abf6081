"""Summary tables and plots: pass@k curves per method and diversity bars, from run directories."""

import json
from pathlib import Path


def load_summaries(run_dirs: list[Path]) -> list[dict]:
    return [json.loads((Path(d) / "summary.json").read_text()) for d in run_dirs]


def markdown_table(summaries: list[dict]) -> str:
    """One row per run: accuracy (pass@k, Avg@n) and every diversity figure the runs have."""
    accuracy_keys = list(summaries[0]["accuracy"])
    diversity_keys = sorted({key for s in summaries for key in s["diversity"]})
    header = ["method", "dataset", "problems", *accuracy_keys, *diversity_keys]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        cells = [s["method"], s["dataset"], str(s["problems"])]
        cells += [f"{s['accuracy'].get(k, float('nan')):.3f}" for k in accuracy_keys]
        cells += [f"{s['diversity'][k]:.3f}" if k in s["diversity"] else "-" for k in diversity_keys]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(summaries: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in summaries:
        ks = [int(key.split("@")[1]) for key in s["accuracy"] if key.startswith("pass@")]
        ax.plot(ks, [s["accuracy"][f"pass@{k}"] for k in ks], marker="o", label=f"{s['method']} ({s['dataset']})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.legend()
    fig.tight_layout()
    passk = out / "pass_at_k.png"
    fig.savefig(passk, dpi=110)
    plt.close(fig)

    keys = sorted({key for s in summaries for key in s["diversity"]})
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.bar([s["method"] for s in summaries], [s["diversity"].get(key, 0.0) for s in summaries])
        ax.set_title(key, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    bars = out / "diversity.png"
    fig.savefig(bars, dpi=110)
    plt.close(fig)
    return [passk, bars]
