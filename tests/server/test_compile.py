"""SETPO_COMPILE: the warm-up compiles every graph a request can need, so no request after /ready waits for the
compiler, and the compiled service serves the eager model's embeddings. The real app in this process, so that the
compiler's own counters can be read: one compile (~40-50 s), the test's whole cost (docs/development.md)."""

import torch
from torch._dynamo.utils import counters

from tests.inprocess import InProcessService

TEXTS = [
    "The answer is 60.",
    "Let x be the number of eggs; then x / 5 = 12 and x = 60.",
    "word " * 300,
    "a",
    "12 + 12 = 24 " * 10,
]


def test_the_warm_up_compiles_every_graph_and_the_compiled_service_serves_the_eager_embeddings(st_model):
    with InProcessService(compile=True) as service, service.client() as client:
        graphs = counters["stats"]["unique_graphs"]
        # the model runs through torch.compile, and the warm-up, before /ready, went through the compiler
        assert isinstance(service.state.batcher.backend.model[0].model, torch._dynamo.eval_frame.OptimizedModule)
        assert graphs > 0 and client.info().compiled
        # batch size 1 and more, padded and not, short and at the 256-token limit: the shapes batches bring. The
        # service embeds a request's distinct texts once, so each copy of a text is made distinct by a number.
        for batch in ([0], [3], [0, 1], [1, 1, 1], [4] * 7, [0, 1, 2, 3, 4] * 3, [2, 2]):
            texts = [f"{TEXTS[i]} {copy}" for copy, i in enumerate(batch)]
            served = torch.tensor([item.embedding for item in client.embeddings(texts).data])
            local = st_model.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
            assert torch.allclose(served, local, atol=1e-5), batch
        assert counters["stats"]["unique_graphs"] == graphs  # nothing was compiled after the warm-up
