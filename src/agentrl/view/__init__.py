"""``agentrl view``: a run's rollouts down to the token, in a browser.

Reads an ``agentrl rollout`` output directory or an ``agentrl serve --output`` JSONL file
(:mod:`~agentrl.view.source`, through the bounded, confined reads of
:mod:`~agentrl.view.files`), computes the run page's numbers (:mod:`~agentrl.view.model`)
and each rollout's session tree and token provenance (:mod:`~agentrl.view.session`),
decodes ids per token (:mod:`~agentrl.view.tokens`), and writes one self-contained page
(:mod:`~agentrl.view.page`, assets in ``static/``) or serves it with lazily loaded JSON
(:mod:`~agentrl.view.server`). See docs/view.md.
"""

from __future__ import annotations

from agentrl.view.page import render_page
from agentrl.view.source import RunSource, ViewError

__all__ = ["RunSource", "ViewError", "export_html"]


def export_html(source: RunSource) -> str:
    """The single-file page of ``source``: every rollout inline, works offline."""
    return render_page(source.export_data(), title=f"agentrl view · {source.root.name}")
