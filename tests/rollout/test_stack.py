"""The rollout stack: option checks, plugins treated like built-ins, and shutdown."""

from __future__ import annotations

import pathlib
import tempfile
import types
from types import MappingProxyType
from typing import ClassVar

import attrs
import pytest

from agentrl import hookimpl, plugins
from agentrl.engines.base import Engine, Generation
from agentrl.harnesses.claude_code import ClaudeCodeHarness
from agentrl.plugins import NotAvailableError
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.stack import Stack, StackError, StackOptions, merge_sandbox_options
from agentrl.sandboxes.base import Sandbox
from agentrl.types import Task


def test_impossible_options_fail_before_anything_starts():
    """Each combination that cannot work names the flag to pass."""
    with pytest.raises(StackError, match="--engine sglang needs --engine-url"):
        Stack(StackOptions(tokenizer="/tok"))
    with pytest.raises(StackError, match="--engine transformers needs --model-path"):
        Stack(StackOptions(engine="transformers", tokenizer="/tok"))
    with pytest.raises(StackError, match="--public-host"):
        Stack(StackOptions(sandbox="e2b", engine_url="http://e", tokenizer="/tok"))


def test_merge_unions_mapping_options():
    """Mapping-valued sandbox options (binds, env) are unioned; other values are replaced."""
    merged = merge_sandbox_options(
        {"ro_binds": {"/a": "/a"}, "env": {"X": "1"}, "memory": 1},
        {"ro_binds": {"/b": "/b"}, "env": {"X": "2"}, "memory": 2},
    )
    assert merged == {"ro_binds": {"/a": "/a", "/b": "/b"}, "env": {"X": "2"}, "memory": 2}


def _exists(path: str) -> bool:
    return pathlib.Path(path).exists()


async def test_aclose_closes_everything_even_when_a_step_fails():
    """A middleware that fails to close still lets the engine close and the socket dir go."""
    closed = []

    class Middleware:
        async def close(self):
            closed.append("middleware")
            raise RuntimeError("close failed")

    class Engine:
        async def aclose(self):
            closed.append("engine")

    stack = Stack(StackOptions(engine_url="http://127.0.0.1:9", tokenizer="/tok"))
    stack.middleware, stack.engine = Middleware(), Engine()
    stack._tmp = tempfile.TemporaryDirectory(prefix="agentrl-test-")
    socket_dir = stack._tmp.name
    with pytest.raises(RuntimeError, match="close failed"):
        await stack.aclose()
    assert closed == ["middleware", "engine"]
    assert not _exists(socket_dir)
    await stack.aclose()  # idempotent: nothing left to close
    assert closed == ["middleware", "engine"]


@pytest.fixture
def registry():
    """The built-in plugins in a registry of this test's own, without entry points."""
    reg = plugins.PluginRegistry(load_entrypoints=False, disabled=())
    previous = plugins.reset_registry(reg)
    yield reg
    plugins.reset_registry(previous)


def _register(registry, hook: str, *classes: type) -> None:
    module = types.ModuleType(f"third_party_{hook}")

    def register_classes(register):
        for cls in classes:
            register(cls)

    register_classes.__name__ = hook
    setattr(module, hook, hookimpl(register_classes))
    registry.pm.register(module)


def _options(**kw):
    return StackOptions(engine_url="http://127.0.0.1:9", tokenizer="/tok", **kw)


def test_unknown_option_keys_are_an_error_listing_the_valid_keys():
    """A misspelt sandbox, harness or engine option fails the check; the valid keys pass."""
    with pytest.raises(StackError) as info:
        _options(sandbox_options={"memroy_mb": 512}).check()
    message = str(info.value)
    assert message.startswith("--sandbox-options: the 'local' sandbox has no option 'memroy_mb'")
    assert "did you mean 'memory_mb'?" in message and "pids" in message
    with pytest.raises(StackError, match=r"--harness-options: the 'codex' harness .* 'cli_pat'"):
        _options(harness="codex", harness_options={"cli_pat": "/x"}).check()
    with pytest.raises(StackError, match=r"engine options: the 'sglang' engine .* 'url'"):
        _options(engine_options={"url": "http://other"}).check()
    e2b = {"sandbox": "e2b", "public_host": "10.0.0.1"}
    with pytest.raises(StackError, match=r"'e2b' sandbox has no option 'templat'.*'template'"):
        _options(sandbox_options={"templat": "base"}, **e2b).check()
    # Valid keys of each pass: local, e2b (its E2BOptions fields), harness fields, engine.
    _options(sandbox_options={"memory_mb": 512, "env": {"A": "1"}, "ro_binds": {}}).check()
    _options(sandbox="e2b", public_host="h", sandbox_options={"template": "t", "size": "m"}).check()
    _options(harness_options={"cli_path": "/x", "extra_args": ["--max-turns", "5"]}).check()
    _options(engine_options={"sock_read_timeout": 30.0}).check()


