"""``agentrl preflight``: scripted agent sessions through the real middleware, before GPU hours.

Runs every scenario of :mod:`agentrl.preflight.scenarios` (reasoning, tool calls, user
text, parallel calls, whitespace, re-ordered replays, a sub-agent, ``length`` cuts) over
the wire protocol of a harness, with the given tokenizer's chat template and parsers, in
each prompt mode; prints per turn the drift class, tokens trained / sampled, tool-call
parsing and whether thinking was kept, then the yield per mode. Exit 1 when a scenario's
yield in the checked mode is below ``--min-yield``, 2 on a usage error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from agentrl.cli.options import parser_options

if TYPE_CHECKING:
    from agentrl.preflight import SessionReport

__all__ = ["preflight_command"]

_MODES = ("splice", "render", "both")
_DRIFT_STYLES = {"start": "cyan", "clean": "green", "realign": "yellow", "fork": "magenta"}


def _protocol(harness: str | None, protocol: str | None) -> tuple[str, str | None]:
    """The wire protocol to speak (and the harness it came from), or a usage error."""
    from agentrl import plugins
    from agentrl.preflight.clients import CLIENTS

    if harness and protocol:
        raise click.UsageError("give --harness or --protocol, not both")
    if not protocol:
        harness = harness or "claude_code"
        try:
            protocol = plugins.get_harness(harness).protocol
        except plugins.NotAvailableError as exc:
            raise click.UsageError(f"--harness: {exc}") from None
    if protocol not in CLIENTS:
        where = f"harness {harness!r} speaks {protocol!r}, which" if harness else f"{protocol!r}"
        raise click.UsageError(
            f"{where} has no scripted client; preflight speaks {', '.join(sorted(CLIENTS))}"
        )
    return protocol, harness


def _tokenizer(path: str | None) -> tuple[Any, str]:
    from agentrl.tokenizers import TokenizerError, load_tokenizer, qwen_tokenizer_dir

    try:
        directory = str(path or qwen_tokenizer_dir())
        return load_tokenizer(directory), directory
    except (TokenizerError, OSError, ValueError) as exc:
        raise click.UsageError(f"--tokenizer: {exc}") from None


def _scenarios(names: Sequence[str]) -> list[Any]:
    from agentrl.preflight import SCENARIOS, scenario_named

    try:
        return [scenario_named(name) for name in names] if names else list(SCENARIOS)
    except KeyError as exc:
        raise click.UsageError(f"--scenario: {exc.args[0]}") from None


def _totals(reports: Sequence[SessionReport]) -> dict[str, Any]:
    trained = sum(r.trained for r in reports)
    sampled = sum(r.sampled for r in reports)
    return {
        "yield": trained / sampled if sampled else 1.0,
        "trained": trained,
        "sampled": sampled,
        "lowest": min((r.token_yield for r in reports), default=1.0),
    }


def _print_tables(results: Mapping[str, Sequence[SessionReport]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    for mode, reports in results.items():
        for report in reports:
            table = Table(
                title=f"{escape(report.scenario)} ({mode}): {escape(report.description)}",
                caption=(
                    f"yield {report.trained}/{report.sampled} = {100 * report.token_yield:.1f}%, "
                    f"{report.samples} sample(s), {report.sample_tokens} sample tokens for a "
                    f"final context of {report.final_context_tokens} "
                    f"(x{report.token_ratio:.2f})"
                ),
            )
            for column in ("turn", "agent", "drift", "trained", "finish", "tool calls"):
                table.add_column(column)
            table.add_column("thinking kept")
            table.add_column("fallback")
            for turn in report.turns:
                style = _DRIFT_STYLES.get(turn.drift, "red")
                table.add_row(
                    str(turn.turn),
                    turn.agent,
                    f"[{style}]{turn.drift}[/]",
                    f"{turn.trained}/{turn.sampled}",
                    turn.finish,
                    escape(turn.tool_calls),
                    turn.thinking_kept,
                    escape(turn.fallback or "-"),
                )
            console.print(table)
    summary = Table(title="yield per scenario")
    summary.add_column("scenario")
    for mode in results:
        summary.add_column(f"{mode} yield", justify="right")
        summary.add_column(f"{mode} samples (tokens / context)", justify="right")
    names = [r.scenario for r in next(iter(results.values()), [])]
    for index, name in enumerate(names):
        cells = [escape(name)]
        for reports in results.values():
            r = reports[index]
            cells += [
                f"{100 * r.token_yield:.1f}%",
                f"{r.samples} ({r.sample_tokens} / {r.final_context_tokens})",
            ]
        summary.add_row(*cells)
    console.print(summary)
    for mode, reports in results.items():
        totals = _totals(reports)
        console.print(
            f"{mode}: yield {totals['trained']}/{totals['sampled']} = "
            f"{100 * totals['yield']:.1f}% (lowest scenario {100 * totals['lowest']:.1f}%)"
        )


@click.command("preflight")
@click.option(
    "--tokenizer",
    "tokenizer_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Tokenizer directory with the chat template "
    "[default: the bundled Qwen3 fixture tokenizer].",
)
@parser_options(reasoning_default="qwen3")
@click.option(
    "--harness", default=None, help="Speak this harness's protocol [default: claude_code]."
)
@click.option(
    "--protocol",
    default=None,
    help="Speak this wire protocol instead (anthropic, openai_responses).",
)
@click.option(
    "--prompt-mode",
    type=click.Choice(_MODES),
    default="both",
    show_default=True,
    help="The middleware's prompt mode(s) to run; 'both' checks splice.",
)
@click.option(
    "--min-yield",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="Exit 1 when a scenario trains less than this share of its sampled tokens "
    "in the checked mode.",
)
@click.option(
    "--scenario",
    "scenario_names",
    multiple=True,
    help="Run only this scenario (repeatable) [default: all].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def preflight_command(
    tokenizer_dir: str | None,
    tool_parser: str,
    reasoning_parser: str,
    harness: str | None,
    protocol: str | None,
    prompt_mode: str,
    min_yield: float,
    scenario_names: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run scripted agent sessions through the middleware and report the training yield.

    Run it before spending GPU hours: a yield under 100% means sampled tokens would not
    train (the chat template, parsers or client drift from what the policy sampled).
    """
    import json

    from agentrl.preflight import PreflightError, run_preflight

    wire, harness = _protocol(harness, protocol)
    scenarios = _scenarios(scenario_names)
    tokenizer, directory = _tokenizer(tokenizer_dir)
    modes = ("splice", "render") if prompt_mode == "both" else (prompt_mode,)
    checked = "splice" if prompt_mode == "both" else prompt_mode
    try:
        results = run_preflight(
            tokenizer,
            protocol=wire,
            modes=modes,
            scenarios=scenarios,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
        )
    except PreflightError as exc:
        raise click.ClickException(str(exc)) from None
    lowest = _totals(results[checked])["lowest"]
    passed = lowest >= min_yield
    if as_json:
        data = {
            "tokenizer": directory,
            "harness": harness,
            "protocol": wire,
            "tool_parser": tool_parser,
            "reasoning_parser": reasoning_parser,
            "checked_mode": checked,
            "min_yield": min_yield,
            "passed": passed,
            "modes": {
                mode: {**_totals(reports), "scenarios": [r.to_dict() for r in reports]}
                for mode, reports in results.items()
            },
        }
        click.echo(json.dumps(data, indent=2))
    else:
        _print_tables(results)
        verdict = "ok" if passed else "FAILED"
        click.echo(
            f"{checked} mode: lowest scenario yield {100 * lowest:.1f}% "
            f"(--min-yield {100 * min_yield:.1f}%): {verdict}"
        )
    if not passed:
        raise SystemExit(1)
