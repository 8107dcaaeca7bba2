"""The shipped pytest plugin, as a plugin package's test suite gets it: a fresh pytest run.

A pytest run in a temporary directory (no agentrl conftest, plugin autoloading off, only
``-p agentrl.testing.pytest_plugin`` and pytest-asyncio in strict mode) uses every shipped
fixture and runs every Python example of docs/testing.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import agentrl
from agentrl.testing import pytest_plugin

DOCS = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
SOURCE = Path(agentrl.__file__).resolve().parents[1]

#: One test per shipped fixture, each using it through its real protocol.
FIXTURE_TESTS = textwrap.dedent(
    """
    import aiohttp
    import pytest

    from agentrl.sandboxes.e2b import E2BSandbox
    from agentrl.types import Task


    def test_agentrl_registry(agentrl_registry):
        from agentrl import plugins

        assert plugins.get_registry() is agentrl_registry


    def test_agentrl_qwen_tokenizer_dir(agentrl_qwen_tokenizer_dir):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(agentrl_qwen_tokenizer_dir), local_files_only=True)
        assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 151644
        assert "<|im_start|>" in tokenizer.chat_template


    def test_agentrl_qwen_tokenizer(agentrl_qwen_tokenizer):
        ids = agentrl_qwen_tokenizer.encode("def f(): pass")
        assert agentrl_qwen_tokenizer.decode(ids) == "def f(): pass"
        text = agentrl_qwen_tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
        assert text.endswith("<|im_start|>assistant\\n")


    @pytest.mark.asyncio
    async def test_agentrl_scripted_engine(agentrl_scripted_engine):
        agentrl_scripted_engine.queue(ids=[5, 6], finish_reason="length")
        async with aiohttp.ClientSession() as http:
            reply = await http.post(
                agentrl_scripted_engine.url + "/generate",
                json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}},
            )
            body = await reply.json()
        assert body["output_ids"] == [5, 6]
        assert body["meta_info"]["finish_reason"]["type"] == "length"


    @pytest.mark.asyncio
    async def test_agentrl_sglang_engine(agentrl_sglang_engine, agentrl_scripted_engine):
        agentrl_scripted_engine.queue(ids=[7], eos=False)
        generation = await agentrl_sglang_engine.generate([1, 2, 3], {"max_new_tokens": 4})
        assert generation.output_ids == (7,)
        assert agentrl_scripted_engine.generate_requests[0].body["input_ids"] == [1, 2, 3]


    @pytest.mark.asyncio
    async def test_agentrl_middleware(agentrl_middleware, agentrl_scripted_engine):
        token = agentrl_middleware.open_session("s")
        agentrl_scripted_engine.queue("Hello.")
        connector = aiohttp.UnixConnector(path=agentrl_middleware.unix_path)
        async with aiohttp.ClientSession(connector=connector) as http:
            reply = await http.post(
                "http://sandbox/v1/messages",
                json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-api-key": token},
            )
            body = await reply.json()
        assert body["content"] == [{"type": "text", "text": "Hello."}]
        assert agentrl_middleware.trajectory.turn_count("s") == 1
        assert agentrl_middleware.prompt_mode == "splice"


    @pytest.mark.asyncio
    @pytest.mark.parametrize("agentrl_prompt_mode", ["render"])
    async def test_agentrl_prompt_mode(agentrl_prompt_mode, agentrl_middleware):
        assert agentrl_middleware.prompt_mode == agentrl_prompt_mode == "render"


    @pytest.mark.asyncio
    async def test_agentrl_e2b_server(agentrl_e2b_server):
        async with aiohttp.ClientSession() as http:
            reply = await http.post(agentrl_e2b_server.url + "/v2/sandboxes", json={})
        assert reply.status == 401  # no API key
        assert agentrl_e2b_server.request_count == 1


    @pytest.mark.asyncio
    async def test_agentrl_e2b_options(agentrl_e2b_options, agentrl_e2b_server):
        async with E2BSandbox("registry/task:1", **agentrl_e2b_options) as sandbox:
            assert (await sandbox.exec("echo $((6 * 7))")).stdout == "42\\n"
            record = agentrl_e2b_server.sandboxes[sandbox.sandbox_id]
        assert record.metadata["image"] == "registry/task:1" and not record.alive


    @pytest.mark.asyncio
    async def test_agentrl_local_sandboxes(agentrl_local_sandboxes, tmp_path):
        (tmp_path / "repo").mkdir()
        (tmp_path / "repo" / "a.txt").write_text("from the repo\\n")
        task = Task(instance_id="t", problem_statement="", repo=str(tmp_path / "repo"))
        async with agentrl_local_sandboxes(task) as sandbox:
            result = await sandbox.exec("cat a.txt; id -un", user="agent")
        assert result.stdout == "from the repo\\nagent\\n"
        assert agentrl_local_sandboxes.built == [sandbox]
    """
)


def _shipped_fixtures() -> set[str]:
    """The fixture names the plugin module defines."""
    return {name for name in vars(pytest_plugin) if name.startswith("agentrl_")}


def _doc_examples() -> list[str]:
    """Every ```python block of docs/testing.md."""
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)


def _fresh_pytest(directory: Path) -> subprocess.CompletedProcess[str]:
    report = directory / "report.json"
    conftest = "def pytest_terminal_summary(terminalreporter):\n    import json\n"
    conftest += f"    json.dump({{k: len(v) for k, v in terminalreporter.stats.items()}}, open({str(report)!r}, 'w'))\n"
    (directory / "conftest.py").write_text(conftest)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            # pytest-asyncio first: the agentrl plugin imports it, after pytest marks it for
            # assertion rewriting (as autoloading does).
            *("-p", "pytest_asyncio.plugin", "-p", "agentrl.testing.pytest_plugin"),
            *("-o", "asyncio_mode=strict", "-o", "asyncio_default_fixture_loop_scope=function"),
            str(directory),
        ],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_every_fixture_and_every_docs_example_runs_in_a_fresh_pytest(tmp_path):
    """Each shipped fixture has a test here and works in a foreign suite; each docs example passes."""
    used = set(re.findall(r"def test_(agentrl_\w+)\(", FIXTURE_TESTS))
    assert used == _shipped_fixtures(), "every shipped fixture needs a test in FIXTURE_TESTS"
    examples = _doc_examples()
    assert len(examples) >= 4
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_fixtures.py").write_text(FIXTURE_TESTS)
    for index, example in enumerate(examples):
        (suite / f"test_docs_example_{index}.py").write_text(example)
    run = _fresh_pytest(suite)
    counts = json.loads((suite / "report.json").read_text())
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert counts.get("passed") == len(used) + sum(e.count("def test_") for e in examples)
    assert not counts.get("skipped") and not counts.get("warnings"), run.stdout[-2000:]


def test_loading_the_plugin_imports_nothing_heavy():
    """Importing the plugin (what pytest does at start-up) loads no heavy dependency."""
    heavy = ("aiohttp", "transformers", "torch", "e2b", "swebench", "tokenizers", "jinja2")
    code = (
        "import sys, json, agentrl.testing.pytest_plugin\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
