"""The chat template compiled once per (tokenizer, template), rendered without per-call copies.

Public API::

    render_chat(tokenizer, messages, tools, chat_template, chat_template_kwargs) -> str
    RenderError                                   # the template failed (a ValueError)
    templates.COMPILED = False     # every render through apply_chat_template (benchmarks)

``render_chat`` returns exactly ``tokenizer.apply_chat_template(messages, tools=tools,
chat_template=chat_template, add_generation_prompt=True, tokenize=False,
**chat_template_kwargs)``. transformers compiles the template once too, but on every call
it deep-copies every message and tool (``_plain_template_data``) and its sandbox checks
every attribute and call the template makes. Here the template is compiled into a
subclass of the same ``ImmutableSandboxedEnvironment``, configured as transformers
configures its own (its extensions, filters, globals and tests are copied from the
environment transformers builds), whose ``getattr`` and ``call`` take shortcuts that give
the sandbox's own answer without its checks for what cannot be unsafe: a key of a plain
dict (a message field), a public attribute of a loop or ``namespace()``, a ``str`` method
other than ``format``/``format_map``. Everything else goes through the sandbox unchanged.

Security: the template itself comes from the model's tokenizer config (trusted as much as
transformers trusts it, and still sandboxed here); message contents are written by the
policy and are data, never template source: they reach the template only as values of
the render context, so ``{{ ... }}`` in a message is text, and a template that calls
``content.format(...)`` gets the sandbox's safe formatter as in transformers. The
messages are not copied, so the immutable sandbox (no ``append``, ``pop``, ``update`` …
on lists and dicts) is also what keeps a template from editing the caller's messages.

The inputs must be JSON-like data (dicts, lists, tuples, str, int, float, bool, None),
which is what the adapters build from a request body. When the compiled path cannot be
used — transformers lacks the helpers it mirrors, the template does not compile, a probe
conversation renders differently from ``apply_chat_template``, a tool is not a dict, a
keyword collides with one of ``apply_chat_template``'s own parameters, or the compiled
render raises — the turn goes through ``apply_chat_template`` itself (logged once per
reason).
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["JsonMemo", "RenderError", "render_chat"]

logger = logging.getLogger(__name__)


class RenderError(ValueError):
    """The chat template could not render the messages."""


#: A conversation that exercises what chat templates branch on; a compiled template must
#: render it exactly as transformers does before it is used.
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "A probe — ✓",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
]
_PROBE_MESSAGES = [
    {"role": "system", "content": "probe system ✓ {{ 1 + 1 }}"},
    {"role": "user", "content": "probe user 🙂"},
    {
        "role": "assistant",
        "content": "probe answer",
        "reasoning_content": "probe thought",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "probe_tool", "arguments": {"x": "é"}},
            }
        ],
    },
    {"role": "tool", "content": "probe result", "tool_call_id": "call_0"},
]


class _Compiled:
    """One template compiled into the fast sandbox, with the helpers it renders with."""

    def __init__(self, template: Any, alias: Any, reserved: frozenset[str]) -> None:
        self.template = template
        self.alias = alias
        self.reserved = reserved

    def render(
        self,
        tokenizer: PreTrainedTokenizerBase,
        messages: Sequence[Mapping[str, Any]],
        tools: list[Any] | None,
        kwargs: Mapping[str, Any],
    ) -> str:
        # apply_chat_template: messages to dicts without their None-valued keys, then the
        # special tokens and the caller's keywords, then render_jinja_template's aliasing of
        # reasoning fields. Nothing is deep-copied: the sandbox cannot change the values.
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        context = {**tokenizer.special_tokens_map, **kwargs}
        context.update(
            messages=self.alias(chat), tools=tools, documents=None, add_generation_prompt=True
        )
        return self.template.render(context)


def _has_nonfinite(value: Any) -> bool:
    """Whether a NaN or an infinity hides in ``value`` (orjson writes them as ``null``)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float and not math.isfinite(item):
            return True
        if kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return False


