"""SetPO for TRL's GRPOTrainer: Â_i = A_i + lambda * s_i on every completion, nothing else changed.

    from setpo_client import SetpoClient
    from setpo_client.integrations.trl import SetpoGRPOTrainer
    trainer = SetpoGRPOTrainer(setpo_client=SetpoClient(url), setpo_weight=0.05, setpo_on_error="skip",
                               model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

The hook is TRL's own seam: `_generate_and_score_completions` computes the group advantages over the
completions of ALL processes and returns this process's slice. We let it run unchanged, then decode this
process's completions, gather every process's texts in the same order TRL gathered the rewards, score all
groups with one request (rank 0; the result is broadcast, so every process applies the same policy), and
add this process's slice of lambda * s_i. The loss — grpo, dr_grpo, dapo, or GSPO with
importance_sampling_level="sequence" — then sees the shaped advantages. Metrics go to TRL's own logs under
`setpo/...`, plus `setpo/time_share`: SetPO's time over the time since the previous generation round.
"""

import time

import torch
from accelerate.utils import broadcast_object_list, gather_object
from trl import GRPOTrainer

from setpo_client.client import SetpoClient
from setpo_client.errors import SetpoError
from setpo_client.shaping import OnError, SetpoShaper


class SetpoGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, setpo_client: SetpoClient, setpo_weight: float = 0.05, setpo_on_error: OnError = "skip",
                 setpo_max_chars: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if setpo_weight > 0 and self.num_generations < 3:  # fail now, not after the first generation round
            raise ValueError(f"SetPO needs num_generations >= 3 (leave-one-out needs pairs left), got {self.num_generations}")
        self.setpo = SetpoShaper(setpo_client, setpo_weight, setpo_on_error, setpo_max_chars)
        self._setpo_round_start: float | None = None

    def _generate_and_score_completions(self, inputs):
        round_start = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: advantages are not trained on
            return output
        started = time.perf_counter()
        local = self.processing_class.batch_decode(output["completion_ids"], skip_special_tokens=True)
        texts = gather_object(local)  # every process's completions, in TRL's gather order: groups are consecutive
        size = self.num_generations
        payload, error = [None], None
        if self.accelerator.is_main_process:
            try:
                step = self.setpo.score([texts[i : i + size] for i in range(0, len(texts), size)])
                payload = [([b for group in step.bonus for b in group], step.metrics)]
            except Exception as exc:  # noqa: BLE001  every process must stop, or the others wait in the broadcast
                error, payload = exc, [f"{type(exc).__name__}: {exc}"]
        result = broadcast_object_list(payload, from_process=0)[0]
        if error is not None:
            raise error
        if isinstance(result, str):
            raise SetpoError(f"SetPO scoring failed on the main process: {result}")
        bonus, metrics = result
        offset = self.accelerator.process_index * len(local)
        shaping = torch.tensor(bonus[offset : offset + len(local)], dtype=output["advantages"].dtype, device=output["advantages"].device)
        output["advantages"] = output["advantages"] + shaping  # (local B,)

        now = time.perf_counter()
        period = now - (self._setpo_round_start or round_start)  # a whole round: train steps + generation
        self._setpo_round_start = round_start
        metrics["setpo/time_s"] = now - started  # decode, gather, the request and the broadcast
        metrics["setpo/time_share"] = metrics["setpo/time_s"] / period
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
        return output
