"""Run by test_two_processes under `torchrun --nproc_per_node 2` on CPU: each rank records what TRL
computed and what its loss received, then writes them to $OUT/rank<k>.json."""

import json
import os
import sys

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from setpo_client import SetpoClient
from setpo_client.integrations.trl import SetpoGRPOTrainer

model_path, url, out = sys.argv[1:4]
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
# 2 prompts per process and 4 generations per prompt: every group straddles the two processes
args = GRPOConfig(output_dir=out, per_device_train_batch_size=2, num_generations=4, max_completion_length=10, max_steps=1,
                  learning_rate=1e-4, beta=0.0, report_to=[], use_cpu=True, save_strategy="no", seed=0)
trainer = SetpoGRPOTrainer(model=model_path, reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions], args=args,
                           train_dataset=Dataset.from_dict({"prompt": ["What is 2 + 3?", "Name a prime."] * 4}),
                           setpo_client=SetpoClient(url), setpo_weight=0.5)
trainer.train()
rank = trainer.accelerator.process_index
with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
    json.dump({"rank": rank, **seen}, file)
torch.distributed.barrier() if torch.distributed.is_initialized() else None
