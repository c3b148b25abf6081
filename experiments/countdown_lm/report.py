"""What the runs say, from their saved samples: the validation table (every config tried), the choices it makes,
the test table (mean ± std over seeds, paired bootstrap 95 % intervals of each arm's difference to GRPO) and the
plots. Nothing here is typed by hand: every figure comes from the samples.jsonl setpo-eval wrote.

A solution is ModeBench's Countdown identity (setpo_client.keys.countdown_expression: the executed expression tree,
+ and * unordered), so `(3+5)*2` and `2*(5+3)` are one solution. Per puzzle: pass@k (unbiased, from n samples), the
distinct correct solutions found, and PCMD (ModeBench: the chance that two correct samples are different solutions,
defined where a puzzle has 2 or more correct samples).
"""

import json
import random
import shutil
from collections import Counter
from pathlib import Path
from statistics import fmean, median, pstdev, stdev

from experiments.countdown_lm import arms, job
from experiments.countdown_lm.arms import Config
from setpo_client.keys import countdown_expression
from setpo_trainer.eval.metrics import pass_at_k, pcmd  # pcmd: ModeBench's, per puzzle
from setpo_trainer.packaged_data import read_jsonl

HEADLINE = ["pass@1", "pass@8", "pass@64", "solutions", "pcmd", "share_2", "share_3"]
TRAIN = ["seconds_per_step", "setpo_time_share", "weight_mean", "weight_last", "bonus_ratio", "scored_share"]
BOOTSTRAP = 2000


def puzzles_of(samples: Path) -> list[dict]:
    """Per puzzle (in file order): n samples, correct samples, and how many correct samples each solution has."""
    by_id: dict[str, dict] = {}
    for _, row in read_jsonl(samples):
        entry = by_id.setdefault(row["problem_id"], {"n": 0, "correct": 0, "modes": Counter()})
        entry["n"] += 1
        if row["correct"]:
            entry["correct"] += 1
            entry["modes"][countdown_expression(row["response"])] += 1
    return list(by_id.values())


def per_puzzle(entry: dict) -> dict:
    """The puzzle-level values every headline metric averages."""
    n, c, solutions = entry["n"], entry["correct"], len(entry["modes"])
    return {
        "pass@1": c / n,
        "pass@8": pass_at_k(n, c, min(8, n)),
        "pass@64": pass_at_k(n, c, min(64, n)),
        "solutions": solutions,
        "pcmd": pcmd(entry["modes"]),
        "share_2": float(solutions >= 2),
        "share_3": float(solutions >= 3),
    }


def summarize(entries: list[dict]) -> dict:
    """Headline metrics over puzzles, PCMD with its support (ModeBench: it is undefined below 2 correct samples,
    and a mean over few defined puzzles says little), and the pass@k curve for k = 1..n."""
    rows = [per_puzzle(e) for e in entries]
    defined = [r["pcmd"] for r in rows if r["pcmd"] is not None]
    n = entries[0]["n"]
    summary = {key: fmean(r[key] for r in rows) for key in HEADLINE if key != "pcmd"}
    summary["pcmd"] = fmean(defined) if defined else None
    summary["pcmd_support"] = [len(defined), len(rows)]
    summary["curve"] = [fmean(pass_at_k(n, e["correct"], k) for e in entries) for k in range(1, n + 1)]
    return summary


def log_history(run: Path) -> list[dict]:
    """A run's per-step log (TRL's log_history), as rl.py wrote it or keep.py restored it."""
    return json.loads((run / "log_history.json").read_text())


def seeds_of(out: Path, config: Config, seeds: tuple[int, ...], split: str) -> list[dict]:
    """One dict per seed: its eval summary (from the samples), its per-puzzle rows and its train summary."""
    found = []
    for seed in seeds:
        where = job.run_dir(out, config, seed)
        entries = puzzles_of(where / f"eval-{split}" / "samples.jsonl")
        train = json.loads((where / "train_summary.json").read_text())
        # the bonus ratio's median over steps, from the log (rl.metric_means took the mean before 2026-11-25)
        ratios = [step["setpo/bonus_ratio"] for step in log_history(where) if "setpo/bonus_ratio" in step]
        train["bonus_ratio"] = median(ratios) if ratios else None
        found.append({"seed": seed, **summarize(entries), "puzzles": [per_puzzle(e) for e in entries], "train": train})
    return found


