"""Splice mode: a turn's prompt is the chain's exact ids so far plus the new messages' rendering.

When a request's conversation extends a chain this session already served — its last
assistant message maps to a recorded turn (through a wire id the middleware minted, or an
exact match with what was recorded) and every message before it equals that turn's prompt
messages — the prompt sent to the engine is::

    that turn's prompt ids + its output ids + seam ids

The seam is what the chat template writes after an assistant message's content (its end
of turn, e.g. ``<|im_end|>\\n``), then the new messages (tool results, user text,
reminders) and the generation prompt, tokenized on its own. Nothing the model sampled is
re-tokenized or re-rendered, so a template that drops earlier reasoning (Qwen3) or
normalises whitespace cannot make the recorded tokens drift: every spliced turn is CLEAN
for the :class:`~agentrl.trajectory.TrajectoryManager`.

The seam comes from the template itself (:mod:`agentrl.prompts.seams`): the conversation
is rendered with a probe assistant message (plain content, a unique marker) in place of
the last assistant message, and everything after the marker is taken — from a reduced
conversation (the system message, the message before, the probe and what follows),
checked against the whole conversation on a session's 1st, 2nd, 4th, 8th, … spliced turn.
The end-of-turn text the output already holds (its trailing stop token) is dropped from
the seam's start; an output that ended by ``length``, or whose stop token the engine did
not return, keeps the template's end token in the seam.

Whatever the delta cannot express falls back to the full render (a new chain, as in
``render`` mode), with one of :data:`FALLBACK_REASONS`.

Public API::

    PROMPT_MODES = ("splice", "render"); FALLBACK_REASONS
    splicer = Splicer(tokenizer, chat_template_kwargs={}, stop_ids=frozenset())
    plan = splicer.plan(ledger, messages, tools, links={message index: turn})  # -> SplicePlan
    splicer.preview(ledger, messages, tools, links)  # the same plan, changing nothing
    plan.prompt (RenderedPrompt | None), plan.reason, plan.metadata()
    splicer.count(plan); splicer.stats -> Counter  ("spliced" and each fallback reason)
    ledger = SpliceLedger(); ledger.add(index, plan, prompt_ids, output_ids)
    ledger.digests(messages), ledger.tools_digest(tools)  # reuse what the last record holds

Ids are kept as ``array('I')`` (4 bytes a token): a record holds only its seam and its
output (the first record shares the prompt array it was given), a turn's prompt ids are
joined from the records when it is planned, and a request's message digests are reused
for every message equal to the one the last record holds at its index, so a turn digests
only its new messages. The seam is tokenized without offsets, cut at its added tokens
(:mod:`agentrl.prompts.segments`); the probe renders use the compiled template
(:mod:`agentrl.prompts.templates`). ``splicer.seams.stats`` counts reduced and full
probe renders and the checks.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from array import array
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from agentrl.prompts.keys import loose_key
from agentrl.prompts.rendering import RenderedPrompt
from agentrl.prompts.seams import SeamFinder
from agentrl.prompts.segments import SegmentEncoder, as_id_array, id_array
from agentrl.trajectory import message_key

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "FALLBACK_REASONS",
    "PROMPT_MODES",
    "SpliceLedger",
    "SplicePlan",
    "SpliceRecord",
    "Splicer",
    "check_prompt_mode",
    "links_by_index",
    "stop_ids_for",
]

logger = logging.getLogger(__name__)

#: ``splice``: extend the chain's exact ids (the default); ``render``: render every prompt
#: from the whole conversation with the chat template (ids identical to
#: ``apply_chat_template``).
PROMPT_MODES = ("splice", "render")

#: Why a turn in splice mode was rendered in full instead (the ``splice_fallback`` metadata).
FALLBACK_REASONS = {
    "new_chain": "the conversation has no earlier assistant message (a first turn, a sub-agent)",
    "ends_with_assistant": "the conversation ends with an assistant message (a prefill)",
    "unmapped_message": "its last assistant message maps to no recorded turn "
    "(rewritten without a wire id the middleware minted, or not generated here)",
    "system_changed": "the system prompt differs from the one the chain was sampled with",
    "rewritten_message": "an earlier assistant message differs from the one recorded",
    "history_changed": "a message before the last assistant message differs from the "
    "chain's (compaction, an edited message)",
    "tools_changed": "the tools list differs from the one the chain was sampled with",
    "stop_token": "the previous output ended with a stop token the template does not "
    "write after an assistant message",
    "delta_unrenderable": "the template's text for the new messages could not be isolated",
}


def check_prompt_mode(value: str, what: str = "prompt_mode") -> str:
    """``value`` if it is one of :data:`PROMPT_MODES`; ValueError naming them otherwise."""
    if value not in PROMPT_MODES:
        raise ValueError(f"{what}: expected one of {PROMPT_MODES}, got {value!r}")
    return value


def _digest(value: Any) -> bytes:
    """A digest of one message (any key order); an assistant message as a client may
    replay it: text trimmed, reasoning left out (``loose_key``).

    The spliced ids come from the record, never from the replay, so an assistant message
    need only be recognised; two replies that replay alike (two empty ones, one with an
    empty think block) are told apart by the messages before them.
    """
    if isinstance(value, Mapping):
        text = loose_key(value) if value.get("role") == "assistant" else message_key(value)
    else:
        text = json.dumps(value, default=repr)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@attrs.define(eq=False, slots=True)
class SpliceRecord:
    """One recorded turn a later turn can extend: its ids, stored relative to its base turn.

    ``prompt = sequence(base) + head`` when ``base`` is set (``head`` is the seam), else
    ``prompt = head``; ``sequence = prompt + output``. ``history`` holds a digest of each
    prompt message, ``tools`` one of the tools list.
    """

    index: int
    base: SpliceRecord | None
    head: array
    output: array
    history: tuple[bytes, ...]
    tools: bytes
    #: The conversation through this turn's response, as recorded in the trajectory: a
    #: turn spliced onto this one records these messages in place of the client's replay.
    conversation: tuple[Mapping[str, Any], ...] = ()

    def sequence(self) -> array:
        """The whole sequence (prompt + output) this turn left in the engine's context."""
        path: list[SpliceRecord] = []
        node: SpliceRecord | None = self
        while node is not None:
            path.append(node)
            node = node.base
        ids = array(self.output.typecode)
        for step in reversed(path):
            for part in (step.head, step.output):
                ids.extend(part if part.typecode == ids.typecode else part.tolist())
        return ids


