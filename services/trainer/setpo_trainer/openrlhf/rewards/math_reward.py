"""OpenRLHF reward function: GSM8K / MATH, 1.0 when the response's final (boxed) answer equals the label.

--reward.remote_url <this file> --data.label_key label      (labels: reference final answers, e.g. "72")
"""

import torch

from setpo_trainer.openrlhf.rewards import response_text
from setpo_trainer.rewards import extract_final_answer, math_reward


def reward_func(queries: list[str], prompts: list[str], labels: list[str], **kwargs) -> dict:
    responses = [response_text(query, prompt) for query, prompt in zip(queries, prompts)]
    rewards = torch.tensor([math_reward(response, str(label)) for response, label in zip(responses, labels)])  # (B,)
    answered = torch.tensor([float(extract_final_answer(response) is not None) for response in responses])  # (B,)
    # rewards feed the advantages; scores (0/1) feed DAPO's dynamic filtering; extra_logs go to the logger
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"answer_found": answered}}
