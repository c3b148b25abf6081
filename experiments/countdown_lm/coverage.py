"""Experiment v4's measures, rule and report (issue 62): coverage as the field measures it. Every figure comes from the
samples setpo-eval wrote (n = plan.coverage_samples per puzzle, 128 in the full form).

Per puzzle: the unbiased pass@k (1 - C(n-c, k) / C(n, k)) for k = 1, 2, 4, ..., 64; the area under that curve (the
mean of those pass@k: the curve against log2 k, scaled to [0, 1]); distinct correct solutions and PCMD among the
first 64 samples (ModeBench's identity: setpo_client.keys.countdown_expression); and whether the puzzle is lost: the
base model solves it (a correct sample among its n) and the arm has none among its n.
"""

import argparse
import json
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from statistics import fmean

from experiments.countdown_lm import arms, job, report
from experiments.countdown_lm.arms import Config
from experiments.countdown_lm.report import BOOTSTRAP, cell, mean_std, paired_interval
from setpo_client.keys import countdown_expression
from setpo_trainer.eval.metrics import pass_at_k, pcmd
from setpo_trainer.packaged_data import read_jsonl

KS = (1, 2, 4, 8, 16, 32, 64)
FIRST = 64  # distinct solutions and PCMD among the first 64 samples, whatever n is
HEADLINE = ["pass@1", "pass@8", "pass@64", "auc", "solutions", "pcmd", "lost"]


def puzzles_of(samples: Path) -> dict[str, dict]:
    """Per puzzle id: n, correct samples, and each correct solution's count over all n and over the first FIRST."""
    by_id: dict[str, dict] = {}
    for _, row in read_jsonl(samples):
        entry = by_id.setdefault(row["problem_id"], {"n": 0, "correct": 0, "modes": Counter(), "first": Counter()})
        entry["n"] += 1
        if row["correct"]:
            mode = countdown_expression(row["response"])
            entry["correct"] += 1
            entry["modes"][mode] += 1
            if row["sample"] < FIRST:
                entry["first"][mode] += 1
    return by_id


def per_puzzle(entry: dict, base: dict) -> dict:
    """The puzzle's values every headline metric averages (pcmd may be None: fewer than 2 correct samples)."""
    n, c = entry["n"], entry["correct"]
    curve = [pass_at_k(n, c, min(k, n)) for k in KS]  # k above n (the quick form's few samples): pass@n
    return {
        **{f"pass@{k}": p for k, p in zip(KS, curve)},
        "auc": fmean(curve),
        "solutions": len(entry["first"]),
        "pcmd": pcmd(entry["first"]),
        "lost": float(base["correct"] > 0 and c == 0),
    }


def summarize(samples: Path, base_samples: Path) -> dict:
    """One evaluation against the base model's on the same puzzles: headline means, the curve at KS, the per-puzzle
    rows (for the paired bootstrap) and the lost puzzles with the solutions the base model had for each."""
    entries, base = puzzles_of(samples), puzzles_of(base_samples)
    rows = {pid: per_puzzle(entry, base[pid]) for pid, entry in entries.items()}
    summary: dict = {key: fmean(r[key] for r in rows.values()) for key in HEADLINE if key != "pcmd"}
    defined = [r["pcmd"] for r in rows.values() if r["pcmd"] is not None]
    summary["pcmd"] = fmean(defined) if defined else None
    summary["curve"] = [fmean(r[f"pass@{k}"] for r in rows.values()) for k in KS]
    summary["puzzles"] = list(rows.values())
    summary["lost_puzzles"] = {
        pid: {"base_correct": base[pid]["correct"], "base_solutions": dict(base[pid]["modes"].most_common())}
        for pid, row in rows.items()
        if row["lost"]
    }
    return summary


