"""Run by test_two_processes under `torchrun --nproc_per_node 2` on CPU: each rank records what TRL
computed and what its loss received, then writes them to $OUT/rank<k>.json. With on_error (4th argument)
"fail" and the service down, each rank that raises writes $OUT/rank<k>.error instead."""

import json
import os
import sys

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from setpo_client import SetpoClient, SetpoError
from setpo_client.integrations.trl import SetpoGRPOTrainer

model_path, url, out = sys.argv[1:4]
on_error = sys.argv[4] if len(sys.argv) > 4 else "skip"
seen = {"trl": [], "loss": []}
generate, loss = GRPOTrainer._generate_and_score_completions, GRPOTrainer.compute_loss


def record_generate(self, inputs):
    output = generate(self, inputs)
    texts = self.processing_class.batch_decode(output["completion_ids"], skip_special_tokens=True)
    seen["trl"].append({"advantages": output["advantages"].tolist(), "texts": texts})
    return output


def record_loss(self, model, inputs, *args, **kwargs):
    texts = self.processing_class.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
    seen["loss"].append(dict(zip(texts, inputs["advantages"].tolist())))
    return loss(self, model, inputs, *args, **kwargs)


GRPOTrainer._generate_and_score_completions, GRPOTrainer.compute_loss = record_generate, record_loss
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
rank = trainer.accelerator.process_index
try:
    trainer.train()
except SetpoError as exc:
    with open(os.path.join(out, f"rank{rank}.error"), "w") as file:
        file.write(str(exc))
    raise
with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
    json.dump({"rank": rank, **seen}, file)
torch.distributed.barrier() if torch.distributed.is_initialized() else None
