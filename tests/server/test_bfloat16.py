"""SETPO_DTYPE=bfloat16 on CPU: the precision to serve in on a CPU with AMX (docs/benchmarks.md, "bfloat16 on a CPU").
It must rank a group's responses as float32 does, and its automatic batch budget must follow the precision."""

import torch

from setpo_core.diversity import cosine_kernel, set_diversity
from setpo_server.batcher import resolve_batch_tokens
from tests.inprocess import InProcessService

GROUPS = [
    [
        "Natalia sold 48 clips in April and half as many in May, so 48 + 24 = 72.",
        "April: 48 clips. May: 48 / 2 = 24 clips. Total 72.",
        "She sold 48 + 48/2 = 72 clips altogether.",
        "The answer is 72.",
        "Let me think about the weather instead: it is sunny today.",
        "72",
    ],
    [
        "To reach 24 from 3, 5, 8, 2: (8 - 5) * (3 + 2) = 15, no; 8 * 3 * (2 - 5 + 4)...",
        "(5 - 2) * 8 = 24, and 3 is left unused, which breaks the rules.",
        "3 * 8 = 24, then 24 * (5 - 2 - 2) = 24.",
        "I cannot find a solution.",
        "Answer: <answer>(5 - 3) * 8 + 2 * 4</answer>",
        "8 * (5 - 2) = 24 uses 8, 5 and 2; multiply by 3 / 3 to use the 3.",
    ],
]


def test_auto_batch_budget_follows_device_and_precision():
    assert resolve_batch_tokens("auto", "cpu", torch.float32) == 2048
    assert resolve_batch_tokens("auto", "cpu", torch.bfloat16) == 4096
    assert resolve_batch_tokens("auto", "cuda:0", torch.float16) == 16384
    assert resolve_batch_tokens(1000, "cpu", torch.bfloat16) == 1000


def test_bfloat16_server_gives_float32_marginals_within_tolerance(st_model):
    with InProcessService(dtype="bfloat16") as service, service.client() as client:
        info = client.info()
        assert info.dtype == "bfloat16" and info.limits.max_batch_tokens == 4096
        served = torch.tensor([group.marginals for group in client.diversity([{"texts": g} for g in GROUPS]).groups])
    embeddings = torch.stack([st_model.encode(g, convert_to_tensor=True).double() for g in GROUPS])  # float32 reference
    reference = set_diversity(cosine_kernel(embeddings)).marginals
    # measured on 128 Countdown and 64 GSM8K groups: max |diff| 4.5e-4 (2.8e-4 here), median rank correlation 1
    assert (served - reference).abs().max() < 2e-3
    assert torch.equal(served.argmax(dim=1), reference.argmax(dim=1))  # the off-topic answer adds most, in both
