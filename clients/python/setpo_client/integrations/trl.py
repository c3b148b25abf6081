"""SetPO for TRL's GRPOTrainer: each completion's advantage is TRL's (or the base `setpo_advantage` names) combined
with the service's bonus, lambda * s_i; nothing else changed. How to use it and what it hooks: docs/trl-and-verl.md,
"TRL".

    trainer = SetpoGRPOTrainer(setpo_client=SetpoClient(url), setpo_weight=0.05, setpo_on_error="skip",
                               model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

The setpo_* settings are SetpoShaper's (setpo_client.policy checks them), plus replay (setpo_replay_*, replay.py).
The service's key comes from $SETPO_API_KEY (SetpoClient's default): never put it in GRPOConfig, which TRL prints and
sends to its trackers.
"""

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import trl
from accelerate.utils import broadcast_object_list, gather_object
from packaging.specifiers import SpecifierSet
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

from setpo_client.client import SetpoClient
from setpo_client.errors import SetpoError
from setpo_client.integrations.replay import ReplayBank, prompt_keys, replay_loss
from setpo_client.keys import KeyFunction
from setpo_client.policy import diversity_policy
from setpo_client.shaping import OnError, SetpoShaper
from setpo_client.types import Advantage, Combine, Kernel, Normalize
from setpo_client.weight import WeightController

log = logging.getLogger("setpo_client.trl")
# TRL versions whose seams this was tested against: the `trl` extra's range (tests/integrations/trl checks they agree)
TESTED_RANGE = ">=1.16,<1.17"


def spell(name: str) -> str:
    """A SetPO setting as SetpoGRPOTrainer's caller writes it, for refusals (setpo_client.policy, SetpoShaper.start)."""
    return "num_generations" if name == "group_size" else f"setpo_{name}"


