"""`setpo-eval`: evaluate a model's accuracy and diversity, and compare runs.

setpo-eval run --model PATH --dataset gsm8k --n 64 --method setpo --out runs/setpo [--setpo-url URL]
setpo-eval compare runs/grpo-s0 runs/grpo-s1 runs/setpo-s0 runs/setpo-s1 --out runs/compare
    (runs with one --method on one dataset are several seeds of it: also shown as mean ± std, in seeds.json)
"""

import argparse
import json
import logging
import os
from pathlib import Path
from statistics import fmean

from setpo_trainer.eval import datasets, metrics
from setpo_trainer.eval.judge import judge_diversity

log = logging.getLogger("setpo_eval")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="setpo-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    run.add_argument("--temperature", type=float, default=0.5)
    run.add_argument("--top-p", type=float, default=0.9)
    run.add_argument("--max-new-tokens", type=int, default=1024)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--backend", choices=["auto", "transformers", "vllm"], default="auto")
    run.add_argument("--chat", choices=["auto", "yes", "no"], default="auto", help="wrap prompts in the chat template")
    run.add_argument("--samples", type=Path, help="score this samples.jsonl instead of generating")
    run.add_argument("--method", required=True, help="label of this run in tables and plots (e.g. grpo, setpo)")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--setpo-url", help="a setpo service: adds mean pairwise similarity and set score D(S)")
    run.add_argument("--setpo-api-key", default=os.environ.get("SETPO_API_KEY"))
    run.add_argument("--judge-url", help="OpenAI-compatible base URL of an LLM judge (the paper's diversity prompt)")
    run.add_argument("--judge-key", help="API key of the judge (default: SETPO_JUDGE_KEY)")
    run.add_argument("--judge-model", default="gemini-2.5-flash")
    run.add_argument("--judge-samples", type=int, default=16, help="samples per problem shown to the judge (paper: 16)")
    compare = commands.add_parser(
        "compare", help="table and plots from several run directories; runs of one method: mean ± std over seeds"
    )
    compare.add_argument("runs", nargs="+", type=Path)
    compare.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run" and not args.samples and not args.model:
        parser.error("run needs --model, or --samples to score existing samples")
    if args.command == "run" and args.judge_key and not args.judge_url:
        parser.error("--judge-key needs --judge-url: the judge is only asked when its URL is given")
    return args


def run(args: argparse.Namespace) -> dict:
    fields = datasets.FieldMap(**{f: getattr(args, f"{f}_field") for f in datasets.FieldMap.__dataclass_fields__})
    if args.prompt_field and not args.dataset.endswith(".jsonl"):
        raise SystemExit("--prompt-field needs a .jsonl dataset")
    problems = datasets.load(args.dataset, args.limit, args.kind, fields, args.seed, args.prompt_field)
    if args.samples:
        by_problem: dict[str, list[str]] = {}
        for line in args.samples.read_text().splitlines():
            row = json.loads(line)
            by_problem.setdefault(row["problem_id"], []).append(row["response"])
        samples = [by_problem[p.id] for p in problems]
    else:
        from setpo_trainer.eval.generate import generate

        chat = {"auto": None, "yes": True, "no": False}[args.chat]
        samples = generate(
            args.model,
            [p.prompt for p in problems],
            args.n,
            args.temperature,
            args.top_p,
            args.max_new_tokens,
            args.seed,
            args.backend,
            chat,
        )

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
                file.write(json.dumps(row) + "\n")
    log.info("wrote %s", args.out / "samples.jsonl")
    diversity: dict[str, float | int | bool | None] = {
        "distinct_correct_mean": fmean(metrics.distinct_correct(answers))
    }
    if problems[0].kind == "countdown":
        diversity.update(metrics.countdown_diversity(answers))
        diversity.update(metrics.solution_diversity(solutions))
    if args.setpo_url:
        from setpo_client import SetpoClient

        with SetpoClient(args.setpo_url, api_key=args.setpo_api_key) as client:
            diversity.update(metrics.service_diversity(client, samples))
    if args.judge_url:
        judge_key = args.judge_key or os.environ.get("SETPO_JUDGE_KEY")
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
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "accuracy": metrics.accuracy([[r == 1.0 for r in group] for group in rewards]),
        "diversity": diversity,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from setpo_trainer.eval import report

    if args.command == "run":
        summaries = [run(args)]
        out = args.out
    else:
        summaries = report.load_summaries(args.runs)
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "seeds.json").write_text(json.dumps(report.seed_summaries(summaries), indent=2))
    table = report.markdown(summaries)
    (out / "summary.md").write_text(table + "\n")
    plots = report.plot(summaries, out)
    print(table)
    print(f"wrote {out / 'summary.md'} and {', '.join(str(p) for p in plots)}")


if __name__ == "__main__":
    main()
