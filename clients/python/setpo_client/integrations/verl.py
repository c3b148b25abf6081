"""SetPO for veRL 0.9: Â_i = A_i + lambda * s_i on every response token, after veRL's own advantage step.

Installed as a veRL entry-point plugin (group "verl.plugins", so `import verl` loads it in every process once
`setpo-client[verl]` is installed) and switched on per run from the Hydra config, the way veRL users
configure everything else:

    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ... \\
        +algorithm.setpo.enable=true +algorithm.setpo.url=http://setpo:8000 +algorithm.setpo.weight=0.05 \\
        [+algorithm.setpo.on_error=skip] [+algorithm.setpo.timeout=60] [+algorithm.setpo.max_chars=8000] \\
        [+algorithm.setpo.api_key=...  (default: $SETPO_API_KEY)]

GSPO (actor.policy_loss.loss_mode=gspo) and DAPO (clip-higher, algorithm.filter_groups) keep veRL's GRPO
advantage step, so SetPO applies to them unchanged; groups are the responses that share veRL's `uid`.

veRL 0.9.1 has two trainers and the plug-in wraps each at its advantage step:
- v1 (default, trainer.use_v1=true): `PPOTrainer._compute_advantage` (v1/trainer_base.py) runs unchanged; then the responses
  and advantages of the step are read from veRL's TransferQueue, shaped, and written back. The step's
  setpo/* metrics go into veRL's own metrics dict.
- v0 (trainer.use_v1=false): `compute_advantage` (the function the legacy trainer calls) runs unchanged,
  then the batch is shaped; metrics are merged into veRL's data metrics of the step.
Both share `shape_batch`, which works on a plain DataProto: that is the piece tested on CPU.
"""

import logging
import time
from collections.abc import Sequence

import numpy as np
import torch

from setpo_client.client import SetpoClient
from setpo_client.shaping import SetpoShaper

log = logging.getLogger("setpo_client.verl")
_shapers: dict[tuple, SetpoShaper] = {}
_last_call: dict[str, float] = {}


def setpo_settings(algorithm_config) -> dict | None:
    """The `algorithm.setpo` block when SetPO is enabled, else None."""
    block = algorithm_config.get("setpo") if algorithm_config is not None else None
    if not block or not block.get("enable", False):
        return None
    if not block.get("url"):
        raise ValueError("algorithm.setpo.enable=true needs +algorithm.setpo.url=<setpo service URL>")
    return dict(block)


def shaper_for(settings: dict) -> SetpoShaper:
    """One shaper per configuration and process, so fallback steps are counted across the run."""
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))
    if key not in _shapers:
        client = SetpoClient(settings["url"], api_key=settings.get("api_key"), timeout=float(settings.get("timeout", 60.0)))
        _shapers[key] = SetpoShaper(client, float(settings.get("weight", 0.05)), settings.get("on_error", "skip"), settings.get("max_chars"))
    return _shapers[key]


def group_by_uid(uids: Sequence) -> list[list[int]]:
    """Row indices of each group, groups in order of first appearance."""
    groups: dict = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    return list(groups.values())


def shape_rows(texts: list[str], uids: Sequence, shaper: SetpoShaper) -> tuple[torch.Tensor, dict[str, float]]:
    """lambda * s_i for every row (B,), rows grouped by uid, and the step's setpo/* metrics."""
    groups = group_by_uid(uids)
    step = shaper.score([[texts[row] for row in rows] for rows in groups])
    bonus = torch.zeros(len(texts))  # (B,)
    for rows, values in zip(groups, step.bonus):
        bonus[rows] = torch.tensor(values)
    return bonus, step.metrics


def shape_batch(data, tokenizer, shaper: SetpoShaper):
    """Add lambda * s_i to every response token of a DataProto whose advantages veRL has just computed.
    Needs batch["responses"], batch["response_mask"], batch["advantages"] and non_tensor_batch["uid"]."""
    mask = data.batch["response_mask"]  # (B, T)
    texts = [tokenizer.decode(ids[row_mask.bool()], skip_special_tokens=True) for ids, row_mask in zip(data.batch["responses"], mask)]
    bonus, metrics = shape_rows(texts, data.non_tensor_batch["uid"].tolist(), shaper)
    data.batch["advantages"] = data.batch["advantages"] + bonus.to(mask.device, data.batch["advantages"].dtype)[:, None] * mask
    return data, metrics


