"""The base model: its own word-level tokenizer and a small Llama, pretrained from scratch by next-token
prediction on the synthetic corpus (corpus.py). Seeded and deterministic on CPU; nothing is downloaded.

The tokenizer splits on whitespace (the corpus writes every symbol as its own word), so decoding a completion
gives back exactly the text the model wrote, and the scorer and the embedder see what the model said.
"""

import itertools
import json
import math
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from tqdm import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from experiments.countdown_lm.puzzles import MAX_VALUE

SPECIAL = ["<pad>", "<unk>", "<eos>"]
MAX_NUMBER = MAX_VALUE  # every integer a step may write is its own token


def build_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    words = sorted({word for text in texts for word in text.split()} - {str(n) for n in range(MAX_NUMBER + 1)})
    vocab = {token: i for i, token in enumerate(SPECIAL + [str(n) for n in range(MAX_NUMBER + 1)] + words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # no chat template and no BOS: prompts are plain text, tokenized the same in pretraining, TRL and setpo-eval
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        model_input_names=["input_ids", "attention_mask"],
    )  # a Llama takes no token types
    tokenizer.padding_side = "left"  # generation pads prompts on the left
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, size: dict, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        **size,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def batches(pairs: list[tuple[str, str]], tokenizer, batch_size: int, rng: random.Random):
    """Right-padded batches of prompt + response + <eos>; the loss is on the response and <eos> only
    (the prompt's numbers are random: nothing there to learn to predict)."""
    order = list(range(len(pairs)))
    rng.shuffle(order)
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = []
        for i in order[start : start + batch_size]:
            prompt, response = pairs[i]
            p = tokenizer(prompt)["input_ids"]
            r = tokenizer(response)["input_ids"] + [tokenizer.eos_token_id]
            rows.append((p + r, [-100] * len(p) + r))
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in rows])
        labels = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])
        yield ids, labels, (ids != tokenizer.pad_token_id).long()


def pretrain(
    pairs: list[tuple[str, str]], out: Path, size: dict, epochs: float, batch_size: int, lr: float, seed: int
) -> dict:
    """Trains the base model on (prompt, response) pairs and saves it with its tokenizer to `out`. `epochs` may
    be a fraction (the quick form trains a few steps on a corpus over every training puzzle)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer([text for pair in pairs for text in pair])
    model = build_model(tokenizer, size, seed)
    steps = max(1, int(epochs * (len(pairs) // batch_size)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warmup, cosine decay
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    rng = random.Random(seed)
    losses = []
    model.train()
    with tqdm(total=steps, desc="pretraining", unit="step") as bar:
        while len(losses) < steps:
            for ids, labels, mask in itertools.islice(batches(pairs, tokenizer, batch_size, rng), steps - len(losses)):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                losses.append(loss.item())
                bar.update()
                bar.set_postfix(loss=f"{loss.item():.3f}")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "vocab": len(tokenizer),
        "pairs": len(pairs),
    }
    (out / "pretrain.json").write_text(json.dumps(info, indent=1))
    return info
