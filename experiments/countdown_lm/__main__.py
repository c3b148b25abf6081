"""Experiment v2: which form of SetPO keeps distinct correct solutions alive? Stage by stage: the puzzles, the base
model, every arm and weight on the validation split (two seeds), the best scoped form with the weight controller,
then GRPO, SetPO as published, the best scoped form and the unlikeliness reward on the test split (five seeds
each), and the report. Then experiment v3 (issue 38), the forms that need no solution key, under --out/v3: one
kept v2 run replayed with today's code (v2's runs are reused only if it writes the same samples), the answer-span
form on validation beside the scoped embedding form, the best keyless form, the scoped embedding form, GRPO and
v2's keyed form on the test split, and report-v3. Every run's results are written under --out and a run already
there is skipped, so an interrupted experiment resumes where it stopped (make experiment starts from scratch).
Then experiment v4 (issue 62, coverage) under --out/v4: the coverage-keeping bases, SetPO's keyless form re-sharing
their push, replay, on n = 128 samples a puzzle (`--only v4` runs it alone: it needs v2's data and base model only).

    python -m experiments.countdown_lm --out out/countdown_lm [--quick] [--jobs 2] [--setpo-url URL] [--figures docs/figures]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from pathlib import Path

# One arithmetic on every x86 CPU: torch, MKL and oneDNN pick kernels by the CPU's instructions, and on an AVX-512
# CPU the same seed pretrains another base model than on an AVX2-only one (every validation sample differs), so
# runs kept from sittings on different machines would not be comparable. As an AVX2-only CPU computes, set before
# torch loads and inherited by the runs and the service (docs/experiments.md, "One arithmetic").
ARITHMETIC = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN's older name for the same
}
for _name, _value in ARITHMETIC.items():
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from experiments.countdown_lm import arms, corpus, coverage, job, puzzles, report  # noqa: E402
from experiments.countdown_lm.arms import Config  # noqa: E402
from experiments.countdown_lm.plan import FULL, QUICK, Plan  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("out/countdown_lm"))
    parser.add_argument("--quick", action="store_true", help="a few steps of every stage, one seed (make test)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each a process with one torch thread")
    parser.add_argument("--setpo-url", help="a running setpo service (default: start one on 127.0.0.1 for the run)")
    parser.add_argument("--figures", type=Path, help="also copy the plots here (make experiment: docs/figures)")
    parser.add_argument("--only", choices=["v4"], help="run this experiment alone (its data and base model first)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so the service this run started is stopped
    plan = QUICK if args.quick else FULL
    torch.set_num_threads(1)  # on a shared 2-core machine a second thread mostly spins
    started = time.perf_counter()

    def stage(name: str) -> None:
        print(f"\n== {name} ({(time.perf_counter() - started) / 60:.1f} min in)", flush=True)

    stage("data: puzzles and splits")
    split = puzzles.splits(plan.data_seed, plan.validation_puzzles, plan.test_puzzles)
    for name, rows in split.items():
        puzzles.write_jsonl(rows, args.out / "data" / f"{name}.jsonl")

    stage("pretraining the base model")
    if not (args.out / "base" / "pretrain.json").exists():
        from experiments.countdown_lm.pretrain import pretrain

        pairs = corpus.corpus(split["train"], plan.per_puzzle, plan.data_seed)
        base, size = args.out / "base", plan.model_size
        info = pretrain(pairs, base, size, plan.pretrain_epochs, plan.pretrain_batch, plan.pretrain_lr, plan.data_seed)
        print(f"{info['parameters'] / 1e6:.2f} M parameters, {info['steps']} steps, loss {info['final_loss']:.3f}")

    service = nullcontext() if args.setpo_url else local_service()
    with service as running:
        url = args.setpo_url or running.url
        if args.only == "v4":
            return {"v4": coverage_experiment(args, plan, url)}
        stage("the base model on validation and test")
        for name in ("validation", "test"):
            evaluate_base(args.out, plan, name, plan.samples)

        first = arms.phase_one(plan)
        stage(f"validation, phase one: {len(first)} configs x seeds {plan.validation_seeds}")
        run_all(args, plan, url, [(c, s, "validation") for c in first for s in plan.validation_seeds])
        validation = report.validation_rows(args.out, first, plan.validation_seeds)
        chosen = report.choose(validation)
        best_scoped = chosen["best_scoped"]

        second = arms.phase_two(best_scoped, plan.target_ratios)
        stage(f"validation, phase two: {best_scoped.name} with the weight controller, ratios {plan.target_ratios}")
        run_all(args, plan, url, [(c, s, "validation") for c in second for s in plan.validation_seeds])
        validation = report.validation_rows(args.out, first + second, plan.validation_seeds)
        chosen = report.choose(validation)
        finalists = [arms.GRPO, chosen["paper"], chosen["best_scoped_form"], chosen["unlikeliness"]]
        (args.out / "choices.json").write_text(json.dumps(report.choices_record(chosen, validation), indent=1))
        print("chosen on validation: " + ", ".join(c.name for c in finalists))

        stage(f"test: {len(finalists)} arms x seeds {plan.test_seeds}")
        run_all(args, plan, url, [(c, s, "test") for c in finalists for s in plan.test_seeds])

        stage("report")
        results = report.write(
            args.out, plan, report.choices_record(chosen, validation), finalists, time.perf_counter() - started,
            figures=args.figures,
        )  # fmt: skip
        print(report.test_table(results))
        v3 = keyless(args, plan, url, chosen["best_scoped_form"], started)
        v4 = coverage_experiment(args, plan, url)
    print(f"\ndone in {(time.perf_counter() - started) / 60:.1f} min; wrote {args.out / 'report'}, report-v3, v4")
    return {**results, "v3": v3, "v4": v4}


def keyless(args: argparse.Namespace, plan: Plan, url: str, keyed: Config, started: float) -> dict:
    """Experiment v3 under --out/v3 (its data and base model are v2's). Reuse of a v2 run is decided by replaying
    one first: `keyed` (v2's chosen keyed form, which exercises the whole SetPO path) on validation."""
    root = args.out / "v3"
    root.mkdir(exist_ok=True)
    for shared in ("data", "base"):
        if not (root / shared).exists():
            (root / shared).symlink_to(Path("..") / shared)
    keyless_runs = [(c, s, "validation") for c in arms.keyless(plan) for s in plan.validation_seeds]
    print(f"\n== v3: replaying {keyed.name} seed {plan.replay_seed} with today's code, beside the answer-span form")
    run_all(args, plan, url, [(keyed, plan.replay_seed, "validation"), *keyless_runs], root)  # these need no replay
    replay = report.same_samples(
        job.run_dir(args.out, keyed, plan.replay_seed) / "eval-validation",
        job.run_dir(root, keyed, plan.replay_seed) / "eval-validation",
    )
    reuse = replay["differing"] == 0
    print(
        f"replay: {replay['differing']} of {replay['samples']} samples differ: v2's runs are {'' if reuse else 'not '}reused"
    )

    def root_of(config: Config, seeds: tuple[int, ...], split: str) -> Path:
        kept = reuse and all(job.is_done(args.out, config, seed, split) for seed in seeds)
        return args.out if kept else root

    embedding = [Config("scoped-embedding", weight=w, **arms.SCOPE) for w in plan.scoped_weights]
    configs = [arms.GRPO, *embedding, *arms.keyless(plan)]
    roots = {c.name: root_of(c, plan.validation_seeds, "validation") for c in configs}
    print(f"\n== v3 validation: {len(configs)} configs x seeds {plan.validation_seeds}", flush=True)
    todo = [(c, s, "validation") for c in configs if roots[c.name] == root for s in plan.validation_seeds]
    run_all(args, plan, url, todo, root)
    rows = [row for c in configs for row in report.validation_rows(roots[c.name], [c], plan.validation_seeds)]
    chosen = report.choose_keyless(rows)
    finalists = list({c.name: c for c in [arms.GRPO, chosen["keyless"], chosen["embedding"], keyed]}.values())
    roots = {c.name: root_of(c, plan.test_seeds, "test") for c in finalists}
    print(f"\n== v3 test: {', '.join(c.name for c in finalists)} x seeds {plan.test_seeds}", flush=True)
    run_all(
        args, plan, url, [(c, s, "test") for c in finalists if roots[c.name] == root for s in plan.test_seeds], root
    )
    results = report.write(
        args.out, plan, report.keyless_record(chosen, rows, replay), finalists, time.perf_counter() - started,
        figures=args.figures, roots=roots, version="v3",
    )  # fmt: skip
    print(report.test_table(results))
    return results


def coverage_experiment(args: argparse.Namespace, plan: Plan, url: str) -> dict:
    """Experiment v4 under --out/v4 (v2's data and base model): the base model at n = plan.coverage_samples, every
    arm of arms.coverage on validation (pass@1 and pass@64 every plan.curve_every steps), replay on the best combined
    form, then the winner, the best single base, v3's keyless form and GRPO on plan.coverage_test_seeds, and
    report-v4. The rule (coverage.best) and every arm were fixed in code before its first run."""
    root = args.out / "v4"
    root.mkdir(exist_ok=True)
    for shared in ("data", "base"):
        if not (root / shared).exists():
            (root / shared).symlink_to(Path("..") / shared)
    print(f"\n== v4: the base model at n = {plan.coverage_samples}", flush=True)
    for name in ("validation", "test"):
        evaluate_base(root, plan, name, plan.coverage_samples)
    configs = arms.coverage(plan)
    print(f"\n== v4 validation: {len(configs)} configs x seeds {plan.validation_seeds}", flush=True)
    run_all(args, plan, url, [(c, s, "validation") for c in configs for s in plan.validation_seeds], root, True)
    chosen = coverage.choose(coverage.validation_rows(root, configs, plan))
    calibration = root / "replay_threshold.json"
    if not calibration.exists():
        from setpo_client import SetpoClient

        with SetpoClient(url) as client:
            embed = lambda texts: [item.floats() for item in client.embeddings(texts).data]  # noqa: E731
            found = coverage.replay_threshold(root / "eval" / "base-validation" / "samples.jsonl", embed)
        calibration.write_text(json.dumps(found, indent=1))
    configs.append(coverage.replay_config(root, chosen))
    threshold = configs[-1].replay_threshold
    print(f"replay: answers with cosine >= {threshold} are one to the bank (base model's validation samples)")
    print(f"\n== v4 validation: {configs[-1].name} (replay on the best combined form)", flush=True)
    run_all(args, plan, url, [(configs[-1], s, "validation") for s in plan.validation_seeds], root, True)
    rows = coverage.validation_rows(root, configs, plan)
    chosen = coverage.choose(rows)
    picked = [arms.GRPO, chosen["winner"]["config"], chosen["single_base"]["config"], arms.KEYLESS]
    finalists = list({c.name: c for c in picked}.values())
    seen = root / "data" / "train-seen.jsonl"  # the first training puzzles: where a test run's policy trained too
    if not seen.exists():
        with (root / "data" / "train.jsonl").open() as train:
            seen.write_text("".join(line for _, line in zip(range(plan.coverage_train_puzzles), train)))
    evaluate_base(root, plan, "train-seen", plan.coverage_samples)
    print(f"\n== v4 test: {', '.join(c.name for c in finalists)} x seeds {plan.coverage_test_seeds}", flush=True)
    run_all(args, plan, url, [(c, s, "test") for c in finalists for s in plan.coverage_test_seeds], root, True)
    results = coverage.write(root, plan, rows, chosen, finalists, args.figures)
    print(coverage.test_table(results))
    return results


def local_service():
    from setpo_server.local import LocalServer

    # float32 named: `auto` picks bfloat16 on a CPU with native bfloat16, and the kept runs' embedder ran float32
    return LocalServer(threads=1, dtype="float32")


def evaluate_base(out: Path, plan: Plan, split: str, samples: int) -> None:
    from experiments.countdown_lm.evaluate import evaluate

    where = out / "eval" / f"base-{split}"
    if not (where / "summary.json").exists():
        evaluate(out / "base", out / "data" / f"{split}.jsonl", where, "base", samples, plan.max_new_tokens, 0, None)


def run_all(
    args: argparse.Namespace,
    plan: Plan,
    url: str,
    runs: list[tuple[Config, int, str]],
    root: Path | None = None,
    coverage: bool = False,
) -> None:
    """Every run not yet done under root (default --out): in this process one at a time (--jobs 1), else as --jobs
    processes with one thread each, a progress bar over the runs and a line as each one ends (its log: the run's
    directory, log.txt). coverage: experiment v4's evaluation (job.run)."""
    out = root or args.out
    todo = [run for run in runs if not job.is_done(out, *run)]
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already done", flush=True)
    if args.jobs == 1:
        for config, seed, split in todo:
            job.run(out, plan, config, seed, split, url, coverage)
        return

    def in_a_process(run: tuple[Config, int, str]) -> str:
        config, seed, split = run
        where = job.run_dir(out, config, seed)
        where.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "experiments.countdown_lm.job", "--out", str(out), "--seed", str(seed)]
        command += ["--config", json.dumps(config.as_dict()), "--split", split, "--url", url]
        command += ["--quick"] if args.quick else []
        command += ["--coverage"] if coverage else []
        began = time.perf_counter()
        with (where / "log.txt").open("a") as log:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        if finished.returncode:
            raise RuntimeError(f"{config.name} seed {seed} failed ({finished.returncode}): see {where / 'log.txt'}")
        return f"{config.name} seed {seed} {split}: {(time.perf_counter() - began) / 60:.1f} min"

    with ThreadPoolExecutor(args.jobs) as pool, tqdm(total=len(todo), unit="run", desc="runs") as bar:
        try:
            for finished in as_completed([pool.submit(in_a_process, run) for run in todo]):
                bar.write(finished.result())
                bar.update()
        except BaseException:  # a failed run or a stop: start no more (the runs done so far stay done)
            pool.shutdown(wait=False, cancel_futures=True)
            raise


if __name__ == "__main__":
    main()
