"""A plugin harness whose agent is a Python script run by the image's own ``python3``.

The plugin states ``install_kind = "image"`` and ``binary = "python3"``; its agent script
travels as one of its config files, and talks to the middleware over OpenAI Chat
Completions with nothing but urllib. ``agentrl rollout --sandbox docker`` runs it end to
end: no host install of python3 is looked for, no wrapper, the real middleware and a
scripted engine, the example task graded in a fresh container.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import ClassVar

import attrs
import pytest
from click.testing import CliRunner
from rollout_support import BUGGY, FIXED, example_task_file

from agentrl import hookimpl, plugins
from agentrl.cli import cli
from agentrl.harnesses.base import Harness, HarnessContext
from agentrl.plugins import PluginRegistry

pytestmark = pytest.mark.slow

#: A whole (if tiny) coding agent: one chat turn, one edit the model names, exit 0.
AGENT = """\
import json, os, sys, urllib.request

prompt = sys.argv[-1]
body = {"model": "policy", "messages": [{"role": "user", "content": prompt}]}
request = urllib.request.Request(
    os.environ["TINY_AGENT_BASE_URL"] + "/v1/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["TINY_AGENT_KEY"],
             "Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=600) as response:
    reply = json.load(response)
edit = json.loads(reply["choices"][0]["message"]["content"])
with open(edit["path"]) as handle:
    text = handle.read()
if edit["old"] not in text:
    sys.exit("the text to replace is not in " + edit["path"])
with open(edit["path"], "w") as handle:
    handle.write(text.replace(edit["old"], edit["new"], 1))
print("edited", edit["path"])
"""


@attrs.define(kw_only=True)
class OneEditAgentHarness(Harness):
    """``python3 {state_dir}/one_edit_agent.py PROMPT``, python3 being the image's."""

    name: ClassVar[str] = "one_edit_agent"
    protocol: ClassVar[str] = "openai_chat"
    binary: ClassVar[str] = "python3"
    install_kind: ClassVar[str] = "image"
    min_version: ClassVar[str | None] = "3.8"

    @property
    def script(self) -> str:
        return f"{self.state_dir}/one_edit_agent.py"

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {self.script: AGENT}

    def command(self, ctx: HarnessContext) -> list[str]:
        return [self.script]

    def cli_environment(self, ctx: HarnessContext, time_budget: float) -> dict[str, str]:
        return {"TINY_AGENT_BASE_URL": ctx.base_url.rstrip("/"), "TINY_AGENT_KEY": ctx.api_key}


class OneEditAgentPlugin:
    """The plugin module a third party would ship (registered in-process here)."""

    @hookimpl
    def register_harnesses(self, register):
        register(OneEditAgentHarness)


def read_outputs(out: pathlib.Path) -> tuple[dict, str, str, list[dict]]:
    """The one rollout row of ``agentrl rollout --out OUT``, its diff, its log, its samples."""
    [rollout] = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    diff = pathlib.Path(rollout["diff_path"]).read_text()
    log = pathlib.Path(rollout["agent_log_path"]).read_text()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return rollout, diff, log, samples


@pytest.fixture
def one_edit_agent_plugin():
    registry = PluginRegistry(load_entrypoints=False, disabled=())
    registry.pm.register(OneEditAgentPlugin(), name="one-edit-agent")
    previous = plugins.reset_registry(registry)
    yield
    plugins.reset_registry(previous)


async def test_a_python_agent_from_the_image_solves_the_example_task_in_docker(
    one_edit_agent_plugin,
    docker_options,
    scripted_engine,
    qwen_tokenizer_dir,
    tmp_path,
    monkeypatch,
):
    """``agentrl rollout --harness one_edit_agent --sandbox docker`` with no --cli-dir and no CLI
    install anywhere: the image's python3 runs the script, one chat turn edits the file,
    reward 1.0, and the one sample trains exactly the sampled tokens."""
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AGENTRL_CLI_DIR", str(tmp_path / "no-clis"))
    monkeypatch.chdir(tmp_path)
    edit = {"path": "textstats/core.py", "old": BUGGY, "new": FIXED}
    scripted_engine.queue(json.dumps(edit))
    out = tmp_path / "out"
    options = {k: v for k, v in docker_options.items() if k != "run_id"}
    args = [
        "rollout",
        str(example_task_file(tmp_path)),
        "--harness",
        "one_edit_agent",
        "--sandbox",
        "docker",
        "--sandbox-options",
        json.dumps(options),
        "--engine-url",
        scripted_engine.url,
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--agent-time-budget",
        "180",
        "--out",
        str(out),
    ]
    # The command runs its own event loop; the scripted engine keeps serving on this one.
    result = await asyncio.to_thread(CliRunner().invoke, cli, args)
    assert result.exit_code == 0, (result.output, result.exception)
    rollout, diff, log, [sample] = read_outputs(out)
    assert (rollout["outcome"], rollout["reward"], rollout["turns"]) == ("solved", 1.0, 1), rollout
    assert "+    for token in text.split():" in diff
    assert "edited textstats/core.py" in log
    [served] = scripted_engine.served
    response = sample["tokens"][sample["prompt_length"] :]
    assert [t for t, m in zip(response, sample["loss_mask"], strict=True) if m] == list(
        served.output_ids
    )
