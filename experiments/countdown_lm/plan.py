"""Every setting of the experiment in one place: the full run (make experiment) and the quick form (make test)."""

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class RLSettings:
    steps: int = 100
    prompts_per_step: int = 8
    generations: int = 8  # G: responses per prompt, the group SetPO scores
    max_completion_length: int = 48  # the longest corpus response is 37 tokens
    learning_rate: float = 1e-4  # 3e-4 made GRPO lose pass@1 on validation in a 60-step trial
    loss_type: str = "dr_grpo"
    scale_rewards: str = "none"  # Dr. GRPO: advantages r - mean(r), not divided by the group's std


@dataclass(frozen=True)
class Plan:
    data_seed: int = 0
    validation_puzzles: int = 32
    test_puzzles: int = 64
    # pretraining: a Llama of ~2 M parameters on `per_puzzle` corpus responses for each training puzzle
    model_size: dict = field(
        default_factory=lambda: {
            "hidden_size": 192,
            "intermediate_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
        }
    )
    per_puzzle: int = 60
    pretrain_epochs: int = 1
    pretrain_batch: int = 64
    pretrain_lr: float = 2e-3
    # lambda sweep on the validation split: short runs, seed 0; lambda = 0 is GRPO, for reference
    sweep_weights: tuple[float, ...] = (0.0, 0.5, 4.0, 16.0)  # s_i has std ~0.01 here: 0.5 barely moves A
    sweep: RLSettings = RLSettings(steps=60)
    # the comparison: GRPO and SetPO+GRPO (the chosen lambda) for every seed, evaluated on the test split
    seeds: tuple[int, ...] = (0, 1, 2)
    rl: RLSettings = RLSettings()
    samples: int = 64  # n per puzzle in evaluation: pass@k for k = 1..64
    max_new_tokens: int = 48


FULL = Plan()
# A few steps of everything, one seed: checks that the pipeline runs and writes every metric, nothing more.
QUICK = replace(
    FULL,
    validation_puzzles=4,
    test_puzzles=4,
    per_puzzle=2,
    sweep_weights=(0.0, 0.5),
    sweep=RLSettings(steps=2, prompts_per_step=2),
    seeds=(0,),
    rl=RLSettings(steps=3, prompts_per_step=2),
    samples=8,
)