def mean_std(values: list, ddof: int = 0) -> list:
    """[mean, std] of the values present; std with ddof 0 (the population's: v2's tables) or 1 (the sample's: v3)."""
    present = [v for v in values if v is not None]
    if not present:
        return [None, None]
    return [fmean(present), stdev(present) if ddof and len(present) > 1 else pstdev(present)]


def validation_rows(out: Path, configs: list[Config], seeds: tuple[int, ...]) -> list[dict]:
    """Per config: mean and std over seeds of the headline metrics and of what its training logged."""
    rows = []
    for config in configs:
        runs = seeds_of(out, config, seeds, "validation")
        row = {"config": config, "metrics": {key: mean_std([r[key] for r in runs]) for key in HEADLINE}}
        row["train"] = {key: mean_std([r["train"].get(key) for r in runs]) for key in TRAIN}
        rows.append(row)
    return rows


def pass_floor(rows: list[dict]) -> tuple[float, float]:
    """GRPO's mean validation pass@1 less one seed standard deviation pooled over every config; and that std."""
    grpo = next(r for r in rows if r["config"].arm == "grpo")
    seed_std = fmean(r["metrics"]["pass@1"][1] ** 2 for r in rows) ** 0.5  # pooled: two seeds per config are few
    return grpo["metrics"]["pass@1"][0] - seed_std, seed_std


def choose(rows: list[dict]) -> dict:
    """The rule, fixed before any run: a config is eligible when its mean validation pass@1 is no lower than GRPO's
    minus one seed standard deviation (pooled over every config's seeds); among an arm's eligible configs the one
    with the most distinct correct solutions wins (ties: the higher pass@64). An arm with none eligible is
    represented by its highest pass@1. The best scoped form is chosen the same way among the scoped arms' winners,
    and then among it and its controller configs."""
    floor, seed_std = pass_floor(rows)

    def eligible(row: dict) -> bool:
        return row["metrics"]["pass@1"][0] >= floor

    by_arm: dict[str, list[dict]] = {}
    for row in rows:
        by_arm.setdefault(row["config"].arm, []).append(row)
    winners = {arm: best_of(candidates, floor) for arm, candidates in by_arm.items()}
    scoped = best_of([w for arm, w in winners.items() if arm.startswith("scoped-")], floor)
    controlled = [w for arm, w in winners.items() if arm == f"controller-{scoped['config'].kernel}"]
    return {
        "floor": floor,
        "seed_std": seed_std,
        "winners": {arm: w["config"] for arm, w in winners.items()},
        "eligible": {r["config"].name: eligible(r) for r in rows},
        "paper": winners["paper"]["config"],
        "unlikeliness": winners["unlikeliness"]["config"],
        "best_scoped": scoped["config"],
        "best_scoped_form": best_of([scoped, *controlled], floor)["config"],
    }


def best_of(candidates: list[dict], floor: float) -> dict:
    """choose's ranking: among the configs whose pass@1 reaches the floor, the most distinct correct solutions (ties:
    pass@64); with none eligible, the highest pass@1."""
    good = [r for r in candidates if r["metrics"]["pass@1"][0] >= floor]
    if good:
        return max(good, key=lambda r: (r["metrics"]["solutions"][0], r["metrics"]["pass@64"][0]))
    return max(candidates, key=lambda r: r["metrics"]["pass@1"][0])