@attrs.define(eq=False)
class SpliceLedger:
    """One session's recorded turns, by index, and which turns recorded which response."""

    records: dict[int, SpliceRecord] = attrs.field(factory=dict)
    by_response: dict[bytes, list[int]] = attrs.field(factory=dict)
    #: The conversation the turn added last recorded, and the digest of each message: the
    #: next request mostly replays it, so only its new or changed messages are digested.
    _known: tuple[tuple[Mapping[str, Any], ...], tuple[bytes, ...]] = ((), ())
    _tools: tuple[list[Any] | None, bytes] | None = None
    #: Turns recorded that were spliced onto an earlier one.
    spliced: int = 0

    def tools_digest(
        self, tools: Sequence[Mapping[str, Any]] | None, *, remember: bool = True
    ) -> bytes:
        """The digest of a tools list (the previous one's when the list is equal); kept for
        the next request unless ``remember`` is False."""
        value = list(tools) if tools else None
        cached = self._tools
        if cached is not None and cached[0] == value:
            return cached[1]
        digest = _digest(value)
        if remember:
            self._tools = (value, digest)
        return digest

    def digests(self, messages: Sequence[Mapping[str, Any]]) -> tuple[bytes, ...]:
        """A digest of each message; a message equal to the one at its index in the
        conversation recorded last reuses that message's digest."""
        known, digests = self._known
        out = []
        for position, message in enumerate(messages):
            if position < len(known) and (message is known[position] or message == known[position]):
                out.append(digests[position])
            else:
                out.append(_digest(message))
        return tuple(out)

    def sequence(self, record: SpliceRecord) -> array:
        """``record``'s whole sequence (a fresh array, joined from the records' pieces:
        each id is held once, by the record that added it)."""
        return record.sequence()

    def add(
        self,
        index: int,
        plan: SplicePlan,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        response: Mapping[str, Any],
        messages: Sequence[Mapping[str, Any]] = (),
    ) -> SpliceRecord:
        """Record turn ``index`` (prompt as sent, sampled ids, the assistant message recorded
        and the prompt messages recorded with it)."""
        output = id_array(output_ids)
        # The first prompt is shared with the caller's (read-only by convention) array.
        head = as_id_array(plan.seam_ids if plan.base is not None else prompt_ids)
        record = SpliceRecord(
            index=index,
            base=plan.base,
            head=head,
            output=output,
            history=plan.history,
            tools=plan.tools,
            conversation=(*messages, response),
        )
        self.records[index] = record
        self.spliced += plan.base is not None
        response_digest = _digest(response)
        self.by_response.setdefault(response_digest, []).append(index)
        self._known = (
            record.conversation,
            (*self._conversation_digests(plan, messages), response_digest),
        )
        return record

    def _conversation_digests(
        self, plan: SplicePlan, messages: Sequence[Mapping[str, Any]]
    ) -> list[bytes]:
        """Digests of the recorded prompt messages: the plan's for the request's own
        messages, the previous record's for the ones restored from it, else computed."""
        request = plan.messages
        known, known_digests = self._known
        out = []
        for position, message in enumerate(messages):
            if position < len(request) and message is request[position]:
                out.append(plan.history[position])
            elif position < len(known) and message is known[position]:
                out.append(known_digests[position])
            else:
                out.append(_digest(message))
        return out


