"""GRPO vs SetPO+GRPO on a real LLM on CPU: SmolLM2-135M-Instruct on small Countdown puzzles, through TRL.

Both methods run the same code (SetpoGRPOTrainer; GRPO is lambda = 0, which sends nothing to the service),
the same seed, data and number of steps. Puzzles: 3 numbers from 1-10, targets 10-50 (reasoning-gym), the
paper's Countdown prompt as a plain completion (it already ends in "Assistant: ... <think>"), the paper's
reward (1 for a correct expression, 0.1 for a formatted wrong one). Writes out/<method>/model, the log
history with the setpo/* metrics per step, and eval_problems.jsonl for setpo-eval.

    python experiments/llm_cpu/train_trl.py --method grpo  --out out/llm_cpu --serve
    python experiments/llm_cpu/train_trl.py --method setpo --out out/llm_cpu --serve
"""

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

from datasets import Dataset
from trl import GRPOConfig

from setpo_client import SetpoClient
from setpo_client.integrations.trl import SetpoGRPOTrainer
from setpo_trainer.eval.datasets import COUNTDOWN_TEMPLATE
from setpo_trainer.models import smollm2_path
from setpo_trainer.packaged_data import countdown_puzzles
from setpo_trainer.rewards import countdown_reward

PUZZLES = {"min_numbers": 3, "max_numbers": 3, "min_value": 1, "max_value": 10, "min_target": 10, "max_target": 50}


def puzzles(size: int, seed: int) -> list[dict]:
    return countdown_puzzles(size, seed, **PUZZLES)  # smaller than the paper's: a 135M model on CPU


def countdown(completions, numbers, target, **kwargs) -> list[float]:
    return [countdown_reward(c, list(n), t) for c, n, t in zip(completions, numbers, target)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=["grpo", "setpo"], required=True)
    parser.add_argument("--out", type=Path, default=Path("out/llm_cpu"))
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--setpo-url")
    where.add_argument("--serve", action="store_true", help="start a setpo service for the run")
    parser.add_argument("--weight", type=float, default=0.5, help="lambda for setpo (the paper's Countdown setting)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--generations", type=int, default=8, help="G")
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--learning-rate", type=float, default=5e-6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    out = args.out / args.method
    out.mkdir(parents=True, exist_ok=True)
    train = puzzles(args.steps * args.prompts_per_step, seed=args.seed)
    with (args.out / "eval_problems.jsonl").open("w") as file:
        for i, item in enumerate(puzzles(50, seed=10_000 + args.seed)):
            file.write(json.dumps({"id": f"eval-{i}", **item}) + "\n")
    dataset = Dataset.from_list(
        [{"prompt": COUNTDOWN_TEMPLATE.format(numbers=p["numbers"], target=p["target"]), **p} for p in train]
    )
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.prompts_per_step * args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        learning_rate=args.learning_rate,
        beta=0.0,
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=args.seed,
    )
    if args.serve:
        from setpo_server.local import LocalServer

        service = LocalServer()
    else:
        service = nullcontext()
    with service as running:
        client = SetpoClient(args.setpo_url or running.url)
        client.wait_until_ready()
        trainer = SetpoGRPOTrainer(
            model=str(smollm2_path()),
            reward_funcs=countdown,
            args=config,
            train_dataset=dataset,
            setpo_client=client,
            setpo_weight=args.weight if args.method == "setpo" else 0.0,
        )
        started = time.perf_counter()
        trainer.train()
        minutes = (time.perf_counter() - started) / 60
    trainer.save_model(str(out / "model"))
    trainer.processing_class.save_pretrained(str(out / "model"))
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    shares = [e["setpo/time_share"] for e in history if "setpo/time_share" in e]  # SetpoShaper's, from step 2 on
    share = sum(shares) / len(shares) if shares else 0.0
    reward = sum(e["reward"] for e in history[-5:]) / min(5, len(history))
    print(
        f"{args.method}: {args.steps} steps in {minutes:.1f} min; reward (last 5 steps) {reward:.3f}; "
        f"SetPO time share {share:.2%}; wrote {out / 'model'}"
    )


if __name__ == "__main__":
    main()
