"""Reward functions shared by every trainer and by the evaluation: one verifier, however it is called."""

from setpo_trainer.rewards.countdown import countdown_reward, evaluate_expression, extract_expression
from setpo_trainer.rewards.math_answer import answers_match, extract_final_answer, math_reward

__all__ = [
    "answers_match",
    "countdown_reward",
    "evaluate_expression",
    "extract_expression",
    "extract_final_answer",
    "math_reward",
]
