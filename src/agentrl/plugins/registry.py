"""The plugin registry: one pluggy manager holding the built-ins and the entry points.

Core code never calls ``pm.hook.*`` directly; it asks this module for typed things
(``get_sandbox("local")``) and gets either the class or an error that lists the choices.

An entry-point plugin whose module fails to import is recorded and warned about, not
raised: every command that does not need it keeps working, ``agentrl plugins`` lists it
with its error, and a lookup of a name it might have provided says it failed to load.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import pluggy

from agentrl import hookspecs, settings
from agentrl.extras import install_hint

logger = logging.getLogger("agentrl.plugins")

ENTRY_POINT_GROUP = "agentrl"

#: In-package plugin modules; each is registered exactly as an entry point would be.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "agentrl.engines",
    "agentrl.parsers",
    "agentrl.adapters",
    "agentrl.sandboxes",
    "agentrl.harnesses",
    "agentrl.graders",
    "agentrl.cli.commands",
)

#: kind -> the hook that fills it.
KIND_HOOKS: dict[str, str] = {
    "engine": "register_engines",
    "adapter": "register_adapters",
    "sandbox": "register_sandboxes",
    "harness": "register_harnesses",
    "grader": "register_graders",
    "tool_parser": "register_parsers",
    "reasoning_parser": "register_parsers",
}
KINDS: tuple[str, ...] = tuple(KIND_HOOKS)

#: Names that an optional extra provides, so "not available" can say what to install.
KNOWN_EXTRAS: dict[tuple[str, str], str] = {
    ("sandbox", "docker"): "docker",
    ("sandbox", "e2b"): "e2b",
    ("grader", "swebench"): "swebench",
    ("engine", "transformers"): "hf",
}

_PARSER_TYPES = {"tool_call": "tool_parser", "reasoning": "reasoning_parser"}
_PARSER_KINDS = sorted(_PARSER_TYPES.values())
#: How SGLang's own parsers are registered (``agentrl.parsers.sglang``): ``sglang:<name>``.
SGLANG_PREFIX = "sglang:"


class PluginError(Exception):
    """A plugin is missing, duplicated or broken; the message names it and says what to do."""


class NotAvailableError(PluginError, LookupError):
    """The requested plugin name is not registered."""


@attrs.frozen(kw_only=True)
class PluginInfo:
    """One registered plugin and what it contributed."""

    name: str
    distribution: str | None
    version: str | None
    builtin: bool
    registered: dict[str, tuple[str, ...]]
    #: Why the plugin failed to load (it registered nothing), or ``None``.
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "builtin": self.builtin,
            "registered": {kind: list(names) for kind, names in self.registered.items()},
            "error": self.error,
        }


@attrs.frozen(kw_only=True)
class PluginLoadFailure:
    """An ``agentrl`` entry point whose module could not be imported."""

    #: The entry point's name: what ``AGENTRL_DISABLE_PLUGINS`` takes.
    name: str
    #: What it points at (``module`` or ``module:attribute``).
    value: str
    distribution: str | None
    version: str | None
    #: The exception's one-line summary, e.g. ``ImportError: No module named 'docker'``.
    error: str

    def describe(self) -> str:
        """One line naming the entry point, its distribution and the error."""
        where = f"entry point {self.name} = {self.value}"
        if self.distribution:
            where += f" in {self.distribution} {self.version or ''}".rstrip()
        return f"plugin {self.name!r} ({where}) failed to load: {self.error}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _kind_of(hook_name: str, cls: type) -> str:
    if hook_name != "register_parsers":
        return next(kind for kind, hook in KIND_HOOKS.items() if hook == hook_name)
    parser_type = getattr(cls, "parser_type", None)
    try:
        return _PARSER_TYPES[parser_type]
    except KeyError:
        raise PluginError(
            f"parser class {cls.__qualname__} has parser_type={parser_type!r}; "
            f"expected one of {sorted(_PARSER_TYPES)}"
        ) from None


def _sglang_hint(registry: dict[str, type], name: str) -> str:
    """Why SGLang's parser of this name is not there either, and what to do about it."""
    bare = name.removeprefix(SGLANG_PREFIX)
    if any(known.startswith(SGLANG_PREFIX) for known in registry):
        return (
            f". SGLang's parsers are loaded, but SGLang has no parser named {bare!r} either "
            "(its names are the sglang:<name> entries above)"
        )
    return (
        f". {bare!r} is not a built-in parser and SGLang's parser modules are not importable, "
        f"so SGLang's parser of that name cannot be used: install SGLang ({install_hint('sglang')}"
        "; or only its parser modules, as `make test-sglang` does: pip install --no-deps "
        "--target DIR sglang plus its parser dependencies, with DIR on PYTHONPATH). With "
        f"SGLang importable, {bare!r} and 'sglang:{bare}' resolve to SGLang's parser"
    )


