"""The client API's one body parser: DRF's JSONParser reading through `pilot_status.jsonbody`.

DRF's own JSONParser hands the body to `json.load`, so JSON nested a few thousand levels deep
escaped as a RecursionError (a 500), and integers of thousands of digits reached the validators
and the template renderer. This parser keeps the rest of DRF's behaviour (the media type, the body
read through `request.body`, so DATA_UPLOAD_MAX_MEMORY_SIZE still answers 413, the charset the
request names, text codecs only) and turns what `jsonbody.loads` refuses into ParseError, the 400
`invalid_json` of the error envelope.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding  # type: ignore[attr-defined]  # newer than the stubs

from . import jsonbody


class BoundedJSONParser(JSONParser):
    def parse(
        self, stream: IO[bytes], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        encoding = get_encoding(parser_context or {})  # ParseError for a charset that is not a text codec
        try:
            # Strict: truncated or invalid sequences (and UTF-8-encoded surrogates) are refused here,
            # not read as replacement characters or lone surrogates.
            text = stream.read().decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not valid {encoding}.") from exc
        try:
            return jsonbody.loads(text)
        except jsonbody.JsonBodyError as exc:
            raise ParseError(f"JSON parse error - {exc.reason}") from exc
