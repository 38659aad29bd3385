"""The browser pages: ``GET /playground`` (ask any alias a question about your documents and watch the
answer and its citations stream in) and ``GET /status`` (routes and targets, live). Plain HTML, CSS and
ES modules from ``gateway/http/web/``, served as they are: no build step, no third-party code.

The pages hold no secrets and need none to load; what they show comes from the API they call with the
key typed into them (kept in the page's memory only). ``server.ui: false`` turns them off (404).
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get

from gateway.http.routes import error_response
from gateway.wire.errors import NotFound, new_request_id

if TYPE_CHECKING:
    from gateway.core import Gateway

__all__ = ["PAGE_HANDLERS", "asset"]

_TYPES = {
    ".html": "text/html",  # Litestar adds "; charset=utf-8" to text types
    ".js": "text/javascript",
    ".css": "text/css",
}
# Same-origin only: no inline script or style, no framing, nothing fetched from elsewhere.
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _load() -> dict[str, tuple[bytes, str]]:
    files: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("gateway.http").joinpath("web").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


_FILES = _load()


def asset(name: str) -> tuple[bytes, str] | None:
    """A file of ``gateway/http/web/`` and its content type; None for anything else (no paths, no listing)."""
    return _FILES.get(name)


def _serve(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    gw: Gateway = request.app.state.gateway
    found = asset(name) if gw.settings.server.ui else None
    if found is None:
        return error_response(NotFound(f"no route for GET {request.url.path}"), new_request_id())
    body, content_type = found
    return Response(body, media_type=content_type, headers=_HEADERS)


@get("/playground")
async def playground(request: Request[Any, Any, Any]) -> Response[bytes]:
    return _serve(request, "playground.html")


@get("/status")
async def status_page(request: Request[Any, Any, Any]) -> Response[bytes]:
    return _serve(request, "status.html")


@get("/ui/{name:str}")
async def ui_asset(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    return _serve(request, name)


PAGE_HANDLERS = [playground, status_page, ui_asset]