def choose_keyless(rows: list[dict]) -> dict:
    """Experiment v3's rule, fixed before any of its runs: choose's floor (GRPO's pass@1 less the seed std pooled
    over the rows given: GRPO, the scoped embedding form, the answer-span form) and ranking, among the configs that
    need no solution key. The best keyless config goes to the test split beside GRPO, the scoped embedding form's
    own best weight and v2's keyed form."""
    floor, seed_std = pass_floor(rows)
    keyless = [r for r in rows if r["config"].arm in ("scoped-embedding", "scoped-answer-span")]
    embedding = [r for r in keyless if r["config"].arm == "scoped-embedding"]
    return {
        "floor": floor,
        "seed_std": seed_std,
        "keyless": best_of(keyless, floor)["config"],
        "embedding": best_of(embedding, floor)["config"],
        "eligible": {r["config"].name: r["metrics"]["pass@1"][0] >= floor for r in rows},
    }


def keyless_record(chosen: dict, rows: list[dict], replay: dict) -> dict:
    """What v3 chose and why, with the replay that decided whether v2's runs are reused, as results.json keeps it."""
    return {
        "rule": choose_keyless.__doc__,
        "grpo_pass@1_floor": chosen["floor"],
        "pooled_seed_std_pass@1": chosen["seed_std"],
        "winners": {"keyless": chosen["keyless"].name, "scoped-embedding": chosen["embedding"].name},
        "replay": replay,
        "validation": [
            {"config": r["config"].as_dict(), **r["metrics"], **{f"train_{k}": v for k, v in r["train"].items()}}
            for r in rows
        ],
    }


def same_samples(kept: Path, replayed: Path) -> dict:
    """Whether a replayed run wrote exactly the kept run's evaluation samples (each sample's response, reward and
    correctness; fields a later setpo-eval added are not compared): the check that the training code the kept runs
    ran is unchanged, on this machine's arithmetic."""
    pairs = list(zip(read_jsonl(kept / "samples.jsonl"), read_jsonl(replayed / "samples.jsonl"), strict=True))
    fields = ("problem_id", "sample", "response", "reward", "correct")
    differing = sum([a[f] for f in fields] != [b[f] for f in fields] for (_, a), (_, b) in pairs)
    return {"kept": str(kept), "replayed": str(replayed), "samples": len(pairs), "differing": differing}


def choices_record(chosen: dict, rows: list[dict]) -> dict:
    return {
        "rule": choose.__doc__,
        "grpo_pass@1_floor": chosen["floor"],
        "pooled_seed_std_pass@1": chosen["seed_std"],
        "winners": {arm: config.name for arm, config in chosen["winners"].items()},
        "paper": chosen["paper"].name,
        "best_scoped": chosen["best_scoped"].name,
        "best_scoped_form": chosen["best_scoped_form"].name,
        "unlikeliness": chosen["unlikeliness"].name,
        "validation": [
            {"config": r["config"].as_dict(), **r["metrics"], **{f"train_{k}": v for k, v in r["train"].items()}}
            for r in rows
        ],
    }


def paired_interval(arm: list[dict], grpo: list[dict], key: str, rng: random.Random) -> list[float | None]:
    """95 % bootstrap interval of mean(arm - GRPO) for `key`, resampling seeds (seed i of the arm paired with seed i
    of GRPO: the same prompt order) and test puzzles (the same puzzles), both with replacement. PCMD differences are
    taken over the puzzles where both runs define it."""
    seeds, puzzles = range(len(arm)), range(len(arm[0]["puzzles"]))
    differences = [
        [
            None
            if arm[s]["puzzles"][p][key] is None or grpo[s]["puzzles"][p][key] is None
            else arm[s]["puzzles"][p][key] - grpo[s]["puzzles"][p][key]
            for p in puzzles
        ]
        for s in seeds
    ]
    means = []
    for _ in range(BOOTSTRAP):
        picked = [
            differences[s][p] for s in rng.choices(seeds, k=len(seeds)) for p in rng.choices(puzzles, k=len(puzzles))
        ]
        present = [d for d in picked if d is not None]
        if present:
            means.append(fmean(present))
    if not means:  # PCMD defined nowhere in both runs (a quick run's few correct samples)
        return [None, None]
    means.sort()
    return [means[int(0.025 * len(means))], means[int(0.975 * len(means)) - 1]]


