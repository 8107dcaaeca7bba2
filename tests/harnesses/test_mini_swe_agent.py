"""The mini-swe-agent harness: its configuration, and the real CLI in the real local sandbox.

The real CLI is ``mini-swe-agent`` from PyPI, installed by ``agentrl install-clis`` (pip);
the model is the scripted SGLang engine behind the real middleware, reached over the
middleware's unix socket relayed into the sandbox.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from rollout_support import CLI_DIR, SANDBOX_PORT, tool_call

from agentrl import plugins
from agentrl.harnesses.base import HarnessContext
from agentrl.harnesses.install_clis import PINS
from agentrl.harnesses.mini_swe_agent import MiniSweAgentHarness
from agentrl.plugin_options import OptionsError
from agentrl.sandboxes.local import LocalSandbox

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def mini_cli_path() -> str:
    """The installed mini-swe-agent launcher (fails, never skips, when it is missing)."""
    if not (CLI_DIR / "bin" / "mini").exists():
        pytest.fail(
            f"mini-swe-agent is not installed in {CLI_DIR}; run `agentrl install-clis --dest "
            ".cache/clis` (pip, needs PyPI), or set AGENTRL_CLI_DIR to an install holding bin/mini"
        )
    return MiniSweAgentHarness.host_install(CLI_DIR)[1]


def context(**overrides) -> HarnessContext:
    values = {"base_url": "http://127.0.0.1:18001/", "api_key": "tok-mini", "workdir": "/workspace"}
    return HarnessContext(**{**values, **overrides})


def test_mini_swe_agent_is_a_registered_python_harness_with_a_pin():
    """Registered by name, OpenAI Chat; the pin is mini-swe-agent 2.4.6, run as a module."""
    assert plugins.get_harness("mini_swe_agent") is MiniSweAgentHarness
    assert MiniSweAgentHarness.protocol == "openai_chat"
    [pin] = [p for p in PINS if p.binary == "mini"]
    assert (pin.kind, pin.package, pin.default_version) == ("python", "mini-swe-agent", "2.4.6")
    assert pin.module == MiniSweAgentHarness.python_module == "minisweagent"


def test_the_config_points_litellm_at_the_session_and_asks_nothing():
    """litellm's openai provider at the middleware's /v1, yolo with no exit prompt, no cost
    limit or tracking, the step limit; the token only in the environment."""
    harness = MiniSweAgentHarness(step_limit=7, model="policy-x", environ={})
    config = json.loads(harness.config_files(context())[harness.config_path])
    assert config["model"]["model_name"] == "openai/policy-x"
    assert config["model"]["model_kwargs"]["api_base"] == "http://127.0.0.1:18001/v1"
    assert config["model"]["cost_tracking"] == "ignore_errors"
    assert config["agent"] == {
        "mode": "yolo",
        "confirm_exit": False,
        "step_limit": 7,
        "cost_limit": 0,
    }
    assert config["environment"]["cwd"] == "/workspace"
    assert "tok-mini" not in json.dumps(config)
    env = harness.environment(context(), 60)
    assert env["OPENAI_API_KEY"] == "tok-mini" and env["MSWEA_CONFIGURED"] == "true"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert (
        json.loads(harness.config_files(context(model="m2"))[harness.config_path])["model"][
            "model_name"
        ]
        == "openai/m2"
    )


def test_the_prompt_follows_its_option_after_the_extra_arguments():
    """`mini ... EXTRA -t "$(cat prompt)"`: extra arguments cannot separate -t from the task."""
    harness = MiniSweAgentHarness(extra_args=("--cost-limit", "0"), environ={})
    line = harness.shell_command(context())
    assert '--cost-limit 0 -t "$(cat /tmp/agentrl-harness/prompt.txt)"' in line
    assert f"-o {harness.trajectory_path}" in line


def test_templates_and_options_are_validated_fields():
    """Templates replace the base config's; unknown keys and bad limits are refused."""
    harness = MiniSweAgentHarness(system_template="You fix bugs.", environ={})
    agent = json.loads(harness.config_files(context())[harness.config_path])["agent"]
    assert agent["system_template"] == "You fix bugs." and "instance_template" not in agent
    with pytest.raises(OptionsError, match="step_limits"):
        MiniSweAgentHarness.check_options({"step_limits": 3})
    with pytest.raises(ValueError, match="step_limit"):
        MiniSweAgentHarness(step_limit=-1, environ={})


@pytest.mark.slow
def test_the_real_mini_accepts_our_config(tmp_path):
    """The installed mini, given our config files, builds its agent and prints its help."""
    harness = MiniSweAgentHarness(state_dir=str(tmp_path), environ={})
    ctx = context()
    for path, text in harness.config_files(ctx).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **harness.cli_environment(ctx, 60)}
    out = subprocess.run(
        [mini_cli_path(), "--help"], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "--exit-immediately" in out.stdout, out.stderr


@pytest.mark.slow
async def test_mini_edits_a_file_through_the_middleware_in_the_local_sandbox(
    agentrl_middleware, scripted_engine, tmp_path
):
    """mini runs `printf` with its bash tool, then submits; exit 0, the file is there, and the
    session is one sample whose trained tokens are exactly the two engine outputs."""
    cli_path = mini_cli_path()
    binds, _ = MiniSweAgentHarness.host_install(CLI_DIR)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("readme\n")
    token = agentrl_middleware.open_session("mini")
    scripted_engine.queue(
        "I'll create the file.\n" + tool_call("bash", command="printf 'hi\\n' > hello.txt"),
        session="mini",
    )
    scripted_engine.queue("Submitting.\n" + tool_call("bash", command=SUBMIT), session="mini")
    harness = MiniSweAgentHarness(cli_path=cli_path, model_attempts=1, environ={})
    ctx = HarnessContext(
        base_url=f"http://127.0.0.1:{SANDBOX_PORT}", api_key=token, workdir="/workspace"
    )
    services = {SANDBOX_PORT: agentrl_middleware.unix_path}
    async with LocalSandbox(repo=str(repo), ro_binds=binds, services=services) as sandbox:
        await harness.install(sandbox)
        await harness.configure(sandbox, ctx)
        code = await harness.run(sandbox, ctx, "Create a file hello.txt containing hi", 180)
        log = await harness.read_log(sandbox)
        assert code == 0, log[-3000:]
        assert await sandbox.read_file("/workspace/hello.txt") == "hi\n"
        trajectory = json.loads(await sandbox.read_file(harness.trajectory_path))
    assert trajectory["info"]["exit_status"] == "Submitted"
    samples = await agentrl_middleware.finish_session("mini", reward=1.0)
    served = scripted_engine.served
    assert len(served) == 2 and len(samples) == 1
    [sample] = samples
    response = sample.tokens[sample.prompt_length :]
    trained = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
    assert trained == [t for g in served for t in g.output_ids]