def _with_time_share(metrics: dict[str, float], started: float, where: str) -> dict[str, float]:
    now = time.perf_counter()
    previous = _last_call.get(where)
    _last_call[where] = started
    metrics["setpo/time_s"] = now - started
    metrics["setpo/time_share"] = metrics["setpo/time_s"] / (now - previous) if previous else 0.0
    return metrics


def install() -> None:
    """Wrap veRL's advantage steps (idempotent). Called when `import verl` loads this plug-in."""
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import trainer_base

    if getattr(ray_trainer.compute_advantage, "setpo_wrapped", False):
        return
    original_function = ray_trainer.compute_advantage
    original_metrics = ray_trainer.compute_data_metrics
    original_method = trainer_base.PPOTrainer._compute_advantage

    def compute_advantage(data, *args, config=None, **kwargs):
        data = original_function(data, *args, config=config, **kwargs)
        settings = setpo_settings(config)
        if settings is None:
            return data
        started = time.perf_counter()
        data, metrics = shape_batch(data, _tokenizer(settings), shaper_for(settings))
        data.meta_info["setpo_metrics"] = _with_time_share(metrics, started, "v0")
        return data

    def compute_data_metrics(batch, *args, **kwargs):
        return {**original_metrics(batch, *args, **kwargs), **batch.meta_info.get("setpo_metrics", {})}

    def _compute_advantage(self, batch, metrics: dict):
        batch = original_method(self, batch, metrics)
        settings = setpo_settings(self.config.algorithm)
        if settings is None:
            return batch
        started = time.perf_counter()
        metrics.update(_with_time_share(shape_transfer_queue(batch, self.tokenizer, shaper_for(settings)), started, "v1"))
        return batch

    compute_advantage.setpo_wrapped = True
    ray_trainer.compute_advantage = compute_advantage
    ray_trainer.compute_data_metrics = compute_data_metrics
    trainer_base.PPOTrainer._compute_advantage = _compute_advantage


def shape_transfer_queue(batch, tokenizer, shaper: SetpoShaper) -> dict[str, float]:
    """v1: read the step's responses and fresh advantages from TransferQueue, shape, write back."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    fields = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "responses", "response_mask", "advantages"])
    nested_mask = fields["response_mask"]
    # only the policy's own tokens: in multi-turn rows response_mask leaves out tool and environment output
    rows = zip(fields["responses"].unbind(), nested_mask.unbind())
    texts = [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True) for ids, mask in rows]
    uids = np.array(fields["uid"].tolist() if hasattr(fields["uid"], "tolist") else list(fields["uid"]), dtype=object).tolist()
    bonus, metrics = shape_rows(texts, uids, shaper)
    advantages = fields["advantages"].to_padded_tensor(0.0)  # (B, T)
    padded_mask = nested_mask.to_padded_tensor(0)  # (B, T)
    shaped = advantages + bonus.to(advantages.dtype)[:, None] * padded_mask
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                    fields=TensorDict({"advantages": response_to_nested(shaped, nested_mask)}, batch_size=len(batch)))
    return metrics


_tokenizers: dict[str, object] = {}


def _tokenizer(settings: dict):
    """v0's compute_advantage gets no tokenizer: name it with +algorithm.setpo.tokenizer=<model path>."""
    path = settings.get("tokenizer")
    if not path:
        raise ValueError("with trainer.use_v1=false, SetPO needs +algorithm.setpo.tokenizer='${actor_rollout_ref.model.path}'")
    if path not in _tokenizers:
        from transformers import AutoTokenizer

        _tokenizers[path] = AutoTokenizer.from_pretrained(path)
    return _tokenizers[path]


try:  # loaded by veRL's plug-in discovery, which hides import errors at debug level: say it ourselves
    install()
except Exception:  # noqa: BLE001
    log.warning("setpo veRL plug-in could not install itself; SetPO is off for this run", exc_info=True)