def write(
    out: Path,
    plan,
    choices: dict,
    finalists: list[Config],
    seconds: float,
    figures: Path | None = None,
    roots: dict[str, Path] | None = None,
    version: str = "v2",
) -> dict:
    """results.json, validation.md, test.md and the plots under out/report (v2) or out/report-<version> (copied to
    `figures` if given). choices: choices_record's or keyless_record's; roots: where each finalist's runs are (default
    out). v2's tables keep the population std they were published with; later versions give the sample std."""
    where = out / ("report" if version == "v2" else f"report-{version}")
    where.mkdir(parents=True, exist_ok=True)
    ddof = 0 if version == "v2" else 1
    rng = random.Random(0)
    test = {c.name: seeds_of((roots or {}).get(c.name, out), c, plan.test_seeds, "test") for c in finalists}
    grpo = test[finalists[0].name]
    base = summarize(puzzles_of(out / "eval" / "base-test" / "samples.jsonl"))
    arms_out = {}
    for config in finalists:
        runs = test[config.name]
        arms_out[config.name] = {
            "config": config.as_dict(),
            "metrics": {key: mean_std([r[key] for r in runs], ddof) for key in HEADLINE},
            "per_seed": {key: [r[key] for r in runs] for key in HEADLINE},
            "pcmd_support": [r["pcmd_support"] for r in runs],
            "train": {key: mean_std([r["train"].get(key) for r in runs], ddof) for key in TRAIN},
            "versus_grpo": {}
            if config.arm == "grpo"
            else {key: paired_interval(runs, grpo, key, rng) for key in HEADLINE},
            "curves": [r["curve"] for r in runs],
        }
    results = {
        "seconds": seconds,
        "test_seeds": list(plan.test_seeds),
        "validation_seeds": list(plan.validation_seeds),
        "base": {key: base[key] for key in [*HEADLINE, "pcmd_support", "curve"]},
        "arms": arms_out,
        "std": "population (ddof 0)" if ddof == 0 else "sample (ddof 1)",
        "choices": choices,
    }
    save(where, results, validation_table(results), test_table(results), plot(results, where), figures, version)
    return results


def save(
    where: Path, results: dict, validation: str, test: str, plots: list[Path], figures: Path | None, version: str
) -> None:
    """A report's files under `where`, its plots copied to `figures` as countdown_<version>_<name>."""
    (where / "results.json").write_text(json.dumps(results, indent=1))
    (where / "validation.md").write_text(validation + "\n")
    (where / "test.md").write_text(test + "\n")
    for path in plots:
        if figures:
            figures.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, figures / f"countdown_{version}_{path.name}")


def cell(pair: list) -> str:
    mean, std = pair
    return "—" if mean is None else f"{mean:.3f} ± {std:.3f}"


