"""`setpo-eval`: evaluate a model's accuracy and diversity, and compare runs.

setpo-eval run --model PATH --dataset gsm8k --n 64 --method setpo --out runs/setpo [--setpo-url URL]
    [--tensor-parallel-size 4 --dtype bfloat16 --gpu-memory-utilization 0.85]   (vLLM's engine, as `vllm serve` names it)
setpo-eval compare runs/grpo-s0 runs/grpo-s1 runs/setpo-s0 runs/setpo-s1 --out runs/compare
    (runs with one --method on one dataset are several seeds of it: also shown as mean ± std, in seeds.json)

Keys are never flags (a command line is visible to every user of the machine): the service's comes from SETPO_API_KEY
or --setpo-api-key-file, the judge's from SETPO_JUDGE_KEY or --judge-key-file.
"""

import argparse
import importlib.metadata
import json
import logging
import os
import sys
from pathlib import Path
from statistics import fmean

from setpo_client.errors import SetpoError
from setpo_trainer.eval import datasets, metrics
from setpo_trainer.eval.errors import InputError
from setpo_trainer.eval.judge import JudgeError, judge_diversity
from setpo_trainer.packaged_data import read_jsonl

log = logging.getLogger("setpo_eval")

PAPER_SAMPLING = {"temperature": 0.5, "top_p": 0.9}
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # vLLM's --dtype choices
VLLM_ENGINE = ("tensor_parallel_size", "gpu_memory_utilization")  # arguments of vllm.LLM, flags of `vllm serve`
# Keys once taken as flags, and where each comes from now
SECRET_FLAGS = {
    "--setpo-api-key": "set SETPO_API_KEY or pass --setpo-api-key-file PATH",
    "--judge-key": "set SETPO_JUDGE_KEY or pass --judge-key-file PATH",
}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not a fraction in (0, 1]")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="setpo-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('setpo-trainer')}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="generate (or load) n samples per problem and score them")
    run.add_argument("--model", help="local model folder or hub id (not needed with --samples)")
    run.add_argument("--dataset", required=True, help="gsm8k | math500 | countdown | a .jsonl file")
    run.add_argument("--kind", choices=["math", "countdown"], help="what a .jsonl dataset holds")
    for field in datasets.FieldMap.__dataclass_fields__:
        run.add_argument(f"--{field}-field", default=field, help=f"JSONL key of the {field} (default: {field})")
    run.add_argument("--prompt-field", help="JSONL key of each problem's exact prompt (default: the paper's prompt)")
    run.add_argument("--limit", type=int, help="first N problems (Countdown: how many to draw)")
    run.add_argument("--n", type=int, default=64, help="samples per problem (paper: 64)")
    sampling_help = "(default: {}, the paper's; with --samples: what they were drawn at, if samples.jsonl does not say)"
    run.add_argument("--temperature", type=float, help=sampling_help.format(PAPER_SAMPLING["temperature"]))
    run.add_argument("--top-p", type=float, help=sampling_help.format(PAPER_SAMPLING["top_p"]))
    run.add_argument("--max-new-tokens", type=int, default=1024)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--backend", choices=["auto", "transformers", "vllm"], default="auto")
    run.add_argument("--chat", choices=["auto", "yes", "no"], default="auto", help="wrap prompts in the chat template")
    run.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="weights' dtype, either backend (auto: the model's)"
    )
    run.add_argument("--tensor-parallel-size", type=positive_int, help="vLLM: GPUs per model (vLLM's default: 1)")
    run.add_argument(
        "--gpu-memory-utilization", type=fraction, help="vLLM: share of GPU memory it may take (vLLM's default: 0.9)"
    )
    run.add_argument("--samples", type=Path, help="score this samples.jsonl instead of generating")
    run.add_argument("--method", required=True, help="label of this run in tables and plots (e.g. grpo, setpo)")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--setpo-url", help="a setpo service: adds mean pairwise similarity and set score D(S)")
    run.add_argument("--setpo-api-key-file", type=Path, help="file holding the service's key (default: SETPO_API_KEY)")
    run.add_argument("--judge-url", help="OpenAI-compatible base URL of an LLM judge (the paper's diversity prompt)")
    run.add_argument("--judge-key-file", type=Path, help="file holding the judge's key (default: SETPO_JUDGE_KEY)")
    run.add_argument("--judge-model", default="gemini-2.5-flash")
    run.add_argument("--judge-samples", type=int, default=16, help="samples per problem shown to the judge (paper: 16)")
    compare = commands.add_parser(
        "compare", help="table and plots from several run directories; runs of one method: mean ± std over seeds"
    )
    compare.add_argument("runs", nargs="+", type=Path)
    compare.add_argument("--out", type=Path, required=True)
    given = sys.argv[1:] if argv is None else argv
    # Before parsing, as setpo-server refuses --api-key: argparse would read --judge-key as --judge-key-file
    for flag, instead in SECRET_FLAGS.items():
        if any(arg.split("=")[0] == flag for arg in given):
            parser.error(f"{flag} is not taken: a command line is visible to every user of the machine (ps); {instead}")
    args = parser.parse_args(given)
    if args.command == "run" and not args.samples and not args.model:
        parser.error("run needs --model, or --samples to score existing samples")
    if args.command == "run" and args.judge_key_file and not args.judge_url:
        parser.error("--judge-key-file needs --judge-url: the judge is only asked when its URL is given")
    return args


