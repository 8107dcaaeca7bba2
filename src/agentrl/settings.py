"""Every environment variable agentrl reads, in one table, and the one reader for them.

Each ``Setting`` names its variable, the older names still accepted (slime's ``SWE_*``,
``SLIME_AGENT_*`` and ``ADAPTER_*``, the E2B SDK's ``E2B_*``), its type, default and help.
``get(name, env)`` reads one: the first of the name and its aliases that holds a non-blank
value wins (the ``AGENTRL_*`` name over every alias, aliases in the order listed); a blank
value counts as unset; the value is parsed by type, and a malformed one raises
``SettingsError`` naming the variable and the value. Nothing is read at import time.

``python -m agentrl.settings_doc --markdown`` prints the table that docs/settings.md holds;
``--write docs/settings.md`` refreshes it in place.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "SETTINGS",
    "TYPES",
    "Setting",
    "SettingsError",
    "Value",
    "chain",
    "get",
    "setting",
]

logger = logging.getLogger(__name__)

#: What ``get`` returns: the parsed value, or the default (often None: unset).
Value = str | int | float | bool | pathlib.Path | tuple[str, ...] | dict[str, object] | None

#: The value types a setting can have, and how each is written in the environment.
TYPES: dict[str, str] = {
    "str": "text (surrounding whitespace is dropped)",
    "int": "an integer",
    "float": "a number (seconds, for the `_SEC`/timeout/budget names)",
    "bool": "`1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`",
    "path": "a host path",
    "list": "comma-separated names or paths",
    "json": "a JSON object",
    "args": 'CLI arguments: a JSON list (`["--max-turns", "50"]`) or a shell-quoted line',
    "env": 'a JSON object of environment variables (`{"KEY": "value"}`)',
}
_CHECKS = {"positive": "> 0", "non_negative": "≥ 0"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_MARKERS = ("<!-- settings-table:start -->", "<!-- settings-table:end -->")


class SettingsError(ValueError):
    """An environment variable holds a value agentrl cannot use; the message names both."""


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


@attrs.frozen(kw_only=True)
class Setting:
    """One environment variable: its names, type, default, help and the packages reading it.

    ``check`` (``positive`` / ``non_negative``) rejects out-of-range numbers;
    ``zero_is_unset`` makes ``0`` mean "unset" (slime's convention for derived values);
    ``fallback`` names another setting whose value is used while this one is unset;
    ``default_doc`` describes a default the reader computes itself; ``alias_offset`` is
    added to a number read from an alias (not from ``name``), for an older name that counts
    differently (slime's RPC retries count attempts, agentrl's count re-sends: ``-1``).
    """

    name: str
    type: str = attrs.field(validator=attrs.validators.in_(TYPES))
    help: str
    readers: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    default: Value = None
    default_doc: str | None = None
    check: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(_CHECKS))
    )
    zero_is_unset: bool = False
    fallback: str | None = None
    alias_offset: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        """The name, then its aliases: the order in which they are consulted."""
        return (self.name, *self.aliases)

    def lookup(self, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
        """``(variable, stripped value)`` of the first non-blank name, or None when unset."""
        environ = os.environ if env is None else env
        found = [(n, environ[n].strip()) for n in self.names if (environ.get(n) or "").strip()]
        if not found:
            return None
        source, raw = found[0]
        for other, value in found[1:]:
            if not self._agree(source, raw, other, value):
                logger.warning(
                    "%s=%r and %s=%r disagree; using %s", source, raw, other, value, source
                )
        return source, raw

    def _agree(self, source: str, raw: str, other: str, value: str) -> bool:
        # With an alias_offset the name and an alias agree when they mean the same number.
        if not self.alias_offset or (source == self.name) == (other == self.name):
            return value == raw
        try:
            return _parse(self, source, raw) == _parse(self, other, value)
        except SettingsError:
            return False

    def read(self, env: Mapping[str, str] | None = None, default: Value | _Unset = _UNSET) -> Value:
        """The parsed value; while unset, the fallback setting's, else ``default``."""
        found = self.lookup(env)
        value = None if found is None else _parse(self, *found)
        if value is not None and self.zero_is_unset and value == 0:
            value = None
        if value is not None:
            return value
        if self.fallback is not None:
            return get(self.fallback, env, default=default)
        return self.default if isinstance(default, _Unset) else default


def _parse(s: Setting, source: str, raw: str) -> Value:
    kind = s.type
    if kind in ("int", "float"):
        try:
            number: int | float = int(raw) if kind == "int" else float(raw)
        except ValueError:
            what = "an integer" if kind == "int" else "a number"
            raise SettingsError(
                f"{source}={raw!r} is not {what}; set it to {what} or unset it ({s.help})"
            ) from None
        shifted = s.alias_offset if source != s.name else 0
        number += shifted
        if (s.check == "positive" and number <= 0) or (s.check == "non_negative" and number < 0):
            origin = "" if source == s.name else f" (from {source})"
            if shifted:
                origin = f" (from {source}, where {raw} means {number:g} here)"
            raise SettingsError(
                f"{s.name} must be {s.check.replace('_', '-')}, got {raw!r}{origin} ({s.help})"
            )
        return number
    if kind == "bool":
        if raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise SettingsError(f"{source}={raw!r} is not a boolean; set it to 1 or 0 ({s.help})")
    if kind == "path":
        return pathlib.Path(raw)
    if kind == "list":
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind == "args":
        return _parse_args(source, raw)
    if kind in ("json", "env"):
        return _parse_object(s, source, raw)
    return raw


def _parse_args(source: str, raw: str) -> tuple[str, ...]:
    example = f'{source}=\'["--max-turns", "50"]\''
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise SettingsError(
                f"{source}={raw[:200]!r} is not a valid command line ({exc}); set it like {example}"
            ) from None
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise SettingsError(
            f"{source} must be a JSON list of strings, got {raw[:200]!r}; set it like {example}"
        )
    return tuple(str(v) for v in value)


def _parse_object(s: Setting, source: str, raw: str) -> dict[str, object]:
    if s.type == "env":
        example = f'{source}=\'{{"BASH_DEFAULT_TIMEOUT_MS": "600000"}}\''
        expected = "a JSON object of environment variables"
    else:
        example, expected = f'{source}=\'{{"key": "value"}}\'', "a JSON object"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"{source} is not valid JSON ({exc}); set it to {expected} such as {example} ({s.help})"
        ) from None
    if not isinstance(value, dict):
        raise SettingsError(
            f"{source} must be {expected}, got {type(value).__name__}; set it like {example}"
        )
    if s.type == "env":
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
    return value


