"""Summary tables and plots from run directories: one row per run; where a method has several runs on a dataset
(seeds), every figure as its mean ± std over those runs; pass@k curves and diversity bars."""

import json
from pathlib import Path
from statistics import fmean, pstdev

from setpo_trainer.eval.metrics import PCMD_MIN_DEFINED_PROMPTS

# ModeBench never prints a PCMD without its support, so these go into the PCMD cell rather than columns of their own
# (summary.json and seeds.json keep each of them, the standard error included).
PCMD_SUPPORT = ("pcmd_defined_prompts", "pcmd_prompts", "pcmd_support", "pcmd_reportable", "pcmd_standard_error")
PCMD_NOTE = (
    f"pcmd: (prompts that define it / prompts); * fewer than {PCMD_MIN_DEFINED_PROMPTS} define it "
    "(ModeBench's reporting bar): a gap, not a figure to compare."
)


def load_summaries(run_dirs: list[Path]) -> list[dict]:
    return [json.loads((Path(d) / "summary.json").read_text()) for d in run_dirs]


def columns(summaries: list[dict]) -> tuple[list[str], list[str]]:
    """The accuracy keys (in the first run's order) and every diversity key a run has, PCMD's support folded in."""
    diversity = {key for s in summaries for key in s["diversity"]} - set(PCMD_SUPPORT)
    return list(summaries[0]["accuracy"]), sorted(diversity)


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def spread(pair: list | None) -> str:
    """A [mean, std] pair as `mean ± std` (the mean alone from one run); - where no run has the figure."""
    if pair is None or pair[0] is None:
        return "-"
    return number(pair[0]) if pair[1] is None else f"{pair[0]:.3f} ± {pair[1]:.3f}"


def pcmd_cell(value: str, defined: float, prompts: float, reportable: bool) -> str:
    return f"{value} ({defined:g}/{prompts:g}){'' if reportable else '*'}"


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    )


def markdown_table(summaries: list[dict]) -> str:
    """One row per run: accuracy (pass@k, Avg@n) and every diversity figure the runs have."""
    accuracy_keys, diversity_keys = columns(summaries)
    rows = []
    for s in summaries:
        figures = s["diversity"]
        cells = [s["method"], s["dataset"], str(s["problems"]), str(s.get("seed", "-"))]
        cells += [number(s["accuracy"].get(k)) for k in accuracy_keys]
        for key in diversity_keys:
            if key not in figures:
                cells.append("-")
            elif key == "pcmd":
                defined, prompts = figures["pcmd_defined_prompts"], figures["pcmd_prompts"]
                cells.append(pcmd_cell(number(figures["pcmd"]), defined, prompts, figures["pcmd_reportable"]))
            else:
                cells.append(number(figures[key]))
        rows.append(cells)
    text = table(["method", "dataset", "problems", "seed", *accuracy_keys, *diversity_keys], rows)
    return text + ("\n\n" + PCMD_NOTE if "pcmd" in diversity_keys else "")


def mean_std(values: list) -> list:
    """[mean, std] over the runs that have the figure (a run whose PCMD no prompt defines adds nothing): the
    population std, as experiments/countdown_lm/report.py gives it over seeds, and None from one run, whose spread
    is unknown rather than 0."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return [None, None]
    return [fmean(present), pstdev(present) if len(present) > 1 else None]


def seed_summaries(summaries: list[dict]) -> list[dict]:
    """Per method and dataset (in the order runs were given): its runs' seeds and each figure's [mean, std]."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in summaries:
        groups.setdefault((s["method"], s["dataset"]), []).append(s)
    rows = []
    for (method, dataset), runs in groups.items():
        row = {
            "method": method,
            "dataset": dataset,
            "problems": runs[0]["problems"],
            "seeds": [r.get("seed") for r in runs],
        }
        for section in ("accuracy", "diversity"):
            keys = dict.fromkeys(key for r in runs for key in r[section])  # first-seen order, as the runs list them
            row[section] = {key: mean_std([r[section].get(key) for r in runs]) for key in keys}
        rows.append(row)
    return rows


def seed_table(rows: list[dict]) -> str:
    """One row per method and dataset: each figure as mean ± std over its runs (seed_summaries)."""
    accuracy_keys, diversity_keys = columns(rows)
    lines = []
    for row in rows:
        figures = row["diversity"]
        cells = [row["method"], row["dataset"], ", ".join("-" if s is None else str(s) for s in row["seeds"])]
        cells += [spread(row["accuracy"].get(k)) for k in accuracy_keys]
        for key in diversity_keys:
            if key == "pcmd" and key in figures:
                # support as the mean over seeds; starred when any seed is under the bar (its mean is then below 1)
                defined, prompts = figures["pcmd_defined_prompts"][0], figures["pcmd_prompts"][0]
                cells.append(pcmd_cell(spread(figures["pcmd"]), defined, prompts, figures["pcmd_reportable"][0] == 1))
            else:
                cells.append(spread(figures.get(key)))
        lines.append(cells)
    text = table(["method", "dataset", "seeds", *accuracy_keys, *diversity_keys], lines)
    return text + ("\n\n" + PCMD_NOTE if "pcmd" in diversity_keys else "")


def markdown(summaries: list[dict]) -> str:
    """The per-run table, and the mean ± std table when some method has more than one run on a dataset."""
    rows = seed_summaries(summaries)
    if all(len(row["seeds"]) == 1 for row in rows):
        return markdown_table(summaries)
    return f"{markdown_table(summaries)}\n\nMean ± std over runs (seeds):\n\n{seed_table(rows)}"


def plot(summaries: list[dict], out: Path) -> list[Path]:
    """pass@k curves and diversity bars per method and dataset: the mean over its runs, their std as a band or bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = seed_summaries(summaries)
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        ks = [int(key.split("@")[1]) for key in row["accuracy"] if key.startswith("pass@")]
        mean, std = zip(*(row["accuracy"][f"pass@{k}"] for k in ks))
        ax.plot(ks, mean, marker="o", label=f"{row['method']} ({row['dataset']})")
        if len(row["seeds"]) > 1:
            ax.fill_between(ks, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.legend()
    fig.tight_layout()
    passk = out / "pass_at_k.png"
    fig.savefig(passk, dpi=110)
    plt.close(fig)

    keys = columns(rows)[1]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        pairs = [row["diversity"].get(key) or [None, None] for row in rows]
        nan = float("nan")  # a figure no run has draws no bar, a single run no error bar
        ax.bar(
            [row["method"] for row in rows],
            [nan if m is None else m for m, _ in pairs],
            yerr=[nan if s is None else s for _, s in pairs],
        )
        ax.set_title(key, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    bars = out / "diversity.png"
    fig.savefig(bars, dpi=110)
    plt.close(fig)
    return [passk, bars]
