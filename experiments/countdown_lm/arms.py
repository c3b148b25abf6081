"""The arms of experiment v2: what each method is, as SetpoGRPOTrainer's settings, and the validation grid.

An arm is one way to train; a config is an arm at one weight. Every weight is chosen on the validation split
(docs/experiments.md, v2): the paper's form at a raw lambda, SetPO scoped to correct members with z-scored marginals
under each kernel, the best of those steered by the weight controller, and the unlikeliness reward (He et al.,
2025: correct answers ranked by their likelihood under the policy, the likeliest rewarded least) as the baseline a
user would pick instead.
"""

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Config:
    arm: str  # grpo | paper | scoped-embedding | scoped-key | scoped-hybrid | controller-<kernel> | unlikeliness
    # | scoped-answer-span (v3: the scoped embedding form, embedding the answer span alone)
    weight: float = 0.0  # lambda (the controller's first lambda); 0: no SetPO
    min_reward: float | None = None
    kernel: str = "embedding"
    normalize: str = "none"
    target_ratio: float | None = None  # the weight controller's RMS(bonus) / RMS(advantage)
    rank_penalty: float = 0.0  # the unlikeliness reward's beta_rank
    embed_span: str | None = None  # what of a response the service embeds (experiment v3: the answer span)
    # experiment v4 (coverage): the base the bonus combines with, and how; a base other than the framework's trains on
    # the pass/fail reward (1 correct, else 0), which MaxRL and W-REINFORCE assume
    advantage: str = "framework"  # framework (TRL's Dr. GRPO) | maxrl | w_reinforce
    combine: str = "add"  # add (the paper) | reshare (the bonus re-shares the base's positive push)
    positive_weight: float = 0.1  # W-REINFORCE's lambda
    focal: float = 0.0  # F-GRPO's gamma: each group's reward scaled by (1 - its success rate) ** gamma; 0: off
    replay: bool = False  # replay of a bank of verified distinct solutions beside the RL loss (Re:Max's recipe)
    replay_threshold: float | None = None  # the cosine at which two answers are one to the bank (chosen on validation)

    @property
    def name(self) -> str:
        """A directory name that says the arm and its weight (none for an arm without SetPO)."""
        if self.target_ratio is not None:
            return f"{self.arm}-ratio{self.target_ratio:g}"
        if self.rank_penalty:
            return f"{self.arm}-beta{self.rank_penalty:g}"
        name = self.arm if self.arm == "grpo" or self.weight == 0 else f"{self.arm}-w{self.weight:g}"
        return f"{name}-replay" if self.replay else name

    @property
    def uses_service(self) -> bool:
        return (self.weight > 0 and self.kernel != "key") or self.replay

    def as_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


GRPO = Config("grpo")
SCOPE = {"min_reward": 1.0, "normalize": "zscore"}  # correct answers only (reward 1), in units of their spread


def phase_one(plan) -> list[Config]:
    """GRPO, the paper's form, every scoped kernel and the unlikeliness reward, each at every weight of its grid."""
    # the scoped forms first: they decide the recommendation, and an experiment stopped early has them
    return [
        GRPO,
        *(Config(f"scoped-{k}", weight=w, kernel=k, **SCOPE) for k in plan.kernels for w in plan.scoped_weights),
        *(Config("paper", weight=w) for w in plan.paper_weights),
        *(Config("unlikeliness", rank_penalty=b) for b in plan.rank_penalties),
    ]


def keyless(plan) -> list[Config]:
    """Experiment v3: the scoped form with no solution key, embedding only each response's answer span."""
    return [Config("scoped-answer-span", weight=w, embed_span=plan.answer_span, **SCOPE) for w in plan.scoped_weights]


# Experiment v4: the coverage-keeping bases alone, and SetPO's keyless scoped form re-sharing their positive push.
MAXRL = Config("maxrl", advantage="maxrl")
W_REINFORCE = Config("w-reinforce", advantage="w_reinforce", positive_weight=0.1)
F_GRPO = Config("f-grpo", focal=1.0)
KEYLESS = Config("scoped-embedding", weight=0.3, **SCOPE)  # v3's recommendation without a key
KEYED = Config("scoped-hybrid", weight=0.3, kernel="hybrid", **SCOPE)  # v2's keyed form: a reference, needs a key


def coverage(plan) -> list[Config]:
    """v4's validation arms before replay, in the order they run: GRPO first (its pass@1 is the floor), the bases,
    the combined forms (the scoped embedding form's z-scored marginals re-sharing each base's positive push, at each
    weight of plan.reshare_weights), then v3's keyless and keyed forms under the new protocol."""
    reshared = [
        replace(base, arm=f"reshare-{base.arm}", weight=w, combine="reshare", **SCOPE)
        for base in (MAXRL, W_REINFORCE)
        for w in plan.reshare_weights
    ]
    return [GRPO, MAXRL, W_REINFORCE, *reshared, F_GRPO, KEYLESS, KEYED]


def phase_two(best_scoped: Config, ratios: tuple[float, ...]) -> list:
    """The best scoped form, with lambda steered to each target ratio instead of fixed (its first lambda: its own)."""
    arm = f"controller-{best_scoped.kernel}"
    return [replace(best_scoped, arm=arm, target_ratio=ratio) for ratio in ratios]