def test_task_fields_are_not_sandbox_options():
    """``workdir`` comes from the task: as a sandbox option it would clash, so it is refused."""
    with pytest.raises(StackError, match="no option 'workdir'"):
        _options(sandbox_options={"workdir": "/elsewhere"}).check()


def test_third_party_classes_that_declare_nothing(registry):
    """Plugin options are checked against the constructor; **kwargs or no contract: unchecked."""

    class ExplicitSandbox(Sandbox):
        name = "explicit"

        def __init__(self, *, workdir: str = "/workspace", flavour: str = "plain") -> None:
            self.workdir, self.flavour = workdir, flavour

    class OpenSandbox(Sandbox):
        name = "open"

        def __init__(self, **options) -> None:
            self.options = options

    class DuckSandbox:
        """No Sandbox base class: nothing to ask."""

        name = "duck"

    _register(registry, "register_sandboxes", ExplicitSandbox, OpenSandbox, DuckSandbox)
    socket = {"unix_path": "/tmp/agentrl-test.sock"}
    _options(sandbox="explicit", sandbox_options={"flavour": "spicy"}, **socket).check()
    with pytest.raises(StackError, match=r"'explicit' sandbox has no option 'colour'.*flavour"):
        _options(sandbox="explicit", sandbox_options={"colour": "red"}, **socket).check()
    _options(sandbox="open", sandbox_options={"anything": 1}, **socket).check()
    _options(sandbox="duck", sandbox_options={"anything": 1}, **socket).check()


def test_an_unknown_plugin_name_is_a_plugin_error():
    """Checking option keys looks the plugins up, so a bad name fails there, listing the names."""
    with pytest.raises(NotAvailableError, match="codex"):
        _options(harness="nope").check()


async def test_e2b_without_an_image_or_template_fails_before_any_rollout(qwen_tokenizer_dir):
    """A task without an image and no template: one error naming the task, not a boot per job."""
    options = StackOptions(
        sandbox="e2b",
        public_host="127.0.0.1",
        engine_url="http://127.0.0.1:9",
        tokenizer=str(qwen_tokenizer_dir),
        sandbox_options={"environ": {}, "image_metadata_key": "image"},
    )
    async with Stack(options) as stack:
        stack.check_tasks([Task(instance_id="routed", problem_statement="x", image="py:3.12")])
        with pytest.raises(StackError) as info:
            stack.check_tasks(
                [
                    Task(instance_id="routed", problem_statement="x", image="py:3.12"),
                    Task(instance_id="bare", problem_statement="x"),
                ]
            )
    message = str(info.value)
    assert message.startswith("task 'bare' cannot run in the 'e2b' sandbox: ")
    assert "needs an image" in message and "template" in message


async def test_local_tasks_whose_repository_is_missing_fail_before_any_rollout(
    tmp_path, qwen_tokenizer_dir
):
    """Missing repositories are counted and named, with the first reason."""
    options = StackOptions(
        engine_url="http://127.0.0.1:9", tokenizer=str(qwen_tokenizer_dir), cli_dir=None
    )
    tasks = [
        Task(instance_id=f"t{i}", problem_statement="x", repo=str(tmp_path / f"gone{i}"))
        for i in range(2)
    ]
    async with Stack(options) as stack:
        with pytest.raises(StackError) as info:
            stack.check_tasks([Task(instance_id="ok", problem_statement="x"), *tasks])
    message = str(info.value)
    assert message.startswith("2 of 3 tasks cannot run in the 'local' sandbox (t0, t1); ")
    assert "the first, 't0': the task's repo" in message and "does not exist" in message


async def test_a_harness_whose_cli_is_not_installed_fails_before_any_rollout(
    registry, qwen_tokenizer_dir
):
    """Local sandbox on the host's root, no --cli-dir, no such binary here: one harness error."""

    @attrs.define(kw_only=True)
    class MissingCLIHarness(ClaudeCodeHarness):
        name: ClassVar[str] = "missing-cli"
        binary: ClassVar[str] = "agentrl-test-no-such-cli"

    _register(registry, "register_harnesses", MissingCLIHarness)
    options = StackOptions(
        harness="missing-cli",
        engine_url="http://127.0.0.1:9",
        tokenizer=str(qwen_tokenizer_dir),
    )
    task = Task(instance_id="t", problem_statement="x")
    async with Stack(options) as stack:
        with pytest.raises(StackError, match="no agentrl-test-no-such-cli CLI installed"):
            stack.check_tasks([task])
    with_cli_path = attrs.evolve(options, harness_options={"cli_path": "/opt/cli"})
    async with Stack(with_cli_path) as stack:
        stack.check_tasks([task])  # an install source of its own: nothing to tell here


