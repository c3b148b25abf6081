"""The client's wire types against the running server's /openapi.json: same fields, types and required."""

import pytest

from setpo_client import types

REQUESTS = ["Group", "DiversityRequest", "EmbeddingsRequest"]
RESPONSES = [
    "GroupResult",
    "DiversityUsage",
    "DiversityResponse",
    "Embedding",
    "EmbeddingsUsage",
    "EmbeddingsResponse",
    "Model",
    "ModelList",
    "Limits",
    "Info",
    "ErrorDetail",
    "ErrorResponse",
]
FASTAPI_OWN = {"HTTPValidationError", "ValidationError"}
# Fields a newer server reports and an older one lacks: optional in the client, held to the server's types otherwise.
NEWER_SERVER_FIELDS = {
    "Limits": {
        "max_request_rows",
        "max_embedding_inputs",
        "max_queue_tokens",
        "max_concurrent_requests",
        "max_requests_per_caller",
        "receive_timeout",
        "header_timeout",
        "max_header_bytes",
        "write_timeout",
        "max_response_bytes",
    },
    "Info": {"threads", "truncate_chars", "contract", "dtype_reason"},
}
KEEP = {"type", "properties", "required", "items", "anyOf", "const", "enum", "$ref", "additionalProperties"}


def shape(schema):
    """A schema reduced to structure: types, fields, required, references by name. Titles, descriptions,
    defaults and value constraints are the server's business and are dropped."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "$ref":
                out[key] = value.rsplit("/", 1)[-1]
            elif key == "properties":
                out[key] = {name: shape(sub) for name, sub in value.items()}
            elif key == "required":
                out[key] = sorted(value)
            elif key in KEEP:
                out[key] = shape(value)
        return out
    if isinstance(schema, list):
        return [shape(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def server_schemas(service):
    with service.http() as http:
        return http.get("/openapi.json").json()["components"]["schemas"]


@pytest.mark.parametrize("name", REQUESTS + RESPONSES)
def test_client_type_matches_server_schema(server_schemas, name):
    mode = "validation" if name in REQUESTS else "serialization"
    client_schema = getattr(types, name).model_json_schema(mode=mode)
    assert name in server_schemas, f"server no longer publishes {name}"
    expected = shape(server_schemas[name])
    actual = shape(client_schema)
    if name not in REQUESTS:
        actual.pop("additionalProperties", None)  # responses ignore unknown fields on purpose
    # optional in the client for older servers: same type otherwise
    for field in NEWER_SERVER_FIELDS.get(name, ()):
        (kind,) = [branch for branch in actual["properties"][field]["anyOf"] if branch != {"type": "null"}]
        actual["properties"][field] = kind
        actual["required"] = sorted([*actual.get("required", []), field])
    assert actual == expected


def test_every_server_schema_has_a_client_type(server_schemas):
    missing = set(server_schemas) - set(REQUESTS) - set(RESPONSES) - FASTAPI_OWN
    assert not missing, f"the server publishes types the client does not know: {missing}"
