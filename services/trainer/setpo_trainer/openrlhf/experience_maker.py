"""SetpoExperienceMaker: OpenRLHF's RemoteExperienceMaker, plus SetPO's bonus on each response's advantage.

OpenRLHF computes rewards, the group advantages (group_norm for GRPO, GSPO and DAPO; also dr_grpo, rloo,
reinforce_baseline) and per-token advantages as it always does. SetPO's part comes in two halves, so that
OpenRLHF's own forward passes hide the service's time:
1. make_experience, before the actor / reference / critic (and reward model) passes: every response is decoded with
   the trainer's tokenizer and the rollout batch's groups, with each response's reward (as OpenRLHF's advantage step
   will see it: after its length penalties), go to SetpoShaper.submit, which asks the service on a thread of its own.
   Rewards a reward model gives exist only after those passes: the texts then go alone, or, when --setpo.min_reward
   needs the rewards, the step is scored at the advantage step instead.
2. compute_advantages_and_returns, after OpenRLHF's: the rows are decoded again and SetpoShaper.shape collects the
   early answer if they are the step submitted (the same texts and rewards, in rollout order), else scores them
   there and then. Each response's advantage to train on, Â_i (A_i + bonus_i, or the base --setpo.advantage names
   combined with it as --setpo.combine says), replaces A_i, its mean over the response tokens as OpenRLHF gave it:
   every response token of response i moves by Â_i - A_i. Prompt and padding positions (action_mask = 0) are left
   untouched, so the policy loss (PPO clip, clip-higher, or GSPO's sequence ratio) sees Â_i.

The step's SetPO metrics ride in `experience.info` as one value per sample: OpenRLHF's actor averages info
over the batch and its trainer sends the result to W&B / TensorBoard as `train/setpo/...`, every step.
"""

import logging
import math
import os
import time
from types import SimpleNamespace

import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.length_penalty import apply_length_penalties
from openrlhf.utils.logging_utils import init_logger

from setpo_client.client import DEFAULT_URL, SetpoClient
from setpo_client.errors import SetpoAPIError, SetpoError
from setpo_client.policy import CONTROLLER_SETTINGS, diversity_policy
from setpo_client.shaping import SetpoShaper
from setpo_trainer.openrlhf.flags import POLICY, spell

logger = init_logger(__name__)