def replay_threshold(samples: Path, embed) -> dict:
    """The cosine at which replay's bank counts two answers as one, chosen on the base model's validation samples:
    among each puzzle's distinct correct texts, pairs of one solution (ModeBench's identity) and pairs of two; the
    threshold (a grid of 0.800, 0.801, ... 0.999) with the best balanced accuracy at telling them apart (same when
    cos >= t), ties to the lower. embed: texts -> vectors (the service's embeddings)."""
    by_puzzle: dict[str, dict[str, str]] = {}
    for _, row in read_jsonl(samples):
        if row["correct"]:
            by_puzzle.setdefault(row["problem_id"], {})[row["response"]] = countdown_expression(row["response"])
    same, different = [], []
    for texts in by_puzzle.values():
        vectors = embed(list(texts)) if len(texts) > 1 else []
        units = [[x / sum(y * y for y in v) ** 0.5 for x in v] for v in vectors]
        modes = list(texts.values())
        for i in range(len(units)):
            for j in range(i + 1, len(units)):
                cosine = sum(a * b for a, b in zip(units[i], units[j]))
                (same if modes[i] == modes[j] else different).append(cosine)

    def balanced(t: float) -> float:
        return (
            sum(c >= t for c in same) / max(1, len(same)) + sum(c < t for c in different) / max(1, len(different))
        ) / 2

    grid = [round(0.8 + i / 1000, 3) for i in range(200)]
    best_t = max(grid, key=lambda t: (balanced(t), -t))
    return {
        "threshold": best_t,
        "balanced_accuracy": balanced(best_t),
        "same_pairs": len(same),
        "different_pairs": len(different),
    }


def runs_of(out: Path, config: Config, seeds: tuple[int, ...], split: str, step: int | None = None) -> list[dict]:
    """One summary per seed of the config's evaluation on `split` (at a checkpoint `step`, else the final policy)."""
    folder = f"eval-{split}" if step is None else f"eval-{split}-step{step}"
    base = out / "eval" / f"base-{split}" / "samples.jsonl"
    found = []
    for seed in seeds:
        where = job.run_dir(out, config, seed)
        train = json.loads((where / "train_summary.json").read_text())
        found.append({"seed": seed, **summarize(where / folder / "samples.jsonl", base), "train": train})
    return found


def validation_rows(out: Path, configs: list[Config], plan) -> list[dict]:
    """Per config: mean and sample std over the validation seeds of the headline metrics, and its curve over steps
    (validation pass@1 and pass@64 of each checkpoint, then of the final policy)."""
    rows = []
    steps = list(range(plan.curve_every, plan.rl.steps, plan.curve_every)) if plan.curve_every else []
    for config in configs:
        runs = runs_of(out, config, plan.validation_seeds, "validation")
        over_steps = [runs_of(out, config, plan.validation_seeds, "validation", s) for s in steps] + [runs]
        rows.append(
            {
                "config": config,
                "metrics": {key: mean_std([r[key] for r in runs], ddof=1) for key in HEADLINE},
                "steps": [*steps, plan.rl.steps],
                "over_steps": {key: [fmean(r[key] for r in at) for at in over_steps] for key in ("pass@1", "pass@64")},
                "curve": [fmean(r["curve"][i] for r in runs) for i in range(len(KS))],
                "seconds_per_step": fmean(r["train"]["seconds_per_step"] for r in runs),
            }
        )
    return rows


def floor_of(rows: list[dict]) -> tuple[float, float]:
    """GRPO's mean validation pass@1 less the seed standard deviation pooled over every config; and that std."""
    grpo = next(r for r in rows if r["config"].arm == "grpo")
    seed_std = fmean(r["metrics"]["pass@1"][1] ** 2 for r in rows) ** 0.5
    return grpo["metrics"]["pass@1"][0] - seed_std, seed_std


def best(rows: list[dict], floor: float) -> dict | None:
    """The rule, fixed before any v4 run: eligible when the mean validation pass@1 reaches the floor; among the
    eligible, the highest pass@64 (to 3 decimals), ties by distinct correct solutions. None when none is eligible."""
    eligible = [r for r in rows if r["metrics"]["pass@1"][0] >= floor]
    if not eligible:
        return None
    return max(eligible, key=lambda r: (round(r["metrics"]["pass@64"][0], 3), r["metrics"]["solutions"][0]))