class WeightsFileEngine(Engine):
    """A plugin engine run from a local weights file: it declares ``model_path`` its location."""

    name = "weights-file"
    location = "model_path"
    location_hint = "a weights file"

    def __init__(self, model_path: str, *, threads: int = 1) -> None:
        self.model_path, self.threads = model_path, threads

    async def generate(self, input_ids, sampling_params, *, rid=None, routing_key=None):
        return Generation(output_ids=(), logprobs=())


class NoNetworkSandbox(Sandbox):
    """A plugin backend with no network of its own that binds the host's Python its own way."""

    name = "no-network"
    reaches_middleware_over_unix_socket = True
    with_host_python = MappingProxyType({"python_from_host": True})

    def __init__(
        self, *, workdir="/workspace", services=None, python_from_host=False, ro_binds=None
    ):
        self.workdir, self.services = workdir, dict(services or {})
        self.python_from_host = python_from_host

    @classmethod
    def from_task(cls, task, **options):
        return cls(workdir=task.workdir, **options)

    async def start(self):
        raise NotImplementedError

    async def aclose(self):
        pass

    async def exec(self, cmd, **kwargs):
        raise NotImplementedError

    async def write_file(self, path, content, **kwargs):
        raise NotImplementedError

    async def read_file(self, path, **kwargs):
        raise NotImplementedError

    def url_for(self, host, port):
        return f"http://{host}:{port}"


def test_a_plugin_engine_names_what_it_needs_like_the_built_ins(registry):
    """The engine's own ``location`` decides which flag is missing; its options are checked."""
    _register(registry, "register_engines", WeightsFileEngine)
    bare = StackOptions(engine="weights-file", tokenizer="/tok")
    with pytest.raises(StackError, match=r"^--engine weights-file needs --model-path \(a weights"):
        bare.check()
    with pytest.raises(StackError, match=r"engine options: .* 'weights-file' engine .* 'thread'"):
        attrs.evolve(bare, model_path="/w", engine_options={"thread": 2}).check()
    attrs.evolve(bare, model_path="/w", engine_options={"threads": 2}).check()


async def test_a_plugin_engine_and_socket_only_sandbox_are_built_through_their_contracts(
    registry, qwen_tokenizer_dir
):
    """A started stack builds the plugin engine with ``from_options``, serves a socket-only
    plugin sandbox over a unix socket without --public-host, and passes its host-Python
    options; the typed rollout config gets the middleware's address inside the sandbox."""
    _register(registry, "register_engines", WeightsFileEngine)
    _register(registry, "register_sandboxes", NoNetworkSandbox)
    options = StackOptions(
        engine="weights-file",
        model_path="/w",
        engine_options={"threads": 3},
        sandbox="no-network",
        tokenizer=str(qwen_tokenizer_dir),
        rollout={"eval_timeout": 42},
    )
    assert options.over_unix_socket
    async with Stack(options) as stack:
        assert isinstance(stack.engine, WeightsFileEngine)
        assert (stack.engine.model_path, stack.engine.threads) == ("/w", 3)
        sandbox = stack.sandbox_factory(Task(instance_id="t", problem_statement="x"))
        assert sandbox.python_from_host
        assert sandbox.services == {options.sandbox_port: stack.middleware.unix_path}
        config = stack.rollout_config
        assert (config.middleware_host, config.middleware_port) == ("127.0.0.1", 18001)
        assert config.eval_timeout == 42
    async with Stack(attrs.evolve(options, host_python=False)) as stack:
        sandbox = stack.sandbox_factory(Task(instance_id="t", problem_statement="x"))
        assert not sandbox.python_from_host