class JsonMemo:
    """A ``tojson`` filter that answers a value it met before from memory.

    The key is the value's orjson text: order-preserving and one-to-one on JSON data (a
    ``str`` key, an int within 64 bits, a finite float: ``1``, ``1.0`` and ``true``
    differ), so equal keys mean equal ``json.dumps`` text. A value orjson cannot write, or
    one holding a NaN or an infinity (which orjson writes as ``null``), and any call with
    arguments go to the filter itself. The tools list is rendered this way once, not on
    every render (a conversation's tool calls too).
    """

    #: Values remembered; the oldest is forgotten first.
    LIMIT = 4096

    def __init__(self, tojson: Any) -> None:
        self.tojson = tojson
        self._texts: dict[bytes, str] = {}
        self._lock = threading.Lock()

    def __call__(self, value: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or (type(value) is not dict and type(value) is not list):
            return self.tojson(value, *args, **kwargs)
        try:
            key = orjson.dumps(value)
        except (TypeError, orjson.JSONEncodeError):
            return self.tojson(value)
        if b"null" in key and _has_nonfinite(value):
            return self.tojson(value)
        text = self._texts.get(key)
        if text is not None:
            return text
        text = self.tojson(value)
        with self._lock:
            if len(self._texts) >= self.LIMIT:
                self._texts.pop(next(iter(self._texts)))
            self._texts[key] = text
        return text


#: False: every render goes through ``apply_chat_template`` (the library path), for the
#: benchmark's on/off comparison (``benchmarks/middleware.py``'s ``splice-libjinja`` column).
COMPILED = True

_cache: weakref.WeakKeyDictionary[Any, dict[str, _Compiled | None]] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()
_logged: set[str] = set()
_FAST_ENV: Any = None


def _log_once(reason: str, message: str, *args: Any) -> None:
    if reason not in _logged:
        _logged.add(reason)
        logger.info(message + "; rendering through apply_chat_template", *args)


def _fast_environment_class() -> Any:
    """The ImmutableSandboxedEnvironment subclass with exact shortcuts (built on first use)."""
    global _FAST_ENV
    if _FAST_ENV is not None:
        return _FAST_ENV
    from jinja2.runtime import LoopContext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    dict_attributes = frozenset(dir(dict))
    str_methods = frozenset(n for n in dir(str) if not n.startswith("_")) - {"format", "format_map"}
    builtin_method = type("".strip)
    sandbox_getattr = ImmutableSandboxedEnvironment.getattr
    sandbox_call = ImmutableSandboxedEnvironment.call

    class FastSandbox(ImmutableSandboxedEnvironment):
        """transformers' sandbox, minus its checks where the answer cannot be unsafe."""

        def getattr(self, obj: Any, attribute: str) -> Any:
            kind = type(obj)
            # A plain dict has no attribute by that name, so the sandbox would look it up.
            if kind is dict and attribute not in dict_attributes:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            # Public attributes the sandbox always allows on these types.
            if attribute[:1] != "_" and (
                kind is LoopContext
                or isinstance(obj, Namespace)
                or (kind is str and attribute in str_methods)
            ):
                try:
                    return getattr(obj, attribute)
                except AttributeError:
                    pass
            return sandbox_getattr(self, obj, attribute)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            # A bound str method other than format/format_map is always safely callable.
            if (
                type(__obj) is builtin_method
                and type(__obj.__self__) is str
                and __obj.__name__ in str_methods
            ):
                kwargs.pop("_loop_vars", None)
                kwargs.pop("_block_vars", None)
                return __obj(*args, **kwargs)
            return sandbox_call(__self, __context, __obj, *args, **kwargs)

    _FAST_ENV = FastSandbox
    return FastSandbox


_ENVIRONMENT_SETTINGS = (
    "block_start_string",
    "block_end_string",
    "variable_start_string",
    "variable_end_string",
    "comment_start_string",
    "comment_end_string",
    "line_statement_prefix",
    "line_comment_prefix",
    "trim_blocks",
    "lstrip_blocks",
    "newline_sequence",
    "keep_trailing_newline",
    "undefined",
    "finalize",
    "autoescape",
    "optimized",
)


def _compile(tokenizer: PreTrainedTokenizerBase, source: str) -> _Compiled | None:
    """Compile ``source`` as transformers does, or None (logged) when that cannot be done."""
    try:
        from transformers.utils import chat_template_utils as ctu

        reference = ctu._compile_jinja_template(source).environment
        alias = ctu._alias_reasoning_fields
        ctu._normalize_chat_messages  # noqa: B018 -- the None-dropping this module mirrors
        env_class = _fast_environment_class()
    except Exception as exc:  # any failure means: use transformers itself
        _log_once(
            f"compile:{type(exc).__name__}",
            "the chat template cannot be compiled as transformers compiles it (%s: %s)",
            type(exc).__name__,
            exc,
        )
        return None
    settings = {name: getattr(reference, name) for name in _ENVIRONMENT_SETTINGS}
    env = env_class(extensions=[type(e) for e in reference.extensions.values()], **settings)
    env.filters.update(reference.filters)
    if "tojson" in env.filters:
        env.filters["tojson"] = JsonMemo(env.filters["tojson"])
    env.globals.update(reference.globals)
    env.tests.update(reference.tests)
    env.policies.update(reference.policies)
    reserved = frozenset(inspect.signature(tokenizer.apply_chat_template).parameters)
    compiled = _Compiled(env.from_string(source), alias, reserved)
    for tools in (None, _PROBE_TOOLS):
        try:
            want = tokenizer.apply_chat_template(
                _PROBE_MESSAGES,
                tools=tools,
                chat_template=source,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception:  # a template that rejects the probe: no check possible
            continue
        try:
            got = compiled.render(tokenizer, _PROBE_MESSAGES, tools, {})
        except Exception:
            got = None
        if got != want:
            _log_once(
                f"probe:{hash(source)}",
                "the compiled chat template renders a probe conversation differently from "
                "transformers",
            )
            return None
    return compiled


def _compiled_for(tokenizer: PreTrainedTokenizerBase, source: str) -> _Compiled | None:
    try:
        per_tokenizer = _cache[tokenizer]
    except KeyError:
        per_tokenizer = None
    except TypeError:
        return _compile(tokenizer, source)
    if per_tokenizer is not None and source in per_tokenizer:
        return per_tokenizer[source]
    with _cache_lock:
        per_tokenizer = _cache.setdefault(tokenizer, {})
        if source not in per_tokenizer:
            per_tokenizer[source] = _compile(tokenizer, source)
        return per_tokenizer[source]


def _fast_path(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: list[Any] | None,
    chat_template: str | None,
    kwargs: Mapping[str, Any],
) -> _Compiled | None:
    """The compiled template for this call, or None when apply_chat_template must do it."""
    get_template = getattr(tokenizer, "get_chat_template", None)
    if get_template is None or not hasattr(tokenizer, "special_tokens_map"):
        _log_once("tokenizer", "tokenizer %s has no get_chat_template", type(tokenizer).__name__)
        return None
    try:
        source = get_template(chat_template, tools)
    except Exception:  # apply_chat_template raises the same, explained
        return None
    compiled = _compiled_for(tokenizer, source)
    if compiled is None:
        return None
    if tools and any(type(tool) is not dict for tool in tools):
        _log_once("tools", "a tool is not a JSON-schema dict")
        return None
    if any(type(m) is not dict for m in messages):
        _log_once("messages", "a message is not a dict")
        return None
    clash = compiled.reserved.intersection(kwargs)
    if clash:
        _log_once(
            "kwargs", "chat template keywords %s are apply_chat_template's own", sorted(clash)
        )
        return None
    return compiled


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, Any],
) -> str:
    """The chat template's text for ``messages`` with the generation prompt (RenderError)."""
    if not messages:
        raise RenderError("cannot render an empty conversation; expected at least one message")
    tool_list = list(tools) if tools else None
    compiled = None
    if COMPILED:
        compiled = _fast_path(tokenizer, messages, tool_list, chat_template, chat_template_kwargs)
    if compiled is not None:
        try:
            return compiled.render(tokenizer, messages, tool_list, chat_template_kwargs)
        except Exception:  # transformers gives the error (or the text)
            pass
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=tool_list,
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=False,
            **chat_template_kwargs,
        )
    except Exception as exc:
        roles = [m.get("role") for m in messages]
        raise RenderError(
            f"the chat template failed to render {len(messages)} messages (roles {roles}): "
            f"{type(exc).__name__}: {exc}. Check that every message has a role the template "
            "accepts and string content where it expects one"
        ) from exc
    if compiled is not None:
        _log_once("render", "the compiled chat template failed where transformers rendered")
    if not isinstance(text, str):
        raise RenderError(f"the chat template returned {type(text).__name__}, expected str")
    return text