def validation_table(results: dict) -> str:
    choices = results["choices"]
    lines = [
        "| config | eligible | pass@1 | pass@64 | solutions | PCMD | ≥3 solutions | λ (last) | bonus / advantage | s / step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in choices["validation"]:
        name = row["config"]["name"]
        mark = " **(chosen)**" if name in choices["winners"].values() else ""
        eligible = "yes" if row["pass@1"][0] >= choices["grpo_pass@1_floor"] else "no"
        lines.append(
            f"| {name}{mark} | {eligible} | {cell(row['pass@1'])} | {cell(row['pass@64'])} | {cell(row['solutions'])} "
            f"| {cell(row['pcmd'])} | {cell(row['share_3'])} | {cell(row['train_weight_last'])} "
            f"| {cell(row['train_bonus_ratio'])} | {cell(row['train_seconds_per_step'])} |"
        )
    return "\n".join(lines)


def interval(pair: list) -> str:
    return "—" if pair[0] is None else f"[{pair[0]:+.3f}, {pair[1]:+.3f}]"


def test_table(results: dict, headline=HEADLINE, versus=(("versus_grpo", "GRPO"),), train=TRAIN) -> str:
    names = list(results["arms"])
    lines = ["| metric (test) | base | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for key in headline:
        base = results["base"][key]
        row = [cell(results["arms"][n]["metrics"][key]) for n in names]
        lines.append(f"| {key} | {'—' if base is None else f'{base:.3f}'} | " + " | ".join(row) + " |")
    for against, label in versus:
        for key in headline:
            row = [interval(results["arms"][n][against][key]) if results["arms"][n][against] else "" for n in names]
            lines.append(f"| {key}: arm - {label}, 95 % paired bootstrap | | " + " | ".join(row) + " |")
    for key in train:
        row = [cell(results["arms"][n]["train"][key]) for n in names]
        lines.append(f"| train: {key} | | " + " | ".join(row) + " |")
    return "\n".join(lines)


def saved(fig, path: Path) -> Path:
    """The figure laid out, written to `path` and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(results: dict, where: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = range(1, len(results["base"]["curve"]) + 1)
    ax.plot(ks, results["base"]["curve"], color="black", ls="--", label="base")
    for name, arm in results["arms"].items():
        curves = arm["curves"]
        mean = [fmean(c[k - 1] for c in curves) for k in ks]
        line = ax.plot(ks, mean, label=name)[0]
        low = [min(c[k - 1] for c in curves) for k in ks]
        high = [max(c[k - 1] for c in curves) for k in ks]
        ax.fill_between(ks, low, high, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (test; band: seed min-max)")
    ax.legend(fontsize=8)
    paths.append(saved(fig, where / "pass_at_k.png"))

    keys = ["solutions", "pcmd", "share_3"]
    fig, axes = plt.subplots(1, len(keys), figsize=(12, 4))
    names = list(results["arms"])
    for ax, key in zip(axes, keys):
        for i, name in enumerate(names):
            values = [v for v in results["arms"][name]["per_seed"][key] if v is not None]
            ax.scatter([i] * len(values), values, s=18)
            if values:  # PCMD may be defined nowhere
                ax.hlines(fmean(values), i - 0.3, i + 0.3, color="black")
        if results["base"][key] is not None:
            ax.axhline(results["base"][key], color="gray", ls="--", label="base")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.set_title({"solutions": "distinct correct solutions", "pcmd": "PCMD", "share_3": "share with ≥ 3"}[key])
    axes[0].legend(fontsize=8)
    paths.append(saved(fig, where / "solutions.png"))
    return paths


def progress(out: Path, plan) -> str:
    """The validation table so far, for an experiment still running or stopped: every phase-one config whose
    validation seeds are all done, eligibility against GRPO's floor (GRPO runs first)."""
    first = arms.phase_one(plan)
    done = [c for c in first if all(job.is_done(out, c, s, "validation") for s in plan.validation_seeds)]
    rows = validation_rows(out, done, plan.validation_seeds)
    records = [
        {"config": r["config"].as_dict(), **r["metrics"], **{f"train_{k}": v for k, v in r["train"].items()}}
        for r in rows
    ]
    floor = pass_floor(rows)[0] if rows and rows[0]["config"].arm == "grpo" else float("-inf")
    table = validation_table({"choices": {"validation": records, "winners": {}, "grpo_pass@1_floor": floor}})
    return f"{len(done)} of {len(first)} validation configs done ({out})\n\n{table}"


if __name__ == "__main__":
    # python -m experiments.countdown_lm.report <samples.jsonl> ...: one run's headline
    # python -m experiments.countdown_lm.report --progress out/countdown_lm: the validation table so far
    import sys

    from experiments.countdown_lm.plan import FULL

    if sys.argv[1] == "--progress":
        print(progress(Path(sys.argv[2]), FULL))
        sys.exit()
    for path in sys.argv[1:]:
        summary = summarize(puzzles_of(Path(path)))
        print(path, json.dumps({key: summary[key] for key in [*HEADLINE, "pcmd_support"]}))