def read_secret(path: Path | None, variable: str) -> str | None:
    """A key from its file (without the newline an editor or echo leaves), else from the environment."""
    if path is None:
        return os.environ.get(variable) or None
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise InputError(f"cannot read the key file {path}: {exc.strerror}") from exc
    if not key:
        raise InputError(f"the key file {path} is empty")
    return key


def load_problems(args: argparse.Namespace) -> list[datasets.Problem]:
    fields = datasets.FieldMap(**{f: getattr(args, f"{f}_field") for f in datasets.FieldMap.__dataclass_fields__})
    if args.prompt_field and not args.dataset.endswith(".jsonl"):
        raise InputError("--prompt-field needs a .jsonl dataset")
    try:
        problems = datasets.load(args.dataset, args.limit, args.kind, fields, args.seed, args.prompt_field)
    except FileNotFoundError as exc:
        raise InputError(f"no dataset file {args.dataset}") from exc
    except (OSError, ValueError) as exc:  # an unknown name, a line that is not JSON or lacks a field: it says which
        raise InputError(str(exc)) from exc
    if not problems:
        raise InputError(f"dataset {args.dataset} has no problems")
    return problems


def read_samples(args: argparse.Namespace, problems: list[datasets.Problem]) -> tuple[list[list[str]], dict]:
    """Each problem's responses from --samples, and the temperature and top-p they were drawn at."""
    try:
        rows = [row for _, row in read_jsonl(args.samples, ["problem_id", "response"])]
    except FileNotFoundError as exc:
        raise InputError(f"no samples file {args.samples}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{args.samples} has a line that is not JSON ({exc})") from exc
    except (OSError, ValueError) as exc:
        raise InputError(str(exc)) from exc
    if not rows:
        raise InputError(f"{args.samples} holds no samples")
    by_problem: dict[str, list[str]] = {}
    for row in rows:
        by_problem.setdefault(row["problem_id"], []).append(row["response"])
    missing = [p.id for p in problems if p.id not in by_problem]
    if missing:
        raise InputError(
            f"{args.samples} has no samples for problem {missing[0]} ({len(missing)} of {len(problems)} lack them): "
            "were they drawn from this --dataset, --limit and --seed?"
        )
    return [by_problem[p.id] for p in problems], drawn_at(rows, args)


def drawn_at(rows: list[dict], args: argparse.Namespace) -> dict[str, float | None]:
    """The temperature and top-p given samples were drawn at: what their rows say (setpo-eval writes both into every
    row), else what --temperature and --top-p say, else unknown (None). Never the paper's defaults: a summary would
    then claim settings the samples may not have had."""
    settings = {}
    for key in PAPER_SAMPLING:
        flag, recorded = getattr(args, key), {row.get(key) for row in rows}
        if len(recorded) > 1:
            values = ", ".join(sorted("unrecorded" if v is None else str(v) for v in recorded))
            raise InputError(f"{args.samples} mixes samples drawn at {key} {values}: score each setting on its own")
        (value,) = recorded
        if value is not None and flag is not None and flag != value:
            raise InputError(f"{args.samples} was drawn at {key} {value}, not --{key.replace('_', '-')} {flag}")
        settings[key] = flag if value is None else value
    if None in settings.values():
        log.warning(
            "%s does not say its temperature and top-p; pass --temperature and --top-p to record them", args.samples
        )
    return settings


