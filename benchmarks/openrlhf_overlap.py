"""SetPO off OpenRLHF's critical path, measured at component level: setpo/wait_s / setpo/time_s of
SetpoExperienceMaker on real OpenRLHF experience batches, against the real setpo-server on this machine.

Each step is OpenRLHF's own make_experience_batch: SetPO's early submit, then the actor's and reference's log-prob
passes, then the advantage step that collects the answer. A whole OpenRLHF step needs GPUs (vLLM, DeepSpeed), so
the GPU actor groups stand in (tests/trainer/rollouts.py's ModelGroup): each batched pass runs OpenRLHF's own Actor
on a tiny random Llama on CPU (micro-batches of 8) and sleeps --pass-s, standing for GPU passes during which the
trainer actor only waits in ray.get (a CPU pass of that length would take the cores the CPU service needs; on a
cluster the service has its own GPU). The responses are GSM8K problems answered right, wrong or not at all (rollouts.responses),
--prompts groups of 4. The same steps on the synchronous path (OpenRLHF's passes, then the advantage step asks
the service) are the reference: there wait_s is time_s.

    PYTHONPATH=tests/trainer/placeholders:.:clients/python:core:services/trainer:services/embedding_server \\
        .venv-openrlhf/bin/python -m benchmarks.openrlhf_overlap [--prompts 16] [--steps 5] [--pass-s 0.5] \\
        [--no-actor]
"""

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from openrlhf.trainer.ppo_utils import experience_maker as openrlhf_maker

from setpo_server.local import LocalServer
from tests.tiny_model import tiny_llama
from tests.trainer.rollouts import (
    KINDS,
    RAY_STAND_IN,
    SETTINGS,
    ModelGroup,
    gsm8k_problems,
    log_prob_pass,
    makers,
    rollout_samples,
)


def timed_passes(model: str | None, pass_s: float) -> tuple[ModelGroup, ModelGroup, list[float]]:
    """The actor's and reference's groups (each batched pass: OpenRLHF's Actor on CPU over the micro-batches, or
    log-probs 0 without a model, and pass_s of waiting) and spent[0]: the seconds their passes took since it was
    last set to 0."""
    spent = [0.0]

    def gpu_pass():  # the trainer actor waiting in ray.get
        time.sleep(pass_s)
        spent[0] += pass_s

    def timed(forward):
        def run(**batch):
            began = time.perf_counter()
            out = forward(**batch)
            spent[0] += time.perf_counter() - began
            return out

        return run

    if model is None:
        actor = reference = lambda action_mask, **_: torch.zeros(action_mask.shape)
    else:
        actor, reference = log_prob_pass(model), log_prob_pass(model, temperature=1.5)
    return ModelGroup(timed(actor), gpu_pass), ModelGroup(timed(reference), gpu_pass), spent


def measure(setpo, plain, samples, early: bool, spent: list[float]) -> dict[str, float]:
    """One step's passes_s, setpo/time_s and setpo/wait_s: make_experience_batch with the early submit, or
    OpenRLHF's own passes (`plain`, its maker without SetPO) and then SetPO's advantage step."""
    spent[0] = 0.0
    batch = copy.deepcopy(samples)
    if early:
        experiences = setpo.make_experience_batch(batch)
    else:
        experiences = setpo.compute_advantages_and_returns(plain.make_experience(plain.split_rollout_samples(batch)))
    info = experiences[0].info
    return {"passes_s": spent[0], "time_s": info["setpo/time_s"][0].item(), "wait_s": info["setpo/wait_s"][0].item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="groups of 4 responses a step")
    parser.add_argument("--steps", type=int, default=5, help="steps on each path (after one warm-up step each)")
    parser.add_argument("--pass-s", type=float, default=0.5, help="seconds each batched GPU pass stands for")
    parser.add_argument(
        "--actor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run OpenRLHF's Actor on the tiny model in each pass (--no-actor: only the --pass-s wait)",
    )
    args = parser.parse_args()
    openrlhf_maker.ray = RAY_STAND_IN  # the model groups run in this process
    with tempfile.TemporaryDirectory() as tmp, LocalServer(dtype="float32") as server:
        model = tiny_llama(Path(tmp))
        flags = [*SETTINGS["grpo"], "--rollout.batch_size", str(args.prompts), "--rollout.micro_batch_size", "8"]
        plain, setpo, strategy, tokenizer = makers(model, server.url, *flags)
        problems = gsm8k_problems(args.prompts)
        samples = rollout_samples(strategy, tokenizer, problems, [KINDS[i % len(KINDS)] for i in range(args.prompts)])
        actor, reference, spent = timed_passes(model if args.actor else None, args.pass_s)
        for maker in (plain, setpo):
            maker.actor_model_group, maker.initial_model_group = actor, reference

        what = "the CPU Actor + " if args.actor else ""
        print(f"{args.prompts} groups of 4; each batched pass: {what}{args.pass_s} s; {args.steps} steps a path")
        print(f"{'path':<16} {'passes_s':>9} {'time_s':>8} {'wait_s':>8} {'wait/time':>9}")
        for early in (True, False):
            name = "early" if early else "synchronous"
            measure(setpo, plain, samples, early, spent)  # warm-up: the first step pays for loading and compiling
            rows = [measure(setpo, plain, samples, early, spent) for _ in range(args.steps)]
            for row in rows:
                ratio = row["wait_s"] / row["time_s"]
                print(f"{name:<16} {row['passes_s']:9.3f} {row['time_s']:8.3f} {row['wait_s']:8.3f} {ratio:9.3f}")
            median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
            ratio = statistics.median(row["wait_s"] / row["time_s"] for row in rows)
            print(
                f"{name + ' (median)':<16} {median['passes_s']:9.3f} {median['time_s']:8.3f} "
                f"{median['wait_s']:8.3f} {ratio:9.3f}"
            )


if __name__ == "__main__":
    main()