@attrs.frozen(kw_only=True)
class SplicePlan:
    """How one turn's prompt is made: spliced onto ``base`` (``prompt`` set) or rendered.

    ``reason`` names the fallback (a key of :data:`FALLBACK_REASONS`) when ``prompt`` is
    None; ``history`` and ``tools`` are the request's digests, kept with the turn.
    """

    prompt: RenderedPrompt | None = None
    base: SpliceRecord | None = None
    #: The seam's ids (an ``array('I')``; any int sequence is accepted).
    seam_ids: Sequence[int] = ()
    reason: str | None = None
    detail: str = ""
    history: tuple[bytes, ...] = ()
    tools: bytes = b""
    #: The request's messages ``history`` digests (for the ledger; not kept with the turn).
    messages: Sequence[Mapping[str, Any]] = attrs.field(default=(), repr=False, eq=False)

    def metadata(self) -> dict[str, Any]:
        """The recorded turn's ``prompt_mode`` (and ``splice_fallback`` with the reason)."""
        if self.prompt is not None:
            return {"prompt_mode": "splice", "spliced_on_turn": self.base.index}  # type: ignore[union-attr]
        return {"prompt_mode": "render", "splice_fallback": self.reason}


@attrs.define(eq=False)
class Splicer:
    """Builds spliced prompts with one tokenizer's chat template; counts what it did."""

    tokenizer: PreTrainedTokenizerBase
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    #: Ids that end a generation (trimmed before parsing); a trailing run of them is the
    #: end of turn the seam must not repeat.
    stop_ids: frozenset[int] = frozenset()
    #: A template other than the tokenizer's own (None: the tokenizer's).
    chat_template: str | None = None
    #: ``"spliced"`` and each fallback reason, over the recorded turns.
    stats: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: Reads each seam from the template (:mod:`agentrl.prompts.seams`).
    seams: SeamFinder = attrs.field(init=False)

    @seams.default
    def _seams(self) -> SeamFinder:
        return SeamFinder(
            self.tokenizer, self.chat_template, self.chat_template_kwargs, self.stop_ids
        )

    def plan(
        self,
        ledger: SpliceLedger,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        links: Mapping[int, int] | None = None,
        *,
        sid: str = "",
        index: int = 0,
    ) -> SplicePlan:
        """Splice the prompt for ``messages`` onto the chain they extend, or say why not.

        ``links`` maps a message index to the turn whose minted wire id it replayed. A
        fallback other than ``new_chain`` is logged (``sid`` and ``index`` name the turn).
        """
        plan = self._plan(ledger, messages, tools, links, ledger.tools_digest(tools), self.seams)
        if plan.reason is not None and plan.reason != "new_chain":
            logger.info(
                "session %s turn %d: splice fallback %r (%s%s); rendering the whole "
                "conversation, which starts a new chain",
                sid,
                index,
                plan.reason,
                FALLBACK_REASONS[plan.reason],
                f": {plan.detail}" if plan.detail else "",
            )
        return plan

    def preview(
        self,
        ledger: SpliceLedger,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        links: Mapping[int, int] | None = None,
    ) -> SplicePlan:
        """The plan :meth:`plan` would make now, changing nothing (``count_tokens``).

        The ledger's tools digest, the seam finder's stats and its ``reduces`` stay as they
        are (the seam is read by a copy of the finder), and no fallback is logged.
        """
        digest = ledger.tools_digest(tools, remember=False)
        scratch = attrs.evolve(self.seams, stats=collections.Counter())
        return self._plan(ledger, messages, tools, links, digest, scratch)

    def _plan(
        self,
        ledger: SpliceLedger,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        links: Mapping[int, int] | None,
        tools_digest: bytes,
        seams: SeamFinder,
    ) -> SplicePlan:
        """:meth:`plan` without its log line, with the seams read by ``seams``."""
        history = ledger.digests(messages)
        plan = SplicePlan(history=history, tools=tools_digest, messages=messages)
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        if last < 0:
            return attrs.evolve(plan, reason="new_chain")
        if last == len(messages) - 1:
            return attrs.evolve(plan, reason="ends_with_assistant")
        candidates = self._candidates(ledger, history[last], (links or {}).get(last))
        if not candidates:
            return attrs.evolve(plan, reason="unmapped_message", detail=f"message {last}")
        base = next((c for c in candidates if c.history == history[:last]), None)
        if base is None:
            reason, detail = _history_reason(candidates[0].history, history[:last], messages)
            return attrs.evolve(plan, reason=reason, detail=detail)
        if base.tools != tools_digest:
            return attrs.evolve(plan, reason="tools_changed", detail=f"turn {base.index}")
        check = ledger.spliced & (ledger.spliced + 1) == 0  # its 1st, 2nd, 4th, ... splice
        seam = seams.seam(messages, last, tools, base.output, check=check)
        if isinstance(seam, tuple):
            return attrs.evolve(plan, reason=seam[0], detail=seam[1])
        seam_ids = self._encode(seam)
        prompt_ids = ledger.sequence(base)
        reused = len(prompt_ids)
        if prompt_ids.typecode != seam_ids.typecode:
            prompt_ids = id_array(prompt_ids, seam_ids.typecode)
        prompt_ids.extend(seam_ids)
        prompt = RenderedPrompt(
            text=seam, ids=prompt_ids, reused_tokens=reused, tokenized_chars=len(seam)
        )
        # The recorded conversation takes the base's messages for the replayed part, so the
        # plan keeps only the request's new ones: the rest of the request dies now, not
        # after the engine call (fewer young objects for the collector to scan).
        kept = len(base.conversation)
        request = [None] * kept + list(messages[kept:]) if kept else messages
        return attrs.evolve(plan, prompt=prompt, base=base, seam_ids=seam_ids, messages=request)

    def _encode(self, text: str) -> array:
        """``text``'s ids, cut at its added-token boundaries (no offsets), or whole."""
        encoder = SegmentEncoder.for_tokenizer(self.tokenizer)
        if encoder is not None:
            return encoder.ids(text)
        return id_array(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count(self, plan: SplicePlan) -> None:
        """Count one recorded turn's outcome in :attr:`stats`."""
        self.stats["spliced" if plan.prompt is not None else str(plan.reason)] += 1

    def _candidates(
        self, ledger: SpliceLedger, key: bytes, linked: int | None
    ) -> list[SpliceRecord]:
        """The recorded turns the last assistant message may be: its wire id's, then by content."""
        found: list[SpliceRecord] = []
        if linked is not None and linked in ledger.records:
            found.append(ledger.records[linked])
        for turn in reversed(ledger.by_response.get(key, ())):
            record = ledger.records[turn]
            if record not in found:
                found.append(record)
        return found


def _history_reason(
    recorded: Sequence[bytes], history: Sequence[bytes], messages: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
    """Why ``history`` (the request's messages before its last assistant) is not ``recorded``."""
    for position, (was, now) in enumerate(zip(recorded, history, strict=False)):
        if was != now:
            role = messages[position].get("role")
            if role == "system" and position == 0:
                return "system_changed", "message 0"
            if role == "assistant":
                return "rewritten_message", f"message {position}"
            return "history_changed", f"message {position} ({role})"
    return "history_changed", f"{len(history)} messages where the chain had {len(recorded)}"


def links_by_index(links: Mapping[str, int]) -> dict[int, int]:
    """:meth:`Session.links`' ``{"index": turn}`` keyed by int."""
    return {int(k): v for k, v in links.items()}


def stop_ids_for(tokenizer: PreTrainedTokenizerBase, stop_ids: Collection[int]) -> frozenset[int]:
    """The pipeline's stop ids and the tokenizer's EOS id."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return frozenset(stop_ids) | ({eos} if isinstance(eos, int) else set())