class SetpoGRPOTrainer(GRPOTrainer):
    def __init__(
        self,
        *args,
        setpo_client: SetpoClient,
        setpo_weight: float = 0.05,
        setpo_on_error: OnError = "skip",
        setpo_max_chars: int | None = None,
        setpo_min_reward: float | None = None,
        setpo_key: KeyFunction | str | None = None,
        setpo_kernel: Kernel = "embedding",
        setpo_normalize: Normalize = "none",
        setpo_controller: WeightController | None = None,
        setpo_embed_span: str | None = None,
        setpo_in_flight: int | None = None,
        setpo_ready_timeout: float = 120.0,
        setpo_advantage: Advantage = "framework",
        setpo_positive_weight: float = 0.1,
        setpo_combine: Combine = "add",
        setpo_replay_weight: float = 0.0,
        setpo_replay_capacity: int = 16,
        setpo_replay_threshold: float | None = None,
        **kwargs,
    ):
        # the hooks must still be TRL's own seams, or this subclass would add methods nobody calls
        for seam in ("_generate", "_generate_and_score_completions", "_calculate_rewards"):
            if seam not in vars(GRPOTrainer):
                raise RuntimeError(
                    f"TRL {trl.__version__} has no GRPOTrainer.{seam}: SetpoGRPOTrainer would train without SetPO. "
                    f"Use TRL {TESTED_RANGE} (setpo-client[trl])."
                )
        settings = {
            "min_reward": setpo_min_reward,
            "key": setpo_key,
            "kernel": setpo_kernel,
            "normalize": setpo_normalize,
            "embed_span": setpo_embed_span,
            "advantage": setpo_advantage,
            "positive_weight": setpo_positive_weight,
            "combine": setpo_combine,
        }
        policy = {**diversity_policy(settings, spell), "controller": setpo_controller}
        if not SpecifierSet(TESTED_RANGE).contains(trl.__version__, prereleases=True):
            log.warning(
                "SetpoGRPOTrainer is tested with TRL %s (setpo-client[trl]); this is %s", TESTED_RANGE, trl.__version__
            )
        super().__init__(*args, **kwargs)
        self.setpo = SetpoShaper(
            setpo_client, setpo_weight, setpo_on_error, setpo_max_chars, in_flight=setpo_in_flight, **policy
        )
        if setpo_weight > 0:  # fail now, not after the first generation round; TRL's advantages are group-relative
            self.setpo.start(group_size=self.num_generations, spell=spell, ready_timeout=setpo_ready_timeout)
        if setpo_replay_weight < 0 or (setpo_replay_weight > 0 and setpo_min_reward is None):
            raise ValueError(
                "setpo_replay_weight banks verified answers: it must be >= 0, and > 0 needs setpo_min_reward (the "
                f"reward a verified answer reaches); got {setpo_replay_weight} with setpo_min_reward={setpo_min_reward}"
            )
        self.setpo_replay_weight = setpo_replay_weight
        self.setpo_replay = ReplayBank(setpo_replay_capacity, setpo_replay_threshold) if setpo_replay_weight else None
        if self.setpo_replay is not None:
            self.add_callback(SaveReplayBank(self.setpo_replay))
        self.setpo_rewards: torch.Tensor | None = None  # the step's rewards, all processes (_calculate_rewards)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (B, F)
        # the reward min_reward compares with: TRL's own weighted sum over its reward functions
        self.setpo_rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)  # (B,)
        # NaN, as TRL marks it, where every reward function returned None: TRL zeroes that completion's advantage
        self.setpo_rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards_per_func

    @staticmethod
    def trained_mask(output: dict) -> torch.Tensor:
        """The tokens the loss trains on: tool and environment output (tool_mask 0) and padding left out. (B, C)"""
        return output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]

    def completion_text(self, ids, trained) -> str | None:
        """A completion as SetPO embeds it: only the tokens the loss trains on (trained: TRL's mask, 0 for tool
        and environment output and padding); None when the loss trains on none of it."""
        return self.processing_class.decode(ids[trained.bool()], skip_special_tokens=True) if trained.any() else None

    def _generate(self, prompts):
        generated = super()._generate(prompts)
        # The forms that need no reward start scoring now, hidden by what TRL does before its advantages: the old and
        # reference log-prob passes and the reward functions. With min_reward, TRL computes the rewards after those
        # passes, so nothing is left to hide: _generate_and_score_completions scores then.
        if self.model.training and self.setpo.min_reward is None:
            started = time.perf_counter()
            _, completion_ids, tool_masks = generated[:3]
            # TRL masks a truncated completion out of the loss after _generate (mask_truncated_completions): so here
            stops = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            masks = tool_masks if tool_masks is not None else [[1] * len(ids) for ids in completion_ids]
            local = [
                self.completion_text(
                    torch.tensor(ids),
                    torch.tensor(mask) * (not self.mask_truncated_completions or ids[-1] in stops),
                )
                for ids, mask in zip(completion_ids, masks)
            ]
            texts = gather_object(local)  # every process's, in TRL's gather order: groups are consecutive
            if self.accelerator.is_main_process:
                self.setpo.submit(self.setpo_groups(texts), started=started)
        return generated

    def setpo_groups(self, rows: list) -> list[list]:
        return [rows[i : i + self.num_generations] for i in range(0, len(rows), self.num_generations)]

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: advantages are not trained on
            return output
        started = time.perf_counter()
        mask = self.trained_mask(output)
        texts = gather_object([self.completion_text(ids, row) for ids, row in zip(output["completion_ids"], mask)])
        advantages = gather_object(output["advantages"].tolist())  # TRL's, every process's, in the same order
        local = len(output["advantages"])
        payload: list[Any] = [None]
        error = None
        if self.accelerator.is_main_process:
            try:
                assert self.setpo_rewards is not None  # set by _calculate_rewards, called by the super() above
                rewards = self.setpo_rewards.tolist()  # NaN: unscorable, TRL gives it no learning signal; nor do we
                # with min_reward an unscorable completion goes as None, in no other's marginal; submitted at
                # generation, before the rewards said which it is, it is in the others' (only a second request
                # could take it out)
                members = (
                    texts
                    if self.setpo.min_reward is None
                    else [None if math.isnan(r) else t for t, r in zip(texts, rewards)]
                )
                step = self.setpo.shape(
                    self.setpo_groups(members),
                    rewards=self.setpo_groups(rewards),
                    advantages=self.setpo_groups(advantages),
                    started=started,
                )
                assert step.advantages is not None  # TRL's advantages were passed
                shaped = [a for group in step.advantages for a in group]
                payload = [([a if math.isnan(r) else s for r, a, s in zip(rewards, advantages, shaped)], step.metrics)]
            except Exception as exc:
                error, payload = exc, [f"{type(exc).__name__}: {exc}"]
        result = broadcast_object_list(payload, from_process=0)[0]
        if error is not None:
            raise error
        if isinstance(result, str):
            raise SetpoError(f"SetPO scoring failed on the main process: {result}")
        shaped, metrics = result
        offset = self.accelerator.process_index * local
        output["advantages"] = torch.tensor(
            shaped[offset : offset + local], dtype=output["advantages"].dtype, device=output["advantages"].device
        )  # (local B,)

        # TRL's completions table logged every process's advantages before shaping, last: show the shaped ones
        logged = self._logs["advantages"]  # a deque
        replaced = min(len(shaped), len(logged))
        for _ in range(replaced):
            logged.pop()
        logged.extend(shaped[len(shaped) - replaced :])
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
        if self.setpo_replay is not None:
            self.setpo_admit(output, mask, texts)
        return output

    def setpo_admit(self, output: dict, mask: torch.Tensor, texts: list[str | None]) -> None:
        """Replay: this step's completions whose reward reaches setpo_min_reward go to their prompt's bank when they
        differ from it, on the main process (one embeddings request); every process then holds the same bank.
        mask: this process's trained tokens (B, C); texts: every process's completions as shaped, gathered."""
        assert self.setpo_replay is not None and self.setpo_rewards is not None
        keys = prompt_keys(output["prompt_ids"], output["prompt_mask"])
        # every process's (prompt, trained ids), in TRL's gather order, as the texts and the rewards
        answers = gather_object(
            [(key, ids[row.bool()].tolist()) for key, ids, row in zip(keys, output["completion_ids"], mask)]
        )
        floor = self.setpo.min_reward
        assert floor is not None  # required with replay (__init__)
        verified = [
            (key, ids, text)
            for (key, ids), text, reward in zip(answers, texts, self.setpo_rewards.tolist())
            if reward >= floor and text is not None
        ]
        payload: list[Any] = [None]
        if self.accelerator.is_main_process:
            failed = 0.0
            try:
                admitted = self.setpo_replay.admit(
                    verified, lambda texts: [item.floats() for item in self.setpo.client.embeddings(texts).data]
                )
            except SetpoError as exc:  # the service's trouble costs the step its embeddings, not the run
                log.warning("SetPO replay: embeddings failed (%s); this step's answers are compared by text", exc)
                admitted, failed = self.setpo_replay.admit(verified, None), 1.0
            state = self.setpo_replay.state_dict() if self.accelerator.num_processes > 1 else None
            payload = [(state, {"setpo/replay_admitted": float(admitted), "setpo/replay_embed_failures": failed})]
        state, metrics = broadcast_object_list(payload, from_process=0)[0]
        if state is not None:
            self.setpo_replay.load_state_dict(state)
        metrics["setpo/replay_bank_size"] = float(self.setpo_replay.size())
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.setpo_replay is None or not self.model.training:
            return loss
        pad = self.processing_class.pad_token_id or 0
        distributed = self.accelerator.num_processes > 1
        ids, mask = inputs["prompt_ids"], inputs["prompt_mask"]
        replayed, prompts = replay_loss(model, ids, mask, self.setpo_replay, pad, distributed)
        self._metrics["train"]["setpo/replay_loss"].append(replayed.item())
        self._metrics["train"]["setpo/replay_prompts"].append(float(prompts))
        return loss + self.setpo_replay_weight * replayed

    def train(self, resume_from_checkpoint=None, **kwargs):
        """TRL's train(); resuming, the replay bank comes back from the checkpoint as well."""
        if self.setpo_replay is not None and resume_from_checkpoint:
            folder = (
                get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
            )
            saved = Path(folder or self.args.output_dir) / SaveReplayBank.FILE
            if saved.exists():
                self.setpo_replay.load_state_dict(json.loads(saved.read_text()))
            else:
                log.warning("SetPO replay: %s has no %s; the bank starts empty", folder, SaveReplayBank.FILE)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)


class SaveReplayBank(TrainerCallback):
    """Writes the replay bank into every checkpoint TRL saves, beside the model and the optimizer."""

    FILE = "setpo_replay.json"

    def __init__(self, bank: ReplayBank):
        self.bank = bank

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (folder / self.FILE).write_text(json.dumps(self.bank.state_dict()))
