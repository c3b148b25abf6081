"""SetPO for TRL's GRPOTrainer: Â_i = A_i + lambda * s_i on every completion, nothing else changed.

    from setpo_client import SetpoClient
    from setpo_client.integrations.trl import SetpoGRPOTrainer
    trainer = SetpoGRPOTrainer(setpo_client=SetpoClient(url), setpo_weight=0.05, setpo_on_error="skip",
                               model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

The service's key comes from $SETPO_API_KEY (SetpoClient's default): never put it in GRPOConfig, which TRL
prints and sends to its trackers.

The hook is TRL's own seam: `_generate_and_score_completions` computes the group advantages over the
completions of ALL processes and returns this process's slice. We let it run unchanged, then decode this
process's completions — only the tokens the loss trains on (completion_mask * tool_mask: tool and environment
output are left out, as TRL's loss leaves them out) — gather every process's texts in the same order TRL
gathered the rewards, score all groups through SetpoShaper (rank 0; the result is broadcast, so every process
applies the same policy), and add this process's slice of lambda * s_i. The loss — grpo, dr_grpo, dapo, or
GSPO with importance_sampling_level="sequence" — then sees the shaped advantages, and so does the completions
table TRL logs. Metrics go to TRL's own logs under `setpo/...` (SetpoShaper's names, its timing included).

At start the trainer checks that TRL still has the method it overrides (a TRL that renamed it would train
without SetPO) and warns when TRL is not the tested version.
"""

import logging
import time
from typing import Any

import torch
import trl
from accelerate.utils import broadcast_object_list, gather_object
from trl import GRPOTrainer

from setpo_client.client import SetpoClient
from setpo_client.errors import SetpoError
from setpo_client.shaping import OnError, SetpoShaper

log = logging.getLogger("setpo_client.trl")
TESTED_VERSIONS = ("1.16.",)  # TRL versions whose _generate_and_score_completions this was tested against


class SetpoGRPOTrainer(GRPOTrainer):
    def __init__(
        self,
        *args,
        setpo_client: SetpoClient,
        setpo_weight: float = 0.05,
        setpo_on_error: OnError = "skip",
        setpo_max_chars: int | None = None,
        **kwargs,
    ):
        # the hook must still be TRL's own seam, or this subclass would add a method nobody calls
        if "_generate_and_score_completions" not in vars(GRPOTrainer):
            raise RuntimeError(
                f"TRL {trl.__version__} has no GRPOTrainer._generate_and_score_completions: SetpoGRPOTrainer "
                f"would train without SetPO. Use TRL {' / '.join(v + 'x' for v in TESTED_VERSIONS)}."
            )
        if not trl.__version__.startswith(TESTED_VERSIONS):
            log.warning(
                "SetpoGRPOTrainer was tested with TRL %s; this is %s",
                " / ".join(v + "x" for v in TESTED_VERSIONS),
                trl.__version__,
            )
        super().__init__(*args, **kwargs)
        if setpo_weight > 0 and self.num_generations < 3:  # fail now, not after the first generation round
            raise ValueError(
                f"SetPO needs num_generations >= 3 (leave-one-out needs pairs left), got {self.num_generations}"
            )
        self.setpo = SetpoShaper(setpo_client, setpo_weight, setpo_on_error, setpo_max_chars)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: advantages are not trained on
            return output
        started = time.perf_counter()
        # the tokens the loss trains on: tool and environment output (tool_mask 0) and padding are left out
        mask = (
            output["completion_mask"] if "tool_mask" not in output else output["completion_mask"] * output["tool_mask"]
        )  # (B, T)
        local = [
            self.processing_class.decode(ids[row.bool()], skip_special_tokens=True) if row.any() else None
            for ids, row in zip(output["completion_ids"], mask)
        ]
        texts = gather_object(local)  # every process's completions, in TRL's gather order: groups are consecutive
        size = self.num_generations
        payload: list[Any] = [None]
        error = None
        if self.accelerator.is_main_process:
            try:
                step = self.setpo.score([texts[i : i + size] for i in range(0, len(texts), size)], started=started)
                payload = [([b for group in step.bonus for b in group], step.metrics)]
            except Exception as exc:
                error, payload = exc, [f"{type(exc).__name__}: {exc}"]
        result = broadcast_object_list(payload, from_process=0)[0]
        if error is not None:
            raise error
        if isinstance(result, str):
            raise SetpoError(f"SetPO scoring failed on the main process: {result}")
        bonus, metrics = result
        offset = self.accelerator.process_index * len(local)
        shaping = torch.tensor(
            bonus[offset : offset + len(local)], dtype=output["advantages"].dtype, device=output["advantages"].device
        )
        output["advantages"] = output["advantages"] + shaping  # (local B,)

        # TRL's completions table logged every process's advantages before shaping, last: show the shaped ones
        logged = self._logs["advantages"]
        before = [logged.pop() for _ in range(min(len(bonus), len(logged)))][::-1]
        logged.extend(a + b for a, b in zip(before, bonus[len(bonus) - len(before) :]))
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
        return output