def test_rollout_options_are_a_typed_rollout_config():
    """``rollout`` takes a RolloutConfig or a mapping of its fields (what the CLIs pass); a
    misspelt field, one the stack fills itself or a refused value is a StackError."""
    assert _options().rollout is None
    given = _options(rollout={"agent_time_budget": 60.0, "eval_timeout": 30.0}).rollout
    assert given == RolloutConfig(agent_time_budget=60.0, eval_timeout=30.0)
    assert _options(rollout=given).rollout is given
    with pytest.raises(StackError, match=r"rollout options: .*'eval_timout' \(did you mean"):
        _options(rollout={"eval_timout": 30.0})
    with pytest.raises(StackError, match=r"rollout options: .*'middleware_port'"):
        _options(rollout={"middleware_port": 1})
    with pytest.raises(
        StackError, match=r"rollout options: RolloutConfig\.eval_timeout must be > 0"
    ):
        _options(rollout={"eval_timeout": 0})


@pytest.mark.parametrize("mode", ["splice", "render"])
async def test_the_stack_builds_its_middleware_in_the_chosen_prompt_mode(qwen_tokenizer_dir, mode):
    """``StackOptions.prompt_mode`` reaches the middleware (``splice`` by default)."""
    options = StackOptions(engine_url="http://127.0.0.1:9", tokenizer=str(qwen_tokenizer_dir))
    assert options.prompt_mode == "splice"
    async with Stack(attrs.evolve(options, prompt_mode=mode)) as stack:
        assert stack.middleware.prompt_mode == mode


async def test_a_callers_engine_instance_is_served_as_it_is(qwen_tokenizer_dir):
    """``engine_instance`` (a trainer's own client) is the middleware's engine; the engine
    name is not looked up, and more than one worker process is refused."""
    engine = WeightsFileEngine("/not/looked/up")
    options = StackOptions(
        engine="a-trainers-client", engine_instance=engine, tokenizer=str(qwen_tokenizer_dir)
    )
    async with Stack(options) as stack:
        assert stack.engine is engine and stack.middleware.engine is engine
    with pytest.raises(StackError, match="workers=2: a caller's engine is served by one process"):
        Stack(attrs.evolve(options, workers=2))


async def test_closing_an_e2b_stack_sweeps_only_its_own_leftovers(qwen_tokenizer_dir):
    """Each stack labels its sandboxes with a run id of its own; closing it kills the one
    it left alive (a lost create answer, a crash) and spares another stack's live one.
    Against the E2B double, which speaks the SDK's wire protocol."""
    from agentrl.testing.e2b_server import E2BServer

    async with E2BServer(api_key="k") as server:
        target = {"api_key": "k", "api_url": server.url, "sandbox_url": server.url}

        def options() -> StackOptions:
            return StackOptions(
                sandbox="e2b",
                public_host="127.0.0.1",
                engine_url="http://127.0.0.1:9",
                tokenizer=str(qwen_tokenizer_dir),
                sandbox_options={**target, "environ": {}, "template": "base"},
            )

        task = Task(instance_id="t", problem_statement="x")
        async with Stack(options()) as other:
            spared = other.sandbox_factory(task)
            await spared.start()
            async with Stack(options()) as stack:
                assert stack.sandbox_options["run_id"] != other.sandbox_options["run_id"]
                left = stack.sandbox_factory(task)
                await left.start()  # never closed
            live = {record.sandbox_id for record in server.live_sandboxes()}
            assert live == {spared.sandbox_id}
            await spared.aclose()


def test_workers_need_an_engine_served_over_http():
    """More than one middleware worker with the in-process transformers engine, or fewer
    than one, fails before anything starts."""
    with pytest.raises(StackError, match="cannot be shared by worker processes"):
        Stack(StackOptions(engine="transformers", model_path="/m", tokenizer="/tok", workers=2))
    with pytest.raises(StackError, match="--workers: expected >= 1"):
        Stack(StackOptions(engine_url="http://e", tokenizer="/tok", workers=0))


@pytest.mark.slow
async def test_a_stack_with_two_workers_serves_through_a_sharded_middleware(qwen_tokenizer_dir):
    """``StackOptions.workers=2`` starts two worker processes behind the stack's socket, its
    recipe carries the stack's options, and closing the stack stops them."""
    from shard_support import alive

    from agentrl.serve.shards import ShardedMiddleware

    options = StackOptions(
        engine_url="http://127.0.0.1:9",
        tokenizer=str(qwen_tokenizer_dir),
        prompt_mode="render",
        workers=2,
    )
    async with Stack(options) as stack:
        assert isinstance(stack.middleware, ShardedMiddleware)
        assert stack.middleware.workers == 2 and len(stack.middleware.pids) == 2
        assert stack.middleware.build.prompt_mode == "render"
        assert stack.engine is None  # each worker has its own engine client
        pids = stack.middleware.pids
    assert not any(alive(pid) for pid in pids)
