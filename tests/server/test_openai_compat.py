"""OpenAI-compatible tooling against the real service: the official `openai` package lists the model, retrieves
it and embeds with it (its default request asks for base64), as it would against OpenAI's API. The service runs
in-process (tests/inprocess.py): the SDK's own httpx client is handed the in-process transport."""

import openai
import pytest
import torch

from tests.inprocess import InProcessService

TEXTS = ["The answer is 60.", "Let x be the number of eggs; then x / 5 = 12 and x = 60.", "12 * 5 = 60"]


def openai_of(service: InProcessService, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=service.URL + "/v1", api_key=api_key, max_retries=0, http_client=service.http())


@pytest.fixture
def openai_client(service):
    with openai_of(service) as client:
        yield client


def test_the_model_list_names_the_served_model(openai_client, inprocess):
    listed = openai_client.models.list().data
    assert [(m.id, m.object, m.owned_by) for m in listed] == [("all-MiniLM-L6-v2", "model", "setpo")]
    assert listed[0].created > 1_700_000_000  # when the server loaded it, in Unix seconds
    assert openai_client.models.retrieve("all-MiniLM-L6-v2") == listed[0]
    with pytest.raises(openai.NotFoundError, match="serves model 'all-MiniLM-L6-v2', not 'gpt-4o'"):
        openai_client.models.retrieve("gpt-4o")
    mine = inprocess.models().data[0]  # setpo's own client reads the same
    assert (mine.id, mine.created, mine.owned_by) == (listed[0].id, listed[0].created, listed[0].owned_by)


def test_embeddings_create_with_its_default_base64_equals_in_process_encode(openai_client, st_model):
    model = openai_client.models.list().data[0].id
    served = openai_client.embeddings.create(model=model, input=TEXTS)
    assert [item.index for item in served.data] == [0, 1, 2] and served.model == model
    vectors = torch.tensor([item.embedding for item in served.data])
    local = st_model.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True)
    assert torch.allclose(vectors, local, atol=1e-5)
    floats = openai_client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert torch.allclose(torch.tensor([item.embedding for item in floats.data]), vectors, atol=1e-6)


def test_a_bad_embeddings_request_is_openais_400_with_its_error_object(openai_client):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.embeddings.create(model="all-MiniLM-L6-v2", input=[])
    error = caught.value.body
    assert {"message", "type", "param", "code"} <= set(error) and error["type"] == "invalid_request_error"
    assert error["param"] == "input" and "empty list" in error["message"]


def test_served_model_names_are_what_the_server_answers_to():
    with (
        InProcessService(served_model_name="text-embedding-3-small,minilm") as named,  # as SETPO_SERVED_MODEL_NAME
        openai_of(named) as client,
    ):
        assert [m.id for m in client.models.list().data] == ["text-embedding-3-small", "minilm"]
        assert client.models.retrieve("minilm").id == "minilm"
        served = client.embeddings.create(model="minilm", input=TEXTS)
        assert served.model == "text-embedding-3-small" and len(served.data) == 3  # the first name answers
        with pytest.raises(openai.BadRequestError, match="'text-embedding-3-small' / 'minilm', not 'gpt-4o'"):
            client.embeddings.create(model="gpt-4o", input=TEXTS)