def _s(name: str, type: str, readers: str, **more: Any) -> Setting:
    return Setting(name=name, type=type, readers=tuple(readers.split()), **more)


_PLUGINS, _TOK, _LOCAL = "agentrl.plugins", "agentrl.tokenizers", "agentrl.sandboxes.local"
_HARN, _SBX, _E2B = "agentrl.harnesses", "agentrl.sandboxes", "agentrl.sandboxes.e2b"


def _cli(version_var: str, title: str, prefix: str, binary: str) -> tuple[Setting, ...]:
    """A harness CLI's pin override and its extra arguments and environment."""
    return (
        _s(version_var, "str", _HARN, default_doc="the pinned version",
           help=f"{title} version agentrl install-clis installs"),
        _s(f"AGENTRL_{prefix}_EXTRA_ARGS", "args", _HARN, default=(),
           help=f"extra {binary} command-line arguments"),
        _s(f"AGENTRL_{prefix}_EXTRA_ENV", "env", _HARN, default_doc="`{}`",
           help=f"extra environment for the {binary} CLI"),
    )  # fmt: skip


_GRD, _RO, _SL = "agentrl.graders", "agentrl.rollout", "agentrl.slime"
_OBS = "agentrl.observers"

#: Every environment variable agentrl reads (test doubles' own under agentrl.testing aside).
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    _s("AGENTRL_DISABLE_PLUGINS", "list", _PLUGINS, default=(),
       help="plugins not to load: entry-point names, or built-in modules such as agentrl.graders"),
    _s("AGENTRL_TRACE_PLUGINS", "bool", _PLUGINS, default=False,
       help="log every hook call, its arguments and the plugins it reaches (logger "
            "agentrl.plugins, INFO)"),
    _s("AGENTRL_TRACK", "list", _OBS, default=(),
       help="experiment trackers every rollout is logged to: wandb, tensorboard (what "
            "agentrl rollout --track takes; read inside slime too)"),
    _s("AGENTRL_TRACK_DIR", "path", _OBS,
       default_doc="`agentrl rollout`: its `--out` directory; elsewhere the working directory",
       help="where trackers write: DIR/wandb/ (W&B), DIR/tensorboard/RUN/ (TensorBoard)"),
    _s("AGENTRL_TRACK_PROJECT", "str", _OBS, default="agentrl",
       help="the W&B project the runs are logged to"),
    _s("AGENTRL_CACHE_DIR", "path", f"{_TOK} {_LOCAL}",
       default_doc="`~/.cache/agentrl` (images: `$XDG_CACHE_HOME/agentrl` when that is set)",
       help="agentrl's cache: generated tokenizers, demo models, installed CLIs (clis/), "
            "extracted sandbox images (images/)"),
    _s("AGENTRL_CLI_DIR", "path", _HARN,
       default_doc="`.cache/clis` here or in the checkout, else `$AGENTRL_CACHE_DIR/clis`",
       help="host install of the agent CLIs (agentrl install-clis --dest), searched first"),
    _s("CLAUDE_CODE_VERSION", "str", _HARN, default_doc="the pinned version",
       help="Claude Code version agentrl install-clis installs"),
    _s("CLAUDE_CODE_NODE18_VERSION", "str", _HARN, default_doc="the pinned version",
       help="second Claude Code version install-clis installs, for Node 18 images (linked as "
            "claude-VERSION)"),
    _s("CODEX_VERSION", "str", _HARN, default_doc="the pinned version",
       help="Codex version agentrl install-clis installs"),
    *_cli("QWEN_CODE_VERSION", "Qwen Code", "QWEN_CODE", "qwen"),
    *_cli("OPENCODE_VERSION", "opencode", "OPENCODE", "opencode"),
    *_cli("MINI_SWE_AGENT_VERSION", "mini-swe-agent", "MINI_SWE_AGENT", "mini"),
    _s("AGENTRL_CLAUDE_CODE_EXTRA_ARGS", "args", _HARN, aliases=("SLIME_AGENT_CC_EXTRA_ARGS",),
       default=(),
       help="extra claude command-line arguments"),
    _s("AGENTRL_CLAUDE_CODE_EXTRA_ENV", "env", _HARN, aliases=("SLIME_AGENT_CC_EXTRA_ENVS",),
       default_doc="`{}`",
       help="extra environment for the claude CLI"),
    _s("AGENTRL_CODEX_EXTRA_ARGS", "args", _HARN, aliases=("SLIME_AGENT_CODEX_EXTRA_ARGS",),
       default=(),
       help="extra codex exec command-line arguments"),
    _s("AGENTRL_CODEX_EXTRA_ENV", "env", _HARN,
       aliases=("SLIME_AGENT_CODEX_EXTRA_ENVS", "SLIME_AGENT_CODEX_EXTRA_ENV"), default_doc="`{}`",
       help="extra environment for the codex CLI"),
    _s("AGENTRL_SANDBOX_MAX_OUTPUT_BYTES", "int", _SBX, default=1 << 20,
       help="bytes kept from each stream of one exec (at least 64); the middle of a longer "
            "output is cut"),
    _s("AGENTRL_DOCKER_HOST", "str", "agentrl.sandboxes.docker", aliases=("DOCKER_HOST",),
       default_doc="`unix:///var/run/docker.sock`",
       help="the Docker daemon the `docker` sandbox talks to (`unix://PATH` or `tcp://HOST:PORT`)"),
    _s("AGENTRL_DOCKER_BASE_IMAGE", "str", "agentrl.sandboxes.docker",
       help="the image of a `docker` sandbox whose task names none (`default_image`)"),
    _s("AGENTRL_DOCKER_WORKSPACE_MB", "int", "agentrl.sandboxes.docker", check="non_negative",
       default_doc="2048, at most half of `memory_mb`",
       help="the size limit of a `docker` sandbox's workspace in MiB (`workspace_size_mb`): "
            "a memory-backed filesystem, counted in the container's memory; a write past it "
            "fails with ENOSPC. 0: no limit (a volume on the daemon's disk)"),
    _s("AGENTRL_E2B_API_KEY", "str", _E2B, aliases=("E2B_API_KEY",),
       help="E2B API key"),
    _s("AGENTRL_E2B_DOMAIN", "str", _E2B, aliases=("E2B_DOMAIN",), default_doc="the SDK's",
       help="E2B domain of a self-hosted cluster"),
    _s("AGENTRL_E2B_API_URL", "str", _E2B, aliases=("E2B_API_URL",), default_doc="the SDK's",
       help="E2B API URL"),
    _s("AGENTRL_E2B_SANDBOX_URL", "str", _E2B, aliases=("E2B_SANDBOX_URL",),
       default_doc="the SDK's",
       help="E2B sandbox (envd) URL"),
    _s("AGENTRL_E2B_TEMPLATE", "str", _E2B,
       help="E2B template for tasks without an image"),
    _s("AGENTRL_E2B_IMAGE_METADATA_KEY", "str", _E2B,
       aliases=("SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY", "SWE_SANDBOX_IMAGE_METADATA_KEY"),
       help="creation-metadata key the E2B gateway routes images by (required with an image; "
            "often 'image')"),
    _s("AGENTRL_E2B_SIZE", "str", _E2B,
       aliases=("SLIME_AGENT_E2B_SANDBOX_SIZE", "SWE_E2B_SANDBOX_SIZE"),
       help="sandbox size, sent next to the image key (a/image -> a/size)"),
    _s("AGENTRL_E2B_LIFETIME_SEC", "int", _E2B,
       aliases=("SLIME_AGENT_SANDBOX_LIFETIME_SEC", "SWE_SANDBOX_LIFETIME_SEC"),
       default=3600, check="positive",
       help="seconds an E2B sandbox lives"),
    # slime's names count attempts: its E2BSandbox._rpc_retry loops
    # `for attempt in range(self.rpc_retries)` (slime/agent/sandbox.py, THUDM/slime 624b824a8),
    # so slime's value N is N - 1 re-sends here (its default 6 is our default 5).
    _s("AGENTRL_E2B_RPC_RETRIES", "int", _E2B,
       aliases=("SLIME_AGENT_SANDBOX_RPC_RETRIES", "SWE_RPC_RETRIES"), alias_offset=-1,
       default=5, check="non_negative",
       help="re-sends of an idempotent E2B call after a transient failure (the slime names "
            "count attempts, first one included: their value minus 1)"),
    _s("AGENTRL_E2B_BACKOFF_BASE_SEC", "float", _E2B, default=1.0, check="non_negative",
       help="first retry backoff ceiling (doubles per attempt, full jitter)"),
    _s("AGENTRL_E2B_BACKOFF_CAP_SEC", "float", _E2B, default=32.0, check="non_negative",
       help="largest retry backoff ceiling"),
    _s("AGENTRL_E2B_REQUEST_TIMEOUT_SEC", "float", _E2B, default=60.0, check="positive",
       help="timeout of one E2B API request"),
    _s("AGENTRL_E2B_OWNER", "str", _E2B, default_doc="this host's name",
       help="deployment label on every E2B sandbox (metadata agentrl-owner); the stale sweep "
            "kills only sandboxes with this label"),
    _s("AGENTRL_E2B_SWEEP_STALE", "bool", _E2B, default=False,
       help="before the first E2B creation, kill this deployment's sandboxes left by an "
            "earlier run whose process is gone"),
    _s("AGENTRL_TRAIN_GRADER", "str", f"{_GRD} {_SL}",
       aliases=("AGENTRL_TRAIN_PROTOCOL", "SWE_TRAIN_PROTOCOL"), default="scaleswe",
       default_doc="`scaleswe` (`auto` for check-tasks)",
       help="grader plugin for training rollouts (scaleswe, swebench, auto, …)"),
    _s("AGENTRL_EVAL_GRADER", "str", f"{_GRD} {_SL}",
       aliases=("AGENTRL_EVAL_PROTOCOL", "SWE_EVAL_PROTOCOL"),
       default_doc="slime: the training grader; else `scaleswe` (`auto` for check-tasks)",
       help="grader plugin for evaluation rollouts (slime, agentrl rollout --eval, check-tasks "
            "--eval)"),
    _s("AGENTRL_GRADE_TIMEOUT", "float", _GRD, check="positive", fallback="AGENTRL_EVAL_TIMEOUT",
       help="seconds a grading run (the tests) may take"),
    _s("AGENTRL_AGENT_TIME_BUDGET", "float", f"{_RO} {_SL}", aliases=("SWE_AGENT_TIME_BUDGET_SEC",),
       default=1800.0, check="positive",
       help="seconds the agent CLI may run (then it is killed: a timeout)"),
    _s("AGENTRL_EVAL_TIMEOUT", "float", f"{_RO} {_SL}", aliases=("SWE_EVAL_TIMEOUT_SEC",),
       default=600.0, check="positive",
       help="seconds grading may take"),
    _s("AGENTRL_ROLLOUT_GUARD", "float", f"{_RO} {_SL}", aliases=("SWE_ROLLOUT_GUARD_SEC",),
       default_doc="agent budget + 2 × eval timeout + 180", check="non_negative", zero_is_unset=True,
       help="wall-clock cap on a whole rollout (0: derive it)"),
    # slime's example counts boot attempts too: `for attempt in range(CONFIG.boot_retries)`
    # (examples/coding_agent_rl/generate.py, THUDM/slime 624b824a8).
    _s("AGENTRL_BOOT_RETRIES", "int", f"{_RO} {_SL}", aliases=("SWE_BOOT_RETRIES",),
       alias_offset=-1, default=2, check="non_negative",
       help="boot retries after a failed first attempt (then the rollout is an infra failure; "
            "SWE_BOOT_RETRIES counts attempts, first one included: its value minus 1)"),
    _s("AGENTRL_MAX_CONTEXT_TOKENS", "int", _RO, default=0,
       help="the rollout's context budget in tokens (0: none)"),
    _s("AGENTRL_MAX_TURNS", "int", f"{_RO} {_SL}",
       help="model calls one rollout may make before the middleware answers 429"),
    _s("AGENTRL_PROMPT_TEMPLATE", "str", f"{_RO} {_SL}", aliases=("SWE_CC_PROMPT",),
       default_doc="`agentrl.rollout.DEFAULT_PROMPT`",
       help="the agent's task prompt; {problem_statement}, {workdir}, {problem_file} and "
            "{instance_id} are filled in"),
    _s("AGENTRL_HARNESS", "str", _SL, aliases=("SWE_AGENT",), default="claude_code",
       help="agent harness plugin (claude_code, codex, …)"),
    _s("AGENTRL_SANDBOX", "str", _SL, default="e2b",
       help="sandbox plugin the agent and the grader run in (e2b, local, …)"),
    _s("AGENTRL_PUBLIC_HOST", "str", _SL, aliases=("ADAPTER_PUBLIC_HOST",),
       default_doc="required for network sandboxes",
       help="host name or IP the sandboxes dial back to reach the middleware ('auto': this "
            "node's own address)"),
    _s("AGENTRL_BIND_HOST", "str", _SL, aliases=("ADAPTER_BIND_HOST",), default="0.0.0.0",
       help="address the middleware listens on"),
    _s("AGENTRL_PORT", "int", _SL, aliases=("ADAPTER_PORT",), default=18001, check="non_negative",
       help="TCP port the middleware listens on (0: any free port)"),
    _s("AGENTRL_UNIX_SOCKET", "str", _SL,
       help="serve the middleware on this unix socket instead of TCP (local sandboxes)"),
    _s("AGENTRL_BOOT_CONCURRENCY", "int", _SL, aliases=("SWE_BOOT_CONCURRENCY",), default=16,
       check="positive",
       help="sandboxes booting at once in this process"),
    _s("AGENTRL_MIDDLEWARE_WORKERS", "int", _SL, default=1, check="positive",
       help="middleware worker processes (sessions sharded across them by token, each sticky "
            "to one); 1 serves in the rollout process"),
    _s("AGENTRL_PROMPT_MODE", "str", _SL, default="splice",
       help="how the middleware makes each prompt: splice (extend the chain's exact ids with "
            "the new messages) or render (render the whole conversation every turn)"),
    _s("AGENTRL_MAX_ENGINE_ABORTS", "int", _SL, default=8, check="non_negative",
       help="engine aborts in a row (a weight update, slime's abort) that fail a model call "
            "with a 503; each one before is continued from what was sampled (0: an aborted "
            "generation reaches the agent as it is)"),
    _s("AGENTRL_FORK_THRESHOLD_TOKENS", "int", _SL,
       aliases=("SLIME_FORK_MERGE_MAX_RESPONSE_TOKENS",), default=1024, check="non_negative",
       help="a drift inside a response shorter than this is realigned, longer forks"),
    _s("AGENTRL_TASKS_DIR", "path", _SL, default_doc="the rollout process's working directory",
       help="directory relative host paths in task rows (metadata.repo, gold patches, swepro "
            "scripts) are resolved against"),
    _s("AGENTRL_CLI_PATH", "str", _SL,
       help="the agent CLI's executable as the sandbox sees it (skips installing it)"),
    _s("AGENTRL_CLI_TARBALLS", "list", _SL, default=(),
       help="host paths of the agent CLI's npm tarballs (installed in the sandbox), for "
            "whichever harness runs; else the harness's own variable below"),
    _s("AGENTRL_CLAUDE_CODE_TARBALLS", "list", _SL, aliases=("SLIME_AGENT_CC_TARBALL",),
       default=(),
       help="Claude Code's npm tarballs, used only by the claude_code harness"),
    _s("AGENTRL_CODEX_TARBALLS", "list", _SL, aliases=("SLIME_AGENT_CODEX_TARBALL",),
       default=(),
       help="Codex's npm tarballs, used only by the codex harness"),
    _s("AGENTRL_NODE_TARBALL", "str", _SL, aliases=("SLIME_AGENT_NODE_TARBALL",),
       help="host path of a Node.js linux-x64 tarball, for sandboxes without node"),
    _s("AGENTRL_MODEL", "str", _SL,
       help="model name the agent CLI is told to use (any name; the middleware serves it)"),
    _s("AGENTRL_SANDBOX_OPTIONS", "json", _SL, default_doc="`{}`",
       help="keyword options for the sandbox backend's from_task"),
    _s("AGENTRL_ABORT_POLL_SEC", "float", _SL, default=0.5, check="positive",
       help="how often a rollout checks whether slime is aborting the batch"),
    _s("AGENTRL_ABORT_DRAIN_SEC", "float", _SL, default=30.0, check="positive",
       help="seconds an aborted rollout waits for its session to close before returning"),
)
# fmt: on
_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    """The table's entry for ``name`` (an ``AGENTRL_*`` name, not an alias)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"{name!r} is not in agentrl.settings.SETTINGS; add a Setting for it there"
        ) from None


def get(
    name: str, env: Mapping[str, str] | None = None, *, default: Value | _Unset = _UNSET
) -> Value:
    """The typed value of setting ``name`` read from ``env`` (default: ``os.environ``).

    While unset (or blank) it is ``default`` if given, else the table's default. A malformed
    value raises ``SettingsError`` naming the variable and the value.
    """
    return setting(name).read(env, default)


def chain(names: Sequence[str], type: str) -> Setting:
    """The setting read from ``names`` in order: the table's when it lists exactly these
    names, else an ad hoc one (a plugin's own variables) of ``type``."""
    known = _BY_NAME.get(names[0])
    if known is not None and known.names == tuple(names):
        return known
    return Setting(name=names[0], aliases=tuple(names[1:]), type=type, help=names[0], readers=())
