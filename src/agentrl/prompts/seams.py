"""The seam of a spliced prompt: the chat template's text after the last assistant message.

Public API::

    finder = SeamFinder(tokenizer, chat_template=None, chat_template_kwargs={},
                        stop_ids=frozenset())
    finder.seam(messages, last, tools, output, check=False) -> str | (reason, detail)
    finder.reduces                  # False once a check found a reduced render wrong
    finder.stats -> Counter         # "reduced", "full", "checked", "check_failed"

The seam comes from the template itself: the conversation is rendered with a probe
assistant message (plain content, a unique marker) in place of the last assistant
message, and everything after the marker is taken; two different markers must give the
same text, each exactly once. A reduced render outside the checks below, and the whole
render that checks a reduced one, use one marker: what two markers would disagree on is
the template's handling of the marker's own characters, which the checked reduced render
finds with both. The end-of-turn text the output already holds (its trailing
stop token) is dropped from the seam's start; an output that ended by ``length``, or whose
stop token the engine did not return, keeps the template's end token in the seam.

Rendering the whole conversation twice a turn costs time that grows with the
conversation, and almost all of it is spent on text before the marker, which is thrown
away. So the probes first render a *reduced* conversation: the leading system message,
the message before the last assistant message, the probe and everything after it (the
same tools and keywords). Chat templates write the text after an assistant message from
that message's neighbours, the system message and the tools (Qwen3's ``last_query_index``
and the like decide only how *assistant* messages render, and no assistant message
follows the probe), so the reduced seam is the full one. That is checked rather than
assumed: when the reduced conversation does not render (a template that insists on
alternating roles, say), does not hold the probe verbatim, or ``check`` is set (the
splicer sets it on a session's 1st, 2nd, 4th, 8th, … spliced turn), the whole conversation
is rendered too; a check that finds the two seams different turns reduction off for this
finder for good (logged as a warning) and the turn takes the full seam. A conversation
the reduction would not shorten is rendered whole, which is then its only render. Every
fallback reason comes from the full render, so it is the one the whole conversation gives.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.prompts.rendering import RenderError, render_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["PROBES", "SeamFinder"]

logger = logging.getLogger(__name__)

#: Markers put in a probe assistant message's content (they must differ in every character
#: so that no common suffix hides inside them).
PROBES = ("AGENTRL-SPLICE-PROBE-7Q", "agentrl_splice_probe_3z")
assert len(PROBES[0]) == len(PROBES[1])


def reduced_conversation(
    messages: Sequence[Mapping[str, Any]], last: int
) -> list[Mapping[str, Any]] | None:
    """The leading system message, message ``last - 1``, then ``last`` on; None when that
    drops nothing (the conversation is then rendered whole)."""
    head = [messages[0]] if messages[0].get("role") == "system" else []
    keep = max(len(head), last - 1)
    if keep <= len(head):
        return None
    return [*head, *messages[keep:]]


@attrs.define(eq=False)
class SeamFinder:
    """Finds seams with one tokenizer's chat template, from reduced renders where it can."""

    tokenizer: PreTrainedTokenizerBase
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    #: Ids that end a generation: a trailing run of them is the end of turn the seam must
    #: not repeat.
    stop_ids: frozenset[int] = frozenset()
    #: False once a check found a reduced seam that is not the full one.
    reduces: bool = True
    #: How seams were found: ``reduced``, ``full``, ``checked``, ``check_failed``.
    stats: collections.Counter[str] = attrs.field(factory=collections.Counter)

    def seam(
        self,
        messages: Sequence[Mapping[str, Any]],
        last: int,
        tools: Sequence[Mapping[str, Any]] | None,
        output: Sequence[int],
        *,
        check: bool = False,
    ) -> str | tuple[str, str]:
        """The text after message ``last``'s sampled ``output``, or (reason, detail)."""
        reduced = reduced_conversation(messages, last) if self.reduces else None
        text: str | tuple[str, str] | None = None
        if reduced is not None:
            probes = PROBES if check else PROBES[:1]
            found = self._probed(reduced, len(reduced) - len(messages) + last, tools, probes)
            if isinstance(found, str):
                text = found
        if text is None or check:
            # Checking a reduced seam both probes agreed on, one probe is enough.
            full = self._probed(messages, last, tools, PROBES if text is None else PROBES[:1])
            if text is not None:
                self.stats["checked"] += 1
                if full != text:
                    self.stats["check_failed"] += 1
                    self.reduces = False
                    logger.warning(
                        "the chat template's text after the last assistant message depends on "
                        "earlier messages; seams are read from whole-conversation renders from "
                        "now on"
                    )
            text = full
            self.stats["full"] += 1
        else:
            self.stats["reduced"] += 1
        if isinstance(text, tuple):
            return text
        return self._trim(text, output)

    def _probed(
        self,
        messages: Sequence[Mapping[str, Any]],
        last: int,
        tools: Sequence[Mapping[str, Any]] | None,
        probes: Sequence[str] = PROBES,
    ) -> str | tuple[str, str]:
        """The text after the probe put at ``last`` (the probes agreeing), or (reason, detail)."""
        texts: list[str] = []
        cuts: list[int] = []
        for probe in probes:
            probed = [*messages[:last], {"role": "assistant", "content": probe}]
            probed += messages[last + 1 :]
            try:
                text = render_text(
                    self.tokenizer,
                    probed,
                    tools,
                    chat_template=self.chat_template,
                    chat_template_kwargs=self.chat_template_kwargs,
                )
            except RenderError as exc:
                return "delta_unrenderable", str(exc)
            cut = text.find(probe)
            if cut < 0 or text.find(probe, cut + 1) >= 0:
                return "delta_unrenderable", "the template does not render content verbatim"
            texts.append(text)
            cuts.append(cut)
        # The probes have one length: equal cuts and texts that agree before and after them.
        first, cut, width = texts[0], cuts[0], len(PROBES[0])
        seam = first[cut + width :]
        for other, other_cut in zip(texts[1:], cuts[1:], strict=True):
            if (
                other_cut != cut
                or other[cut + width :] != seam
                or not other.startswith(first[:cut])
            ):
                return "delta_unrenderable", "the template's text depends on the message content"
        return seam

    def _trim(self, seam: str, output: Sequence[int]) -> str | tuple[str, str]:
        """``seam`` less the end-of-turn text ``output`` already ends with."""
        trailing = len(output)
        while trailing and output[trailing - 1] in self.stop_ids:
            trailing -= 1
        if trailing < len(output):
            end = self.tokenizer.decode(list(output[trailing:]), skip_special_tokens=False)
            if not seam.startswith(end):
                return (
                    "stop_token",
                    f"the output ends with {end!r}, the template with {seam[:24]!r}",
                )
            seam = seam[len(end) :]
        return seam
