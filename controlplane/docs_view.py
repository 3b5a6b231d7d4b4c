"""The documentation site under /docs: the MkDocs build bundled with the package, served as static files.

The site is built from `docs/` by `make docs` into `controlplane/docs_site/` (package data: a wheel built
after it carries it; the Dockerfile's build stage does so); `FLIGHTDECK_DOCS_DIR` serves another build instead. It is served from this
process, never a CDN, so the console's help links and the alerts' "what it means" links work with no
internet. The pages are public: they hold what the source tree ships (no setting's value, no model, no
alert state), the same text as the README and the repository (SECURITY.md, "The documentation site").

`/api/docs` is something else: Swagger UI over the live OpenAPI document (`openapi.py`).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from flask import Blueprint, Response, redirect, send_from_directory
from werkzeug.exceptions import NotFound
from werkzeug.security import safe_join

from controlplane.auth.guard import public
from controlplane.context import current_services

bp = Blueprint("docs", __name__)

# Material's pages carry small inline scripts (its palette and search bootstrap) and a search worker;
# everything else comes from this server, as for the console.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'self'; "
    "form-action 'self'; frame-ancestors 'self'"
)
NOT_BUILT = (
    "<!doctype html><title>Documentation not built</title><h1>Documentation not built</h1>"
    "<p>This installation carries no documentation site. Build it from a source checkout with "
    "<code>make docs</code> (it lands in <code>controlplane/docs_site/</code>, and in the wheel built after it), "
    "or point <code>FLIGHTDECK_DOCS_DIR</code> at a built site. The same pages are the <code>docs/</code> "
    "folder of the source.</p>"
)


def site_dir() -> Path:
    """Return the folder of the built site this process serves (it may be missing)."""
    configured = current_services().settings.docs_dir
    return Path(configured) if configured else Path(str(files("controlplane") / "docs_site"))


def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = DOCS_CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


@bp.get("/docs")
@public
def docs_root() -> Response:
    """Redirect to the site's home page (relative links need the trailing slash)."""
    return redirect("/docs/", code=308)


@bp.get("/docs/")
@bp.get("/docs/<path:page>")
@public
def docs_page(page: str = "") -> Response:
    """Serve one file of the built site; a folder's URL serves its index.html, as MkDocs links them."""
    site = site_dir()
    if not (site / "index.html").is_file():
        return _headers(Response(NOT_BUILT, status=404, mimetype="text/html"))
    if page == "" or page.endswith("/"):
        page += "index.html"
    found = safe_join(str(site), page)
    if found is not None and Path(found).is_dir():  # /docs/alerts/x without the slash
        return redirect(f"/docs/{page}/", code=308)
    try:
        response = send_from_directory(str(site), page, max_age=300)
    except NotFound:
        missing = site / "404.html"
        body = missing.read_bytes() if missing.is_file() else b"Not found"
        return _headers(Response(body, status=404, mimetype="text/html"))
    return _headers(response)
