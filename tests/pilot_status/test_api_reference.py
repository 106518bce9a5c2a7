"""docs/api.md is the OpenAPI schema rendered (pilot_status.api_reference): it never disagrees with the code."""

from __future__ import annotations

from messaging.management.commands.api_reference import PAGE, current_page
from pilot_status.api_reference import render


def test_docs_api_md_is_the_current_schema_rendered() -> None:
    assert PAGE.read_text() == current_page(), "docs/api.md is out of date: run `make api-docs`"


def test_every_operation_of_the_schema_has_a_section_and_a_summary() -> None:
    page = current_page()
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert f"### {method.upper()} {path}\n" in page
            assert operation.get("summary"), f"{method.upper()} {path} has no summary"


def test_types_read_as_words_and_link_to_their_schema() -> None:
    schema = {
        "info": {"description": "d", "version": "1"},
        "paths": {"/v1/x": {"post": {"tags": ["x"], "summary": "Do x.", "requestBody": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}},
            "responses": {"200": {"description": "", "content": {"application/json": {"schema": {
                "type": "array", "items": {"$ref": "#/components/schemas/Thing"}}}}}}}}},
        "components": {"schemas": {"Thing": {"type": "object", "required": ["a"], "properties": {
            "a": {"type": "string", "maxLength": 5, "nullable": True, "description": "A | b"},
            "b": {"enum": ["X", "Y"], "type": "string"}}}}},
    }
    page = render(schema)
    assert "| [`POST /v1/x`](#post-v1x) | Do x. |" in page
    assert "Request body (application/json): [Thing](#thing)" in page
    assert "| 200 | array of [Thing](#thing) |  |" in page
    assert "| `a` | string, max length 5, nullable | yes | A \\| b |" in page
    assert "| `b` | `X` \\| `Y` | no |  |" in page
