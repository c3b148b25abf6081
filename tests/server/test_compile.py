"""SETPO_COMPILE: the compiled model gives the eager model's embeddings, and the warm-up compiles every graph
a request can need, so no request after /ready waits for the compiler. Each test compiles (~40-50 s)."""

import torch
from torch._dynamo.utils import counters

from setpo_client import SetpoClient
from setpo_server.backend import Backend
from setpo_server.local import LocalServer
from setpo_server.settings import Settings

TEXTS = [
    "The answer is 60.",
    "Let x be the number of eggs; then x / 5 = 12 and x = 60.",
    "word " * 300,
    "a",
    "12 + 12 = 24 " * 10,
]


def test_warm_up_compiles_every_graph_and_the_compiled_model_agrees_with_eager():
    compiled, eager = Backend(Settings(compile=True)), Backend(Settings())
    compiled.warm_up()
    graphs = counters["stats"]["unique_graphs"]
    # the model runs through torch.compile, and the warm-up went through the compiler
    assert isinstance(compiled.model[0].model, torch._dynamo.eval_frame.OptimizedModule) and graphs > 0
    # batch size 1 and more, padded and not, short and at the 256-token limit: the shapes batches bring
    for batch in ([0], [3], [0, 1], [1, 1, 1], [4] * 7, [0, 1, 2, 3, 4] * 3, [2, 2]):
        ids, _ = compiled.tokenize([TEXTS[i] for i in batch])
        assert torch.allclose(compiled.encode(ids), eager.encode(ids), atol=1e-5), batch
    assert counters["stats"]["unique_graphs"] == graphs  # nothing was compiled after the warm-up


def test_compiled_server_serves_the_same_embeddings(st_model):
    with LocalServer(compile=True, dtype="float32") as server, SetpoClient(server.url) as client:
        assert client.info().compiled
        served = torch.tensor([item.embedding for item in client.embeddings(TEXTS).data])
    local = st_model.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True)
    assert torch.allclose(served, local, atol=1e-5)