class SetpoExperienceMaker(RemoteExperienceMaker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        setpo = getattr(self.args, "setpo", None)  # the --setpo.* flags, parsed by setpo-train with OpenRLHF's own
        if setpo is None:
            raise RuntimeError("SetpoExperienceMaker needs the --setpo.* arguments: start training with setpo-train")
        client = SetpoClient(
            setpo.url or DEFAULT_URL, timeout=setpo.timeout, max_retries=setpo.max_retries
        )  # key: $SETPO_API_KEY
        settings = {name: getattr(setpo, name) for name in ("weight", *POLICY)}
        if setpo.target_ratio is not None:  # with its knobs; setpo-train checked the flags before Ray started
            settings |= {name: getattr(setpo, name) for name in ("target_ratio", *CONTROLLER_SETTINGS)}
        policy = diversity_policy(settings, spell)  # the key function is loaded by name here, in the trainer actor
        self.setpo = SetpoShaper(
            client, setpo.weight, setpo.on_error, setpo.max_chars, in_flight=setpo.in_flight, **policy
        )
        self.setpo_embed = setpo.embed
        if getattr(setpo, "driver_key", False) and not os.environ.get("SETPO_API_KEY"):
            # setpo-train checked the service with a key this worker lacks (a Ray worker gets the environment of its
            # `ray start`, not the driver's): a service that wants it stops the run now, not after a run at lambda 0
            try:
                client.info()
            except SetpoAPIError as exc:
                if exc.status == 401:
                    raise RuntimeError(
                        "SetPO: setpo-train checked the service with SETPO_API_KEY, but this Ray worker has none and "
                        f"the service refuses it ({exc.message}). Set SETPO_API_KEY where the workers start: in "
                        "`ray start`'s environment, or the worker pod template (its Secret)."
                    ) from None
            except SetpoError:
                pass  # the service's other failures meet each step's fault policy
        logger.info(
            f"SetPO experience maker active (lambda={setpo.weight}, url={setpo.url}, in_flight={setpo.in_flight}, "
            f"embed={setpo.embed}, on_error={setpo.on_error}, min_reward={setpo.min_reward}, key={setpo.key}, "
            f"kernel={setpo.kernel}, normalize={setpo.normalize}, embed_span={setpo.embed_span}, "
            f"advantage={setpo.advantage}, combine={setpo.combine}, target_ratio={setpo.target_ratio})"
        )

    @torch.no_grad()
    def make_experience(self, samples_list: list[Experience]) -> list[Experience]:
        """OpenRLHF's forward passes, with this step's SetPO scoring in flight meanwhile, submitted as soon as what
        it needs exists: the texts, and the rewards with --setpo.min_reward (a reward model's come only with the
        passes: the step is then scored at the advantage step). Rewards are sent whenever they exist, as the
        advantage step would send them."""
        started = time.perf_counter()
        rewards = penalized_rewards(samples_list, self.args) if samples_list[0].rewards is not None else None
        if rewards is not None or self.setpo.min_reward is None:
            texts, known = self.groups(samples_list, rewards)
            self.setpo.submit(texts, rewards=known, started=started)
        return super().make_experience(samples_list)

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        experiences = super().compute_advantages_and_returns(experiences)
        started = time.perf_counter()
        n = self.args.rollout.n_samples_per_prompt
        # Dynamic filtering has already dropped whole groups before this point (not the all-correct ones under
        # --setpo.keep_groups on).
        texts, rewards = self.groups(experiences, [experience.rewards for experience in experiences])
        # a row's advantage as one number: its mean over the response tokens (constant per row for group_norm
        # unless the KL is in the reward)
        given = in_rollout_order(experiences, [row_means(e.advantages, e.action_mask) for e in experiences])
        step = self.setpo.shape(texts, rewards=rewards, advantages=in_groups(given, n), started=started)

        algo, floor = self.args.algo, self.setpo.min_reward
        if floor is not None and algo.dynamic_filtering_enable and math.isinf(algo.dynamic_filtering_range[1]):
            # setpo-train lifted the range's top (--setpo.keep_groups): the groups it kept that way all reach min_reward
            # (what dynamic filtering judged: the reward file's scores, else the rewards)
            scores = in_rollout_order(
                experiences, [e.scores if e.scores is not None else e.rewards for e in experiences]
            )
            reaching = [all(score >= floor for score in scores[i : i + n]) for i in range(0, len(scores), n)]
            step.metrics["setpo/kept_by_bonus"] = float(sum(reaching))
        assert step.advantages is not None  # the advantages were passed
        shaped = [a for group in step.advantages for a in group]
        shift = torch.tensor([after - before for after, before in zip(shaped, given)])  # (rollout rows,) Â - A
        for experience in experiences:
            row_shift = shift[experience.index].to(experience.advantages.dtype)  # (B,)
            # (B, A): response tokens move; prompt and padding positions stay 0
            experience.advantages = experience.advantages + row_shift[:, None] * experience.action_mask

        # SetpoShaper's metrics, its timing included (time_s: all of SetPO's time; wait_s: what of it blocked)
        for experience in experiences:
            rows_in = len(experience.index)
            for name, value in step.metrics.items():
                experience.info[name] = torch.full((rows_in,), float(value))  # (B,): the batch mean is the value
        return experiences

    def groups(
        self, experiences: list[Experience], rewards: list[torch.Tensor] | None
    ) -> tuple[list[list[str]], list[list[float]] | None]:
        """The rollout's groups as SetpoShaper takes them: each row's text, decoded with the trainer's tokenizer,
        and its reward when known. experience.index holds each row's place in the rollout batch, where a prompt's n
        samples are consecutive (OpenRLHF's group_norm reshapes them the same way)."""
        texts = [""] * sum(len(experience.index) for experience in experiences)
        for experience in experiences:
            for row, index in enumerate(experience.index):
                if self.setpo_embed == "response":
                    # action_mask[t] marks sequences[t + 1]: the response tokens (several spans for agents)
                    tokens = experience.sequences[row, 1:][experience.action_mask[row].bool()]
                else:  # prompt_response: the whole trajectory as the policy saw it, without padding
                    tokens = experience.sequences[row][experience.attention_mask[row].bool()]
                texts[index] = self.tokenizer.decode(tokens, skip_special_tokens=True)
        n = self.args.rollout.n_samples_per_prompt
        known = None if rewards is None else in_groups(in_rollout_order(experiences, rewards), n)
        return in_groups(texts, n), known


def penalized_rewards(samples_list: list[Experience], args) -> list[torch.Tensor]:
    """Each experience's rewards as OpenRLHF's advantage step will see them (promoted to float32 at least, after its
    length penalties: DAPO's overlong, ProRL's stop-properly), by OpenRLHF's own function applied to copies."""
    copies = [
        SimpleNamespace(
            rewards=s.rewards.to(torch.promote_types(s.rewards.dtype, torch.float32), copy=True),
            response_length=s.response_length,
            truncated=s.truncated,
            info={},
        )
        for s in samples_list
    ]
    penalties = logging.getLogger(apply_length_penalties.__module__)
    was = penalties.disabled
    penalties.disabled = True  # it logs how many it penalised at the advantage step, where they apply: not twice
    try:
        apply_length_penalties(copies, args)
    finally:
        penalties.disabled = was
    return [copy.rewards for copy in copies]


def in_groups(rows: list, n: int) -> list[list]:
    """Rows in rollout order, as groups of a prompt's n samples."""
    return [rows[i : i + n] for i in range(0, len(rows), n)]


def row_means(values: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """(B, A) per-token values -> (B,) their mean over each row's response tokens."""
    mask = action_mask.float()
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def in_rollout_order(experiences: list[Experience], values: list[torch.Tensor]) -> list[float]:
    """Per-experience (B,) values as one list, each row's at its place in the rollout batch (experience.index)."""
    ordered = [0.0] * sum(len(experience.index) for experience in experiences)
    for experience, value in zip(experiences, values):
        for index, number in zip(experience.index, value.tolist()):
            ordered[index] = number
    return ordered
