"""Run by test_two_processes under `torchrun --nproc_per_node 2` on CPU: each rank records what TRL
computed and what its loss received, then writes them to $OUT/rank<k>.json. With on_error (4th argument)
"fail" and a 5th argument (a URL where nothing listens: the service went down after the start check), each
rank that raises writes $OUT/rank<k>.error instead."""

import json
import os
import sys

import torch
from datasets import Dataset
from trl import GRPOConfig

from setpo_client import SetpoClient, SetpoError
from setpo_client.integrations.trl import SetpoGRPOTrainer
from tests.integrations.trl import spy as trl_spy

model_path, url, out = sys.argv[1:4]
on_error = sys.argv[4] if len(sys.argv) > 4 else "skip"
seen = trl_spy.install()
# 2 completions per process and 4 generations per prompt: the step's one group straddles the two processes
args = GRPOConfig(
    output_dir=out,
    per_device_train_batch_size=2,
    num_generations=4,
    max_completion_length=10,
    max_steps=1,
    learning_rate=1e-4,
    beta=0.0,
    report_to=[],
    use_cpu=True,
    save_strategy="no",
    seed=0,
)
trainer = SetpoGRPOTrainer(
    model=model_path,
    reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
    args=args,
    train_dataset=Dataset.from_dict({"prompt": ["What is 2 + 3?", "Name a prime."] * 4}),
    setpo_client=SetpoClient(url, max_retries=0),
    setpo_weight=0.5,
    setpo_on_error=on_error,
)
if len(sys.argv) > 5:
    trainer.setpo.client = SetpoClient(sys.argv[5], max_retries=0)
rank = trainer.accelerator.process_index
try:
    trainer.train()
except SetpoError as exc:
    with open(os.path.join(out, f"rank{rank}.error"), "w") as file:
        file.write(str(exc))
    raise
with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
    trl = [{"advantages": advantages.tolist(), "texts": texts} for advantages, texts in seen["trl"]]
    json.dump({"rank": rank, "trl": trl, "loss": seen["loss"]}, file)
torch.distributed.barrier() if torch.distributed.is_initialized() else None
