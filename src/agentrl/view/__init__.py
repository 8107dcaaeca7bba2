"""``agentrl view``: a run's rollouts down to the token, in a browser.

Reads an ``agentrl rollout`` output directory or an ``agentrl serve --output`` JSONL file
(:mod:`~agentrl.view.source`, through the bounded, confined reads of
:mod:`~agentrl.view.files`), computes the run page's numbers (:mod:`~agentrl.view.model`)
and each rollout's session tree and token provenance (:mod:`~agentrl.view.session`),
decodes ids per token (:mod:`~agentrl.view.tokens`), and writes one self-contained page
(:mod:`~agentrl.view.page`, assets in ``static/``) or serves it with lazily loaded JSON
(:mod:`~agentrl.view.server`, behind :mod:`~agentrl.view.access`'s host and token
checks), following a run in progress; two runs compare side by side
(:mod:`~agentrl.view.compare`). See docs/view.md.
"""

from __future__ import annotations

from agentrl.view.page import render_page
from agentrl.view.source import RunSource, ViewError

__all__ = ["RunSource", "ViewError", "export_html"]


def export_html(source: RunSource, other: RunSource | None = None) -> str:
    """The single-file page of ``source``: every rollout inline, works offline; with
    ``other``, the two runs compared on its first page."""
    data = source.export_data()
    title = source.root.name
    if other is not None:
        from agentrl.view.compare import compare_runs

        data["compare"] = compare_runs([source.run_data(), other.run_data()])
        title += f" vs {other.root.name}"
    return render_page(data, title=f"agentrl view · {title}")
