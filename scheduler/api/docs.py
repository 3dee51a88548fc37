"""`/docs` (Swagger UI) and `/redoc` (ReDoc) served from this process, so they work offline.

The assets are those the `fastapi-offline` package ships (Swagger UI's bundle and stylesheet,
ReDoc's standalone build, under their own licences), a dependency of the `api` extra; they are
served under `/docs/assets/`, never from a CDN.
"""

from __future__ import annotations

import importlib.resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

ASSET_PACKAGE = "fastapi_offline"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
PREFIX = "/docs/assets"


def install(app: FastAPI) -> None:
    """Serve `/docs`, `/redoc` and their assets from `app` (created with `docs_url=None, redoc_url=None`)."""
    title = app.title

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title} - ReDoc",
            redoc_js_url=f"{PREFIX}/redoc.standalone.js",
            redoc_favicon_url=f"{PREFIX}/favicon.png",
            with_google_fonts=False,
        )

    @app.get(PREFIX + "/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            return Response("not found", status_code=404, media_type="text/plain")
        body = (importlib.resources.files(ASSET_PACKAGE) / "static" / name).read_bytes()
        return Response(body, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})
