"""OpenRLHF reward function: Countdown, 1.0 for an <answer> that uses every given number exactly once and
equals the target, the paper's 0.1 format term for an <answer> that does not, 0.0 without one.

    --reward.remote_url <this file> --data.label_key label      (labels: '{"numbers": [35, 51, 46], "target": 40}')
"""

import json

import torch

from setpo_trainer.openrlhf.rewards import response_text
from setpo_trainer.rewards import countdown_reward

FORMAT_SCORE = 0.1  # paper, section 5.2: "an auxiliary format reward term with a weight of 0.1"


def reward_func(queries: list[str], prompts: list[str], labels: list, **kwargs) -> dict:
    values = []
    for query, prompt, label in zip(queries, prompts, labels):
        puzzle = json.loads(label) if isinstance(label, str) else label
        if not isinstance(puzzle, dict) or not {"numbers", "target"} <= puzzle.keys():
            raise ValueError(f"a Countdown label is {{'numbers': [...], 'target': N}} (JSON), got {label!r}")
        values.append(
            countdown_reward(response_text(query, prompt), list(puzzle["numbers"]), int(puzzle["target"]), FORMAT_SCORE)
        )
    rewards = torch.tensor(values)  # (B,)
    solved = (rewards == 1.0).float()  # (B,)
    # rewards (with the format term) feed the advantages; scores = solved or not feed DAPO's dynamic filtering
    return {"rewards": rewards, "scores": solved, "extra_logs": {"format_ok": (rewards > 0).float()}}