def generate_samples(args: argparse.Namespace, problems: list[datasets.Problem], sampling: dict) -> list[list[str]]:
    from setpo_trainer.eval.generate import generate

    return generate(
        args.model,
        [p.prompt for p in problems],
        args.n,
        sampling["temperature"],
        sampling["top_p"],
        args.max_new_tokens,
        args.seed,
        args.backend,
        {"auto": None, "yes": True, "no": False}[args.chat],
        args.dtype,
        {name: getattr(args, name) for name in VLLM_ENGINE if getattr(args, name) is not None},
    )


def run(args: argparse.Namespace) -> dict:
    problems = load_problems(args)
    # Keys are read before generating: a key file that cannot be read should not cost a generation first
    setpo_key = read_secret(args.setpo_api_key_file, "SETPO_API_KEY")
    judge_key = read_secret(args.judge_key_file, "SETPO_JUDGE_KEY")
    if args.samples:
        samples, sampling = read_samples(args, problems)
    else:
        sampling = {
            key: default if getattr(args, key) is None else getattr(args, key)
            for key, default in PAPER_SAMPLING.items()
        }
        samples = generate_samples(args, problems, sampling)

    rewards = [[p.reward(r) for r in group] for p, group in zip(problems, samples)]
    answers = [[p.correct_answer(r) for r in group] for p, group in zip(problems, samples)]
    solutions = [[p.solution(r) for r in group] for p, group in zip(problems, samples)]
    # Written before the service and judge are asked: if they fail, `--samples` scores these again
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "samples.jsonl").open("w") as file:
        for j, (p, group) in enumerate(zip(problems, samples)):
            for i, response in enumerate(group):
                reward = rewards[j][i]
                row = {"problem_id": p.id, "sample": i, "response": response, "reward": reward}
                row |= {"correct": reward == 1.0, "answer": answers[j][i], "solution": solutions[j][i]}
                file.write(json.dumps(row | sampling) + "\n")  # its sampling settings, for a later --samples
    log.info("wrote %s", args.out / "samples.jsonl")
    diversity: dict[str, float | int | bool | None] = {
        "distinct_correct_mean": fmean(metrics.distinct_correct(answers))
    }
    if problems[0].kind == "countdown":
        diversity.update(metrics.countdown_diversity(answers))
        diversity.update(metrics.solution_diversity(solutions))
    if args.setpo_url:
        from setpo_client import SetpoClient

        with SetpoClient(args.setpo_url, api_key=setpo_key) as client:
            diversity.update(metrics.service_diversity(client, samples))
    if args.judge_url:
        scores = [
            judge_diversity(p.question, group[: args.judge_samples], args.judge_url, judge_key, args.judge_model)[0]
            for p, group in zip(problems, samples)
        ]
        diversity["judge_score_mean"] = fmean(scores)

    summary = {
        "method": args.method,
        "dataset": args.dataset,
        "model": args.model,
        "problems": len(problems),
        "n": len(samples[0]),
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "seed": args.seed,
        "accuracy": metrics.accuracy([[r == 1.0 for r in group] for group in rewards]),
        "diversity": diversity,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def load_runs(run_dirs: list[Path]) -> list[dict]:
    from setpo_trainer.eval import report

    for run_dir in run_dirs:
        if not (run_dir / "summary.json").is_file():
            raise InputError(f"{run_dir} has no summary.json: it is not a directory setpo-eval run wrote")
    return report.load_summaries(run_dirs)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        summaries = [run(args)] if args.command == "run" else load_runs(args.runs)
    except InputError as exc:
        print(f"setpo-eval: {exc}", file=sys.stderr)
        sys.exit(2)
    except (SetpoError, JudgeError) as exc:  # the service or the judge failed after samples.jsonl was written
        sys.exit(f"setpo-eval: {exc} ({args.out / 'samples.jsonl'} is kept: --samples scores it again)")
    from setpo_trainer.eval import report

    out = args.out
    if args.command == "compare":
        out.mkdir(parents=True, exist_ok=True)
        (out / "seeds.json").write_text(json.dumps(report.seed_summaries(summaries), indent=2))
    table = report.markdown(summaries)
    (out / "summary.md").write_text(table + "\n")
    plots = report.plot(summaries, out)
    print(table)
    print(f"wrote {out / 'summary.md'} and {', '.join(str(p) for p in plots)}")


if __name__ == "__main__":
    main()
