"""``/docs``: the interactive API documentation (Swagger UI 5, which reads the
OpenAPI 3.1 schema FastAPI makes) served from the files of the ``fastapi-offline``
package installed with corral, never from a CDN: the page, its
script and style come from this server (``/docs/assets/``), and the script that
starts it is a file too (``/docs/init.js``), so the page runs under a policy that
allows scripts of this origin only. ``/openapi.json`` is the schema it shows; ReDoc
(``/redoc``), which FastAPI loads from a CDN, is not served.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body>
</html>
"""
INIT = """window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
"""


def swagger_ui_dir() -> Path | None:
    """Where the installed ``fastapi-offline`` keeps Swagger UI's files (None: not
    installed); only its files are used, not its code."""
    spec = importlib.util.find_spec("fastapi_offline")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "static"
        if (path / "swagger-ui-bundle.js").is_file() and (path / "swagger-ui.css").is_file():
            return path
    return None


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` from the local Swagger UI (the app is made with ``docs_url=None``
    and ``redoc_url=None``); without the package ``/docs`` is a 404 saying so."""
    found = swagger_ui_dir()

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    def docs() -> Response:
        if found is None:
            return Response(
                "the API documentation needs the fastapi-offline package (pip install "
                "fastapi-offline); the schema is at /openapi.json",
                status_code=404,
                media_type="text/plain",
            )
        return HTMLResponse(PAGE.format(title=app.title, assets=ASSETS))

    @app.get("/docs/init.js", include_in_schema=False)
    def docs_init() -> Response:
        return Response(INIT, media_type="text/javascript")

    if found is not None:
        app.mount(ASSETS, StaticFiles(directory=str(found)), name="docs-assets")
