"""POST /v1/embeddings: OpenAI-compatible, and equal to in-process SentenceTransformer.encode."""

import base64

import torch

TEXTS = [
    "The answer is 60.",
    "Let x be the number of eggs; then x / 5 = 12 and x = 60.",
    "12 + 12 + 12 + 12 + 12 = 60",
    "The answer is 60.",
    "word " * 300,  # truncated to 256 tokens
]


def test_batched_service_embeddings_equal_in_process_encode(inprocess, st_model):
    served = torch.tensor([item.embedding for item in inprocess.embeddings(TEXTS).data])
    local = st_model.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True)
    assert torch.allclose(served, local, atol=1e-5)


def test_openai_response_shape_and_usage(http):
    body = http.post("/v1/embeddings", json={"input": TEXTS, "model": "all-MiniLM-L6-v2"}).json()
    assert body["object"] == "list" and body["model"] == "all-MiniLM-L6-v2"
    assert [item["index"] for item in body["data"]] == list(range(len(TEXTS)))
    assert all(item["object"] == "embedding" and len(item["embedding"]) == 384 for item in body["data"])
    assert body["usage"]["truncated"] == 1
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 256


def test_single_string_input(inprocess):
    result = inprocess.embeddings("The answer is 60.")
    assert len(result.data) == 1 and abs(sum(x * x for x in result.data[0].embedding) - 1) < 1e-5


def test_base64_is_little_endian_float32_of_the_same_vectors(inprocess):
    floats = inprocess.embeddings(TEXTS[:3]).data
    packed = inprocess.embeddings(TEXTS[:3], encoding_format="base64").data
    for f, p in zip(floats, packed):
        assert isinstance(p.embedding, str)
        raw = torch.frombuffer(bytearray(base64.b64decode(p.embedding)), dtype=torch.float32)
        assert torch.allclose(raw, torch.tensor(f.embedding), atol=1e-7)
        assert p.floats() == raw.tolist()


def test_dimensions_keeps_a_renormalised_prefix(inprocess):
    full = torch.tensor(inprocess.embeddings(TEXTS[1]).data[0].embedding)
    short = torch.tensor(inprocess.embeddings(TEXTS[1], dimensions=64).data[0].embedding)
    assert short.shape == (64,)
    assert torch.allclose(short, full[:64] / full[:64].norm(), atol=1e-6)


def test_the_openai_sdk_shape_of_call_works(http):
    # the openai SDK sends model + input + encoding_format=base64 by default
    body = {"model": "all-MiniLM-L6-v2", "input": ["hello"], "encoding_format": "base64"}
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == 200 and len(base64.b64decode(response.json()["data"][0]["embedding"])) == 384 * 4
