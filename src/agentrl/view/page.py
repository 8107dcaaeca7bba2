"""The page: one HTML file with our own CSS and JS inline, and the data as inert JSON.

The JSON sits in a ``<script type="application/json">`` element with ``<``, ``>``,
``&`` and the two JavaScript line separators escaped, so no text in the data can close
the element or start markup; the script reads it with ``JSON.parse`` and puts every
string on the page with ``textContent``. No CDN, no framework: the file works offline.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
from typing import Any

from agentrl import jsonio

__all__ = ["content_security_policy", "embed_json", "page_policy", "render_page"]

_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_TABLE = str.maketrans(_ESCAPES)


def _asset(name: str) -> str:
    return importlib.resources.files("agentrl.view").joinpath("static", name).read_text("utf-8")


def embed_json(value: Any) -> str:
    """``value`` as JSON text safe inside a ``<script>`` element (no ``<`` at all)."""
    return jsonio.dumps_text(value, default=str).translate(_TABLE)


def content_security_policy(script: str) -> str:
    """The page's policy: nothing loads from anywhere, only our own script (by hash) runs."""
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    return (
        f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
    )


def page_policy() -> str:
    """The policy of the page :func:`render_page` writes (for a server's header)."""
    return content_security_policy(_asset("view.js"))


def render_page(data: Any, title: str = "agentrl view") -> str:
    """The whole page: the template with the CSS, the JS and ``data`` put in."""
    template = _asset("view.html")
    script = _asset("view.js")
    # str.replace, once each, in an order where no inserted text is searched again.
    head, _, rest = template.partition("/*@CSS@*/")
    middle, _, tail = rest.partition("@DATA@")
    script_head, _, script_tail = tail.partition("/*@JS@*/")
    safe_title = (
        title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )
    return "".join(
        (
            head.replace("@TITLE@", safe_title).replace("@CSP@", content_security_policy(script)),
            _asset("view.css"),
            middle,
            embed_json(data),
            script_head,
            script,
            script_tail,
        )
    )