def _log_call(hook_name: str, kwargs: dict[str, Any], plugin_names: list[str]) -> None:
    arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    logger.info("hook %s(%s) -> %s", hook_name, arguments, plugin_names)


def _entry_point_name(plugin: object) -> str:
    """The ``agentrl`` entry-point name that loads ``plugin`` (what blocking takes)."""
    module = getattr(plugin, "__name__", None)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.value.split(":")[0] == module:
            return ep.name
    return module or repr(plugin)


def _agentrl_version() -> str | None:
    try:
        return importlib.metadata.version("agentrl")
    except importlib.metadata.PackageNotFoundError:
        return None


def disabled_plugins(env: dict[str, str] | None = None) -> set[str]:
    """Plugin names blocked by ``AGENTRL_DISABLE_PLUGINS`` (comma separated)."""
    return set(settings.get("AGENTRL_DISABLE_PLUGINS", env))


class PluginRegistry:
    """A pluggy manager plus the typed registries it fills."""

    def __init__(
        self,
        *,
        builtins: Iterable[str] = BUILTIN_PLUGINS,
        load_entrypoints: bool = True,
        disabled: Iterable[str] | None = None,
        trace: bool | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager("agentrl")
        self.pm.add_hookspecs(hookspecs)
        blocked = disabled_plugins() if disabled is None else set(disabled)
        for name in blocked:
            self.pm.set_blocked(name)
        self._trace = trace if trace is not None else bool(settings.get("AGENTRL_TRACE_PLUGINS"))
        if self._trace:
            self._enable_tracing()
        self._builtin_names: set[str] = set()
        self._distributions: dict[str, importlib.metadata.Distribution] = {}
        #: Entry points whose module failed to import, by entry-point name.
        self.failures: dict[str, PluginLoadFailure] = {}
        try:
            for module_name in builtins:
                if self.pm.is_blocked(module_name):
                    continue
                module = __import__(module_name, fromlist=["_"])
                self.pm.register(module, name=module_name)
                self._builtin_names.add(module_name)
            if load_entrypoints:
                self._load_entry_points()
            self.pm.check_pending()  # a hook implementation whose name matches no hook
        except pluggy.PluginValidationError as exc:
            name = self.pm.get_name(exc.plugin) or _entry_point_name(exc.plugin)
            raise PluginError(
                f"{exc}. Fix the plugin {name!r} (hook names and arguments are in "
                f"docs/plugins.md) or block it with AGENTRL_DISABLE_PLUGINS={name}"
            ) from exc
        self._classes: dict[str, dict[str, type]] | None = None
        self._owners: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def _load_entry_points(self) -> None:
        """Register every ``agentrl`` entry point that is not blocked, as pluggy would.

        pluggy's ``load_setuptools_entrypoints`` stops at the first module that fails to
        import; here such a plugin is recorded in ``failures`` and warned about once, and
        the others still load.
        """
        for dist in list(importlib.metadata.distributions()):
            for ep in dist.entry_points:
                if (
                    ep.group != ENTRY_POINT_GROUP
                    or self.pm.has_plugin(ep.name)
                    or self.pm.is_blocked(ep.name)
                    or ep.name in self.failures
                ):
                    continue
                try:
                    plugin = ep.load()
                except Exception as exc:
                    self._failed_to_load(ep, dist, exc)
                    continue
                self.pm.register(plugin, name=ep.name)
                self._distributions[ep.name] = dist

    def _failed_to_load(
        self,
        ep: importlib.metadata.EntryPoint,
        dist: importlib.metadata.Distribution,
        exc: Exception,
    ) -> None:
        failure = PluginLoadFailure(
            name=ep.name,
            value=ep.value,
            distribution=dist.metadata["Name"],
            version=dist.version,
            error=_one_line(exc),
        )
        self.failures[ep.name] = failure
        logger.warning(
            "agentrl: %s; what it provides is unavailable, everything else works. "
            "Fix or uninstall %s, or disable it with AGENTRL_DISABLE_PLUGINS=%s",
            failure.describe(),
            failure.distribution or "it",
            failure.name,
        )
        logger.debug("plugin %r import traceback", ep.name, exc_info=exc)

    # -- calling hooks -----------------------------------------------------
    def _enable_tracing(self) -> None:
        def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
            _log_call(hook_name, kwargs, [impl.plugin_name for impl in impls])

        def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
            exc = outcome.exception
            if exc is not None:
                logger.info("hook %s raised %r", hook_name, exc)

        self.pm.add_hookcall_monitoring(before, after)

    def _each_impl(self, hook_name: str) -> Iterator[Any]:
        """The implementations of ``hook_name`` in pluggy's call order, to call one by one.

        Calling each on its own attributes what it does to its plugin and keeps one failing
        implementation from stopping the others; ``_call`` traces like a pluggy hook call.
        """
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} implements {hook_name} as a wrapper; agentrl "
                    f"calls each {hook_name} implementation on its own, so drop its "
                    "wrapper/hookwrapper option"
                )
            yield impl

    def _call(self, hook_name: str, impl: Any, kwargs: dict[str, Any]) -> Any:
        if self._trace:
            _log_call(hook_name, kwargs, [impl.plugin_name])
        return impl.function(*(kwargs[arg] for arg in impl.argnames))

    # -- registries ------------------------------------------------------
    def plugin_name(self, plugin: object) -> str:
        return self.pm.get_name(plugin) or repr(plugin)

    def _collect(self) -> dict[str, dict[str, type]]:
        with self._lock:
            if self._classes is not None:
                return self._classes
            classes: dict[str, dict[str, type]] = {kind: {} for kind in KINDS}
            owners: dict[tuple[str, str], str] = {}
            for hook_name in dict.fromkeys(KIND_HOOKS.values()):
                current: list[str] = []

                def register(cls: type, _hook: str = hook_name, _cur: list[str] = current) -> None:
                    name = getattr(cls, "name", None)
                    if not isinstance(name, str) or not name:
                        raise PluginError(
                            f"plugin {_cur[0]!r} registered {cls!r} through {_hook} "
                            "without a non-empty string `name` attribute"
                        )
                    kind = _kind_of(_hook, cls)
                    if name in classes[kind]:
                        raise PluginError(
                            f"{kind} {name!r} is registered twice: by plugin "
                            f"{owners[(kind, name)]!r} and by plugin {_cur[0]!r}; "
                            "disable one with AGENTRL_DISABLE_PLUGINS"
                        )
                    classes[kind][name] = cls
                    owners[(kind, name)] = _cur[0]

                for impl in self._each_impl(hook_name):
                    current[:] = [impl.plugin_name]
                    try:
                        self._call(hook_name, impl, {"register": register})
                    except PluginError:
                        raise
                    except Exception as exc:
                        raise PluginError(
                            f"plugin {impl.plugin_name!r} failed in {hook_name}: {exc!r}"
                        ) from exc
            self._classes, self._owners = classes, owners
            return classes

    def available(self, kind: str) -> list[str]:
        """Registered names of one kind, sorted."""
        return sorted(self._registry(kind))

    def registered(self, kind: str) -> list[type]:
        """Registered classes of one kind, in the order their hooks ran (plugins first)."""
        return list(self._registry(kind).values())

    def _registry(self, kind: str) -> dict[str, type]:
        if kind not in KIND_HOOKS:
            raise ValueError(f"unknown plugin kind {kind!r}; expected one of {list(KINDS)}")
        return self._collect()[kind]

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name`` for ``kind``, or a helpful error."""
        registry = self._registry(kind)
        try:
            return registry[name]
        except KeyError:
            pass
        raise NotAvailableError(self._missing(kind, name))

    def get_parser(self, kind: str, name: str) -> type:
        """A tool-call or reasoning parser by name, SGLang's parser names included.

        In order: the parser registered as ``name`` (a built-in, a plugin's, or an explicit
        ``sglang:<name>``); a registered parser that lists ``name`` in its
        ``sglang_equivalents`` (proven to read like SGLang's parser of that name, so
        ``deepseek-r1`` is the built-in ``deepseek_r1``); SGLang's own parser of that name
        (``sglang:<name>``, registered when SGLang's parser modules import). Otherwise
        ``NotAvailableError`` listing what is registered and saying how to get SGLang's.
        """
        if kind not in _PARSER_TYPES.values():
            raise ValueError(f"{kind!r} is not a parser kind; expected one of {_PARSER_KINDS}")
        registry = self._registry(kind)
        if name in registry:
            return registry[name]
        for cls in registry.values():
            if name in getattr(cls, "sglang_equivalents", ()):
                return cls
        sglang = registry.get(SGLANG_PREFIX + name)
        if sglang is not None:
            return sglang
        raise NotAvailableError(self._missing(kind, name) + _sglang_hint(registry, name))

    def _missing(self, kind: str, name: str) -> str:
        registry = self._registry(kind)
        choices = ", ".join(sorted(registry)) or "none"
        message = (
            f"{kind.replace('_', ' ')} {name!r} is not available (plugin may not be installed); "
            f"available: {choices}"
        )
        extra = KNOWN_EXTRAS.get((kind, name))
        if extra:
            message += f". Install it with: {install_hint(extra)}"
        blocked = disabled_plugins()
        if blocked:
            message += f". Disabled by AGENTRL_DISABLE_PLUGINS: {', '.join(sorted(blocked))}"
        if self.failures:
            failed = ", ".join(f"{f.name!r} ({f.error})" for f in self.failures.values())
            message += (
                f". These plugins failed to load and may provide it: {failed}; "
                "`agentrl plugins` shows them"
            )
        return message

    def owner(self, kind: str, name: str) -> str:
        self._collect()
        return self._owners[(kind, name)]

    def plugins(self) -> list[PluginInfo]:
        """Every registered plugin with its distribution, version and contributions."""
        self._collect()
        dists = self._distributions
        infos = [
            PluginInfo(
                name=failure.name,
                distribution=failure.distribution,
                version=failure.version,
                builtin=False,
                registered={},
                error=failure.error,
            )
            for failure in self.failures.values()
        ]
        for plugin in self.pm.get_plugins():
            name = self.plugin_name(plugin)
            builtin = name in self._builtin_names
            dist = dists.get(name)
            registered: dict[str, list[str]] = {}
            for (kind, cls_name), owner in sorted(self._owners.items()):
                if owner == name:
                    registered.setdefault(kind, []).append(cls_name)
            infos.append(
                PluginInfo(
                    name=name,
                    distribution="agentrl"
                    if builtin
                    else (dist.metadata["Name"] if dist else None),
                    version=_agentrl_version() if builtin else (dist.version if dist else None),
                    builtin=builtin,
                    registered={k: tuple(v) for k, v in registered.items()},
                )
            )
        return sorted(infos, key=lambda info: (not info.builtin, info.name))

    def notify(self, hook_name: str, event: Any) -> None:
        """Send an event to every observer of a hook; a failing observer is logged, never raised.

        Each observer is called on its own, so one that raises does not keep the event from
        the others.
        """
        try:
            impls = list(self._each_impl(hook_name))
        except PluginError:
            logger.exception("observer hook %s cannot be called", hook_name)
            return
        for impl in impls:
            try:
                self._call(hook_name, impl, {"event": event})
            except Exception:
                logger.exception(
                    "observer hook %s failed in plugin %r for %r",
                    hook_name,
                    impl.plugin_name,
                    event,
                )

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def add_commands(self, cli: Any) -> None:
        """Let every plugin add its commands to the click group ``cli`` (``register_commands``)."""
        self.pm.hook.register_commands(cli=cli)