def choose(rows: list[dict]) -> dict:
    """What validation decides: the best combined form (replay goes onto it), the best single coverage base, and the
    winner among every keyless config (the keyed form is a reference: it needs a solution key). Where no config of
    a kind is eligible, that kind's highest pass@1 stands in, marked."""
    floor, seed_std = floor_of(rows)

    def pick(candidates: list[dict]) -> dict:
        chosen = best(candidates, floor)
        stand_in = chosen or max(candidates, key=lambda r: r["metrics"]["pass@1"][0])
        return {"config": stand_in["config"], "eligible": chosen is not None}

    keyless = [r for r in rows if r["config"].kernel != "hybrid"]
    return {
        "floor": floor,
        "seed_std": seed_std,
        "eligible": {r["config"].name: r["metrics"]["pass@1"][0] >= floor for r in rows},
        "combined": pick([r for r in rows if r["config"].combine == "reshare" and not r["config"].replay]),
        "single_base": pick([r for r in rows if r["config"].arm in ("maxrl", "w-reinforce", "f-grpo")]),
        "winner": pick(keyless),
    }


def write(out: Path, plan, rows: list[dict], chosen: dict, finalists: list[Config], figures: Path | None) -> dict:
    """report-v4 under out: results.json (every validation row, the choices, the test arms with per-seed values,
    paired 95 % intervals against GRPO and against v3's keyless form, the lost puzzles), validation.md, test.md and
    the plots (copied to `figures`)."""
    where = out / "report-v4"
    where.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    test = {c.name: runs_of(out, c, plan.coverage_test_seeds, "test") for c in finalists}
    grpo, keyless = test["grpo"], test.get("scoped-embedding-w0.3")
    seen = {c.name: runs_of(out, c, plan.coverage_test_seeds, "train-seen") for c in finalists}
    base = summarize(out / "eval" / "base-test" / "samples.jsonl", out / "eval" / "base-test" / "samples.jsonl")
    base_seen = out / "eval" / "base-train-seen" / "samples.jsonl"
    base_validation = out / "eval" / "base-validation" / "samples.jsonl"
    arms_out = {}
    for config in finalists:
        runs = test[config.name]
        arms_out[config.name] = {
            "config": config.as_dict(),
            "metrics": {key: mean_std([r[key] for r in runs], ddof=1) for key in HEADLINE},
            "per_seed": {key: [r[key] for r in runs] for key in HEADLINE},
            "versus_grpo": {} if runs is grpo else {k: paired_interval(runs, grpo, k, rng) for k in HEADLINE},
            "versus_keyless": {}
            if keyless is None or runs is keyless
            else {k: paired_interval(runs, keyless, k, rng) for k in HEADLINE},
            "curves": [r["curve"] for r in runs],
            "lost_puzzles": {r["seed"]: r["lost_puzzles"] for r in runs},
            "train_seen": {
                "metrics": {key: mean_std([r[key] for r in seen[config.name]], ddof=1) for key in HEADLINE},
                "lost_puzzles": {r["seed"]: r["lost_puzzles"] for r in seen[config.name]},
            },
        }
    results = {
        "ks": list(KS),
        "samples": plan.coverage_samples,
        "bootstrap": BOOTSTRAP,
        "base": {key: base[key] for key in [*HEADLINE, "curve"]},
        "base_validation_curve": summarize(base_validation, base_validation)["curve"],
        "base_train_seen": {
            **{key: value for key, value in summarize(base_seen, base_seen).items() if key in HEADLINE},
            "puzzles": plan.coverage_train_puzzles,
        },
        "validation": [
            {**{k: v for k, v in r.items() if k != "config"}, "config": r["config"].as_dict()} for r in rows
        ],
        "choices": {
            "rule": best.__doc__,
            "grpo_pass@1_floor": chosen["floor"],
            "pooled_seed_std_pass@1": chosen["seed_std"],
            **{
                kind: {"name": chosen[kind]["config"].name, "eligible": chosen[kind]["eligible"]}
                for kind in ("combined", "single_base", "winner")
            },
        },
        "arms": arms_out,
        "std": "sample (ddof 1)",
    }
    report.save(
        where, results, validation_table(results, chosen), test_table(results), plot(results, where), figures, "v4"
    )
    return results


