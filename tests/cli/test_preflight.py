"""`agentrl preflight`: scripted sessions on the bundled Qwen3 fixture tokenizer, the table,
the JSON report and the exit code against --min-yield."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from agentrl.cli import cli
from agentrl.preflight import SCENARIOS


def _preflight(*args: str):
    return CliRunner().invoke(cli, ["preflight", *args], catch_exceptions=False)


def test_render_mode_prints_a_table_per_scenario_and_the_yield():
    """The table names each scenario and turn's drift class and the yield per mode; render
    mode trains too little on reasoning with user text, so --min-yield 1.0 exits 1."""
    result = _preflight("--prompt-mode", "render")
    assert result.exit_code == 1, result.output
    for scenario in SCENARIOS:
        assert f"{scenario.name} (render)" in result.output
    for word in ("realign", "clean", "start", "thinking", "yield per scenario"):
        assert word in result.output
    assert "render mode: lowest scenario yield" in result.output
    assert "FAILED" in result.output


def test_render_mode_passes_a_lower_min_yield():
    """The same run passes when --min-yield is under every scenario's yield."""
    result = _preflight("--prompt-mode", "render", "--min-yield", "0.05")
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("ok")


def test_json_report_fields_and_exit_code():
    """--json prints one object: the setup, the checked mode, per mode the totals and per
    scenario and turn the measured fields; exit 1 as soon as one scenario is below."""
    names = ["tools_reasoning", "reasoning_user_text"]
    args = ["--prompt-mode", "render", "--json", "--scenario", names[0], "--scenario", names[1]]
    result = _preflight(*args, "--min-yield", "0.5")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["checked_mode"] == "render" and data["passed"] is False
    assert data["protocol"] == "anthropic" and data["harness"] == "claude_code"
    assert (data["tool_parser"], data["reasoning_parser"]) == ("hermes", "qwen3")
    assert data["tokenizer"]
    render = data["modes"]["render"]
    assert set(render) == {"yield", "trained", "sampled", "lowest", "scenarios"}
    by_name = {s["scenario"]: s for s in render["scenarios"]}
    assert list(by_name) == names
    assert by_name["tools_reasoning"]["yield"] == 1.0
    assert by_name["reasoning_user_text"]["yield"] < 0.5
    assert render["lowest"] == by_name["reasoning_user_text"]["yield"]
    for scenario in by_name.values():
        assert {
            "samples",
            "sample_tokens",
            "final_context_tokens",
            "token_ratio",
            "fallbacks",
        } <= set(scenario)
        for turn in scenario["turns"]:
            assert set(turn) == {
                "turn",
                "agent",
                "drift",
                "sampled",
                "trained",
                "finish",
                "tool_calls",
                "thinking_kept",
                "prompt_mode",
                "fallback",
            }
    passing = _preflight(*args, "--min-yield", "0.1")
    assert passing.exit_code == 0 and json.loads(passing.output)["passed"] is True


def test_codex_harness_speaks_responses():
    """--harness codex drives the OpenAI Responses client."""
    result = _preflight(
        "--harness", "codex", "--prompt-mode", "render", "--json", "--scenario", "subagent"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["protocol"] == "openai_responses" and data["harness"] == "codex"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--harness", "codex", "--protocol", "anthropic"], "not both"),
        (["--protocol", "openai_chat"], "no scripted client"),
        (["--harness", "nope"], "--harness"),
        (["--scenario", "nope"], "choose from tools_reasoning"),
        (["--prompt-mode", "sometimes"], "sometimes"),
        (["--min-yield", "2"], "min-yield"),
        (["--tokenizer", "/nonexistent/tokenizer"], "--tokenizer"),
    ],
)
def test_usage_errors_exit_2(args, message):
    """A bad option is a usage error (exit 2) that says what was wrong."""
    result = CliRunner().invoke(cli, ["preflight", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize("harness", ["claude_code", "codex"])
def test_splice_mode_trains_every_sampled_token(harness):
    """Splice mode (the default) trains every sampled token of every scenario, and a session
    without a fallback is as many samples as conversations, no larger than its context."""
    result = _preflight("--prompt-mode", "splice", "--harness", harness, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["checked_mode"] == "splice" and data["passed"] is True
    splice = data["modes"]["splice"]
    assert splice["yield"] == 1.0 and splice["trained"] == splice["sampled"] > 0
    for scenario in splice["scenarios"]:
        assert scenario["yield"] == 1.0, scenario["scenario"]
        assert all(t["trained"] == t["sampled"] for t in scenario["turns"]), scenario
        # A chain's first turn renders (nothing to extend); every later one splices.
        assert all(
            t["prompt_mode"] == "splice" or t["fallback"] == "new_chain" for t in scenario["turns"]
        ), scenario
        assert scenario["fallbacks"] == 0, scenario
        if not scenario["fallbacks"]:
            conversations = 2 if scenario["scenario"] == "subagent" else 1
            assert scenario["samples"] == conversations, scenario["scenario"]
            assert scenario["token_ratio"] == 1.0, scenario["scenario"]
