"""What /openapi.json says beyond FastAPI's defaults (clients test their types against it), and the docs
served behind the key."""

from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from setpo_server.auth import require_key
from setpo_server.schemas import DiversityRequest, EmbeddingsRequest, ErrorResponse

# The error answers a route declares: each has the ErrorResponse body.
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (400, 401, 408, 413, 415, 422, 429, 503)
}


def request_body(model: type[BaseModel]) -> dict:
    """OpenAPI for a body the route reads itself (publish_request_bodies adds the schema to the components)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def publish_request_bodies(app: FastAPI) -> None:
    """/openapi.json with the request models of the routes that read their own body (clients test against it)."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        schema = app.openapi_schema
        if schema is None:
            schema = default_openapi()  # also kept as app.openapi_schema
            _, definitions = models_json_schema(
                [(DiversityRequest, "validation"), (EmbeddingsRequest, "validation")],
                ref_template="#/components/schemas/{model}",
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions["$defs"])
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema


def docs_routes(app: FastAPI) -> APIRouter:
    """/openapi.json, /docs and /redoc as FastAPI serves them, behind the key."""
    docs = APIRouter(dependencies=[Depends(require_key)], include_in_schema=False)

    @docs.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @docs.get("/docs")
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="setpo")

    @docs.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="setpo")

    return docs
