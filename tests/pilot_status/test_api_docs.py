"""/v1/docs/ is self-hosted (issue 24): Swagger UI comes from drf-spectacular-sidecar through WhiteNoise,
so the page works offline and loads no third party's script."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin, urlparse

def references(html: str) -> list[str]:
    """Every src="…" and href="…" of the page."""
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)


def test_the_docs_page_names_no_external_host(db: Any, client: Any) -> None:
    response = client.get("/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    external = re.findall(r"""(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^"'\s]*""", html)
    assert external == [], f"the docs page names another host: {external}"
    # The page carries a random CSRF token, which may spell "cdn" by chance (it did, once in a few hundred runs).
    assert "cdn" not in re.sub(r"[A-Za-z0-9]{32,}", "", html).lower()
    assert "@latest" not in html


def test_every_asset_the_docs_page_references_answers_200(db: Any, client: Any) -> None:
    html = client.get("/v1/docs/").content.decode()
    assets = [ref for ref in references(html) if not ref.startswith(("#", "data:"))]
    assert any(ref.endswith("swagger-ui-bundle.js") for ref in assets), assets
    assert any(ref.endswith("swagger-ui.css") for ref in assets), assets
    for ref in assets:
        url = urljoin("/v1/docs/", ref)
        assert not urlparse(url).netloc, url
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
