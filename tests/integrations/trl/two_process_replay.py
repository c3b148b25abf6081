"""Run by test_trl_replay under `torchrun --nproc_per_node 2` on CPU: replay where only one prompt's answers are ever
verified, and each process gets a group of its own, so that on some steps one process has banked answers to replay
and the other none. Each rank writes its bank and what it logged to $OUT/rank<k>.json."""

import json
import os
import sys

from datasets import Dataset
from trl import GRPOConfig

from setpo_client import SetpoClient
from setpo_client.integrations.trl import SetpoGRPOTrainer

model_path, url, out = sys.argv[1:4]
args = GRPOConfig(
    output_dir=out,
    per_device_train_batch_size=4,  # one whole group of 4 on each process
    num_generations=4,
    max_completion_length=10,
    max_steps=4,
    learning_rate=1e-4,
    beta=0.0,
    logging_steps=1,
    report_to=[],
    use_cpu=True,
    save_strategy="no",
    seed=0,
)
trainer = SetpoGRPOTrainer(
    model=model_path,
    # verified: an even-length answer to the sum; the other prompt is never banked
    reward_funcs=lambda prompts, completions, **kw: [
        float(len(c) % 2 == 0 and "2 + 3" in p) for p, c in zip(prompts, completions)
    ],
    args=args,
    train_dataset=Dataset.from_dict({"prompt": ["What is 2 + 3?", "Name a prime."] * 8}),
    setpo_client=SetpoClient(url, max_retries=0),
    setpo_weight=0.5,
    setpo_min_reward=1.0,
    setpo_normalize="zscore",
    setpo_replay_weight=0.1,
    setpo_replay_threshold=0.9,
)
trainer.train()
rank = trainer.accelerator.process_index
with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
    logged = [entry for entry in trainer.state.log_history if "setpo/replay_prompts" in entry]
    json.dump(
        {"bank": trainer.setpo_replay.state_dict(), "replay_prompts": [e["setpo/replay_prompts"] for e in logged]}, file
    )
