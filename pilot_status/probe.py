"""`python -m pilot_status.probe URL`: exit 0 when URL answers 200 within 5 s, 1 otherwise.

docker-compose's healthcheck for web and webhook (`/readyz`): the image has no curl, and this loads no
Django, so a probe every few seconds costs a few milliseconds. Only the standard library."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

TIMEOUT_SECONDS = 5.0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pilot_status.probe URL", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(argv[0], timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 (our own URL)
            status = response.status
            body = response.read(2000)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(2000)
    except (OSError, ValueError) as exc:
        print(f"probe: {argv[0]}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"probe: {argv[0]}: {status} {body.decode(errors='replace')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