def validation_table(results: dict, chosen: dict | None) -> str:
    winners = {chosen[kind]["config"].name for kind in ("combined", "single_base", "winner")} if chosen else set()
    lines = [
        "| config | eligible | pass@1 | pass@64 | AUC | solutions (first 64) | PCMD | lost | pass@1 / pass@64 over steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["validation"]:
        name, m = row["config"]["name"], row["metrics"]
        mark = " **(chosen)**" if name in winners else ""
        eligible = "yes" if m["pass@1"][0] >= results["choices"]["grpo_pass@1_floor"] else "no"
        steps = " ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(row["over_steps"]["pass@1"], row["over_steps"]["pass@64"]))
        lines.append(
            f"| {name}{mark} | {eligible} | {cell(m['pass@1'])} | {cell(m['pass@64'])} | {cell(m['auc'])} "
            f"| {cell(m['solutions'])} | {cell(m['pcmd'])} | {cell(m['lost'])} | {steps} |"
        )
    return "\n".join(lines)


def progress(out: Path, plan) -> str:
    """The validation table so far, for an experiment still running or stopped: every config of arms.coverage whose
    validation seeds are all done, then replay's once both of its runs are, eligible against the floor of those; the
    rule's picks marked once every config is in."""
    configs = arms.coverage(plan)
    done = [c for c in configs if all(job.is_done(out, c, seed, "validation") for seed in plan.validation_seeds)]
    chosen = choose(validation_rows(out, done, plan)) if len(done) == len(configs) else None
    if chosen and (out / "replay_threshold.json").exists():
        replay = replay_config(out, chosen)
        if all(job.is_done(out, replay, seed, "validation") for seed in plan.validation_seeds):
            done.append(replay)
            chosen = choose(validation_rows(out, done, plan))
    rows = validation_rows(out, done, plan)
    floor = floor_of(rows)[0] if any(r["config"].arm == "grpo" for r in rows) else float("-inf")
    results = {
        "validation": [{**r, "config": r["config"].as_dict()} for r in rows],
        "choices": {"grpo_pass@1_floor": floor},
    }
    table = validation_table(results, chosen)
    return f"{len(done)} of {len(configs) + 1} validation configs done, replay's included ({out})\n\n{table}"


def replay_config(out: Path, chosen: dict) -> Config:
    """Replay's arm: the rule's best combined form with replay, at the threshold calibrated in replay_threshold.json."""
    threshold = json.loads((out / "replay_threshold.json").read_text())["threshold"]
    return replace(chosen["combined"]["config"], replay=True, replay_threshold=threshold)


def template(response: str) -> str:
    """The last answer's expression with each number written n ('19 - ( 5 - 1 )' -> 'n - ( n - n )'), '(none)' without
    an answer: a form a policy can carry from puzzle to puzzle, whatever the numbers."""
    found = re.findall(r"<answer>(.*?)</answer>", response, re.S)
    return " ".join(re.sub(r"\d+", "n", found[-1]).split()) if found else "(none)"


def why_lost(out: Path, split: str = "validation", least: float = 0.01) -> str:
    """Why puzzles are lost, in numbers, from every run's final evaluation on `split` under out: the share of each
    template (among those of at least `least` of the base model's correct answers) in the base model's correct
    answers and in every answer of each config (its seeds pooled); then each puzzle some run lost, with the runs that
    lost it and the templates of the base model's correct answers to it."""
    base = list(read_jsonl(out / "eval" / f"base-{split}" / "samples.jsonl"))
    runs = sorted(out.glob(f"runs/*/seed*/eval-{split}/samples.jsonl"))
    configs: dict[str, Counter] = {}
    for samples in runs:
        configs.setdefault(samples.parents[2].name, Counter()).update(
            template(r["response"]) for _, r in read_jsonl(samples)
        )
    solved = Counter(template(r["response"]) for _, r in base if r["correct"])
    shown = [t for t, count in solved.most_common() if count >= least * solved.total()]
    lines = [
        "| template | base: of its correct answers | base: of all | " + " | ".join(configs) + " |",
        "|---|---|---|" + "---|" * len(configs),
    ]
    every = Counter(template(r["response"]) for _, r in base)
    for t in shown:
        shares = [f"{counts[t] / counts.total():.3f}" for counts in configs.values()]
        lines.append(
            f"| `{t}` | {solved[t] / solved.total():.3f} | {every[t] / every.total():.3f} | "
            + " | ".join(shares)
            + " |"
        )
    base_puzzles = puzzles_of(out / "eval" / f"base-{split}" / "samples.jsonl")
    lost: dict[str, list[str]] = {}
    for samples in runs:
        for pid, entry in puzzles_of(samples).items():
            if entry["correct"] == 0 and base_puzzles[pid]["correct"] > 0:
                lost.setdefault(pid, []).append(f"{samples.parents[2].name}/{samples.parents[1].name}")
    lines += ["", f"| puzzle | lost in (of {len(runs)} runs) | base: correct of n | base: its solutions' templates |"]
    lines.append("|---|---|---|---|")
    for pid, where in sorted(lost.items(), key=lambda item: -len(item[1])):
        kinds = Counter(template(r["response"]) for _, r in base if r["problem_id"] == pid and r["correct"])
        spelled = ", ".join(f"`{t}` {count}" for t, count in kinds.most_common())
        entry = base_puzzles[pid]
        lines.append(f"| {pid} | {len(where)} | {entry['correct']} of {entry['n']} | {spelled} |")
    return "\n".join(lines)


def test_table(results: dict) -> str:
    lines = [report.test_table(results, HEADLINE, (("versus_grpo", "GRPO"), ("versus_keyless", "v3 keyless")), ())]
    for key in ("pass@1", "pass@64", "solutions", "lost"):  # where each run's policy trained: is a loss there too?
        value = results["base_train_seen"][key]
        row = [cell(arm["train_seen"]["metrics"][key]) for arm in results["arms"].values()]
        label = f"{key}, {results['base_train_seen']['puzzles']} training puzzles"
        lines.append(f"| {label} | {value:.3f} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(results: dict, where: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = results["ks"]
    ax.plot(ks, results["base"]["curve"], color="black", ls="--", marker="o", label="base model")
    for name, arm in results["arms"].items():
        mean = [fmean(c[i] for c in arm["curves"]) for i in range(len(ks))]
        line = ax.plot(ks, mean, marker="o", label=name)[0]
        low = [min(c[i] for c in arm["curves"]) for i in range(len(ks))]
        high = [max(c[i] for c in arm["curves"]) for i in range(len(ks))]
        ax.fill_between(ks, low, high, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel(f"pass@k (test, n = {results['samples']}; band: seed min-max)")
    ax.legend(fontsize=8)
    paths = [report.saved(fig, where / "pass_at_k.png")]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("pass@1", "pass@64")):
        for row in results["validation"]:
            ax.plot(row["steps"], row["over_steps"][key], marker=".", label=row["config"]["name"])
        ax.set_xlabel("RL step")
        ax.set_title(f"validation {key} (mean of seeds)")
    axes[1].legend(fontsize=7)
    paths.append(report.saved(fig, where / "over_steps.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))  # every config tried, against the base model: validation, step 400
    ax.plot(ks, results["base_validation_curve"], color="black", ls="--", marker="o", label="base model")
    for row in results["validation"]:
        ax.plot(ks, row["curve"], marker=".", label=row["config"]["name"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel(f"pass@k (validation, n = {results['samples']}, mean of seeds)")
    ax.legend(fontsize=7)
    paths.append(report.saved(fig, where / "validation_pass_at_k.png"))
    return paths


if __name__ == "__main__":
    from experiments.countdown_lm.plan import FULL

    parser = argparse.ArgumentParser(description="experiment v4's tables from its runs under a folder (out/.../v4)")
    parser.add_argument("--progress", type=Path, help="the validation table so far")
    parser.add_argument("--why", type=Path, help="why puzzles are lost: templates and lost puzzles (why_lost)")
    parser.add_argument("--split", default="validation", choices=["validation", "test", "train-seen"])
    args = parser.parse_args()
    if args.progress:
        print(progress(args.progress, FULL))
    if args.why:
        print(why_lost(args.why, args.split))
