"""docs/api.md, rendered from the OpenAPI schema that drf-spectacular builds from the views and serializers.

The schema is the one description of the client API (`/v1/schema/` serves it, `/v1/docs/` shows it in Swagger
UI); this renders the same document as Markdown for readers of the repository, so the reference in docs/ can
never disagree with the code. `manage.py api_reference` writes it; `--check` says whether the file is current
(tests/pilot_status/test_api_reference.py runs the check).
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

HEADER = """# API reference

<!-- Generated from the OpenAPI schema by `make api-docs` (manage.py api_reference): do not edit by hand. -->

{description}

Version {version}. A running server serves the same schema at `/v1/schema/` and Swagger UI at `/v1/docs/`.
Every request carries `Authorization: Bearer <key>`: {auth} A TEST key and a LIVE key of the same project see
disjoint worlds; another project's objects, like the other environment's, answer 404.
Every error has the body `{{"error": {{"code": "snake_case_code", "message": "…", "details": {{…}}}}}}`; the
codes each endpoint can answer are listed under it.
"""

_METHODS = ("get", "post", "put", "patch", "delete")


def render(schema: Schema) -> str:
    info = schema.get("info", {})
    schemes = schema.get("components", {}).get("securitySchemes", {})
    auth = " ".join(scheme.get("description", "") for scheme in schemes.values()).strip()
    parts = [HEADER.format(description=info.get("description", ""), version=info.get("version", ""), auth=auth)]
    parts.append(_contents(schema))
    for tag, operations in _by_tag(schema).items():
        parts.append(f"## {tag.capitalize()}\n")
        parts.extend(_operation(path, method, operation) for path, method, operation in operations)
    parts.append("## Schemas\n")
    for name, body in sorted(schema.get("components", {}).get("schemas", {}).items()):
        parts.append(_component(name, body))
    return "\n".join(part.rstrip() + "\n" for part in parts)


def _by_tag(schema: Schema) -> dict[str, list[tuple[str, str, Schema]]]:
    tags: dict[str, list[tuple[str, str, Schema]]] = {}
    for path, item in schema.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                operation = item[method]
                tag = (operation.get("tags") or ["other"])[0]
                tags.setdefault(tag, []).append((path, method, operation))
    return tags


def _contents(schema: Schema) -> str:
    lines = ["| endpoint | what |", "|---|---|"]
    for operations in _by_tag(schema).values():
        for path, method, operation in operations:
            summary = _first_sentence(operation.get("summary") or operation.get("description") or "")
            lines.append(f"| [`{method.upper()} {path}`](#{_anchor(method, path)}) | {summary} |")
    return "\n".join(lines) + "\n"


def _anchor(method: str, path: str) -> str:
    text = f"{method} {path}".lower()
    return "".join(ch for ch in text.replace(" ", "-") if ch.isalnum() or ch in "-_")


def _first_sentence(text: str) -> str:
    line = text.strip().split("\n")[0]
    end = line.find(". ")
    return _cell(line if end < 0 else line[: end + 1])


def _operation(path: str, method: str, operation: Schema) -> str:
    lines = [f"### {method.upper()} {path}\n"]
    for text in (operation.get("summary"), operation.get("description")):
        if text:
            lines.append(text.strip() + "\n")
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for parameter in parameters:
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_type(parameter.get('schema', {}))} | "
                f"{'yes' if parameter.get('required') else 'no'} | {_cell(_strip_enum_notes(parameter.get('description', '')))} |"
            )
        lines.append("")
    body = operation.get("requestBody", {}).get("content", {})
    if body:
        media, content = next(iter(body.items()))
        lines.append(f"Request body ({media}): {_type(content.get('schema', {}))}\n")
    lines += ["| answer | body | meaning |", "|---|---|---|"]
    for code, response in operation.get("responses", {}).items():
        content = response.get("content", {})
        shape = _type(next(iter(content.values())).get("schema", {})) if content else "none"
        lines.append(f"| {code} | {shape} | {_cell(response.get('description', ''))} |")
    return "\n".join(lines) + "\n"


def _component(name: str, body: Schema) -> str:
    lines = [f"### {name}\n"]
    description = _strip_enum_notes(body.get("description", ""))
    if description:
        lines.append(description + "\n")
    if "enum" in body:
        lines.append("One of " + ", ".join(f"`{value}`" for value in body["enum"] if value is not None) + ".\n")
        return "\n".join(lines)
    properties = body.get("properties", {})
    if properties:
        required = set(body.get("required", []))
        lines += ["| field | type | required | description |", "|---|---|---|---|"]
        for field, spec in properties.items():
            note = _strip_enum_notes(spec.get("description", ""))
            lines.append(f"| `{field}` | {_type(spec)} | {'yes' if field in required else 'no'} | {_cell(note)} |")
    return "\n".join(lines) + "\n"


def _type(spec: Schema) -> str:
    """A field's type in a few words: a link to its component, an array of one, or the JSON type with its
    format, its bounds and whether null is allowed."""
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for combinator in ("allOf", "oneOf", "anyOf"):
        if combinator in spec:
            shapes = [_type(part) for part in spec[combinator] if not part.get("$ref", "").endswith("/NullEnum")]
            text = " or ".join(shapes)
            return f"{text}, nullable" if spec.get("nullable") else text
    kind = spec.get("type", "any")
    if kind == "array":
        text = f"array of {_type(spec.get('items', {}))}"
    elif "enum" in spec:
        text = " \\| ".join(f"`{value}`" for value in spec["enum"] if value is not None)
    else:
        text = kind + (f" ({spec['format']})" if "format" in spec else "")
    bounds = [f"{word} {spec[key]}" for key, word in (("minLength", "min length"), ("maxLength", "max length"),
                                                       ("minimum", "min"), ("maximum", "max")) if key in spec]
    if "default" in spec:
        bounds.append(f"default `{spec['default']}`")
    if bounds:
        text += ", " + ", ".join(bounds)
    return f"{text}, nullable" if spec.get("nullable") else text


def _strip_enum_notes(text: str) -> str:
    # drf-spectacular appends "* `X` - X" lines for every choice; the type column already lists the values.
    kept = [line for line in text.split("\n") if not line.startswith("* `")]
    return "\n".join(kept).strip()


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())
