"""SetpoExperienceMaker: OpenRLHF's RemoteExperienceMaker with one change, after its advantage step.

OpenRLHF computes rewards, the group advantages (group_norm for GRPO, GSPO and DAPO; also dr_grpo, rloo,
reinforce_baseline) and per-token advantages as it always does. Then, for the rollout batch as a whole:
decode every response with the trainer's tokenizer and hand every group's texts, with each response's reward
and advantage, to SetpoShaper (the --setpo.* diversity policy, fitting the step into requests, fault policy,
lambda fixed or steered, metrics); add the bonus the service answers for response i (lambda * s_i, scoped and
normalised as the policy says) to every response token of response i. Prompt and padding positions
(action_mask = 0) are left untouched, so the policy loss (PPO clip, clip-higher, or GSPO's sequence ratio)
sees exactly A^_i = A_i + bonus_i.

The step's SetPO metrics ride in `experience.info` as one value per sample: OpenRLHF's actor averages info
over the batch and its trainer sends the result to W&B / TensorBoard as `train/setpo/...`, every step.
"""

import math
import time

import torch
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.utils.logging_utils import init_logger

from setpo_client.client import DEFAULT_URL, SetpoClient
from setpo_client.policy import CONTROLLER_SETTINGS, diversity_policy
from setpo_client.shaping import SetpoShaper
from setpo_trainer.openrlhf.cli import spell

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
        settings = {
            name: getattr(setpo, name) for name in ("weight", "min_reward", "key", "kernel", "normalize", "embed_span")
        }
        if setpo.target_ratio is not None:  # with its knobs; setpo-train checked the flags before Ray started
            settings |= {name: getattr(setpo, name) for name in ("target_ratio", *CONTROLLER_SETTINGS)}
        policy = diversity_policy(settings, spell)  # the key function is loaded by name here, in the trainer actor
        self.setpo = SetpoShaper(
            client, setpo.weight, setpo.on_error, setpo.max_chars, in_flight=setpo.in_flight, **policy
        )
        self.setpo_embed = setpo.embed
        logger.info(
            f"SetPO experience maker active (lambda={setpo.weight}, url={setpo.url}, in_flight={setpo.in_flight}, "
            f"embed={setpo.embed}, on_error={setpo.on_error}, min_reward={setpo.min_reward}, key={setpo.key}, "
            f"kernel={setpo.kernel}, normalize={setpo.normalize}, embed_span={setpo.embed_span}, "
            f"target_ratio={setpo.target_ratio})"
        )

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        experiences = super().compute_advantages_and_returns(experiences)
        start = time.perf_counter()
        n = self.args.rollout.n_samples_per_prompt

        # experience.index holds each row's place in the rollout batch, where a prompt's n samples are
        # consecutive (OpenRLHF's group_norm reshapes them the same way). Dynamic filtering has already
        # dropped whole groups before this point (not the all-correct ones under --setpo.keep_groups on).
        total = sum(len(experience.index) for experience in experiences)
        texts, rewards, advantages = [""] * total, [0.0] * total, [0.0] * total
        scores = [0.0] * total  # what dynamic filtering judged: the reward file's scores (else rewards), no penalty
        for experience in experiences:
            mask = experience.action_mask.float()  # (B, A)
            # a row's advantage as one number (for the weight controller and setpo/bonus_ratio): its mean over
            # the response tokens; constant per row for group_norm unless the KL is in the reward
            row_advantages = (experience.advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
            for row, index in enumerate(experience.index):
                if self.setpo_embed == "response":
                    # action_mask[t] marks sequences[t + 1]: the response tokens (several spans for agents)
                    tokens = experience.sequences[row, 1:][experience.action_mask[row].bool()]
                else:  # prompt_response: the whole trajectory as the policy saw it, without padding
                    tokens = experience.sequences[row][experience.attention_mask[row].bool()]
                texts[index] = self.tokenizer.decode(tokens, skip_special_tokens=True)
                # the reward OpenRLHF's group step used: the reward function's, after its length penalties
                rewards[index] = experience.rewards[row].item()
                scores[index] = (experience.scores if experience.scores is not None else experience.rewards)[row].item()
                advantages[index] = row_advantages[row].item()
        starts = range(0, total, n)  # each group's first row
        step = self.setpo.score(
            [texts[i : i + n] for i in starts],
            rewards=[rewards[i : i + n] for i in starts],
            advantages=[advantages[i : i + n] for i in starts],
            started=start,
        )

        algo, floor = self.args.algo, self.setpo.min_reward
        if floor is not None and algo.dynamic_filtering_enable and math.isinf(algo.dynamic_filtering_range[1]):
            # setpo-train lifted the range's top (--setpo.keep_groups): the groups it kept that way all reach min_reward
            reaching = [all(score >= floor for score in scores[i : i + n]) for i in starts]
            step.metrics["setpo/kept_by_bonus"] = float(sum(reaching))
        bonus = torch.tensor([b for group in step.bonus for b in group])  # (rollout rows,) the service's bonus
        for experience in experiences:
            row_bonus = bonus[experience.index].to(experience.advantages.dtype)  # (B,)
            # (B, A): response tokens get the bonus; prompt and padding positions get 0
            experience.advantages = experience.advantages + row_bonus[:, None] * experience.action_mask

        # SetpoShaper's metrics, its timing included (time_s: decoding and the requests; time_share from step 2 on)
        for experience in experiences:
            rows = len(experience.index)
            for name, value in step.metrics.items():
                experience.info[name] = torch.full((rows,), float(value))  # (B,): the batch mean is the value
        return experiences
