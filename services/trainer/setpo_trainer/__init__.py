"""setpo-trainer: SetPO in RL training loops (OpenRLHF), the evaluation toolkit and the paper's experiments."""
