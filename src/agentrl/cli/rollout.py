"""``agentrl rollout``: many rollouts from task files, with progress, resumable outputs and a summary."""

from __future__ import annotations

import asyncio
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import click

from agentrl import plugins
from agentrl.cli.images import rollout_tasks
from agentrl.cli.options import (
    PluginName,
    json_object_option,
    load_task_files,
    parser_options,
    prompt_mode_option,
    track_from,
    track_options,
    workers_option,
)
from agentrl.harnesses.install_clis import find_cli_dir
from agentrl.plugins import PluginError
from agentrl.rollout.runner import RETRIED_OUTCOMES, Runner, RunSummary
from agentrl.rollout.stack import Stack, StackError, StackOptions
from agentrl.tokenizers import TokenizerError
from agentrl.types import Task
from agentrl.wording import count

__all__ = [
    "find_cli_dir",
    "print_summary",
    "rollout_command",
    "run_stack",
    "run_with_progress",
]


def _default_cli_dir(harness: str, harness_options: str | None = None) -> str | None:
    """The host CLI install for ``harness``: agentrl's own, else its npm binary on PATH.

    None when the harness needs none: its CLI comes from the image (``install_kind
    "image"``), or ``--harness-options`` gives it ``cli_path`` or ``tarballs``.
    """
    from agentrl.harnesses.errors import HarnessError
    from agentrl.harnesses.kinds import install_kind

    try:
        harness_cls = plugins.get_harness(harness)
    except PluginError:
        harness_cls = None  # an unknown harness is reported with the other option checks
    given = json_object_option(harness_options, "--harness-options")
    if given.get("cli_path") or given.get("tarballs"):
        return None
    kind = install_kind(harness_cls) if harness_cls is not None else "npm"
    try:
        found = find_cli_dir(getattr(harness_cls, "binary", None), kind)
    except HarnessError as exc:
        raise click.ClickException(str(exc)) from None
    return str(found) if found is not None else None


def print_summary(summary: RunSummary, out_dir: pathlib.Path, *, evaluation: bool) -> None:
    """The end-of-run table: solve rate, outcome counts, turns, tokens, time per phase."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    data = summary.to_dict()
    table = Table(title=f"agentrl {'evaluation' if evaluation else 'rollout'} summary")
    table.add_column("metric")
    table.add_column("value", justify="right")

    def fmt(value: Any, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    table.add_row("rollouts this run", str(data["rollouts"]))
    table.add_row("already done (resumed)", str(data["skipped_already_done"]))
    table.add_row("retried (infra/grader error before)", str(data["retried"]))
    table.add_row("rescheduled (node or actor lost)", str(data["rescheduled"]))
    table.add_row("solved", str(data["solved"]))
    table.add_row("solve rate (graded rollouts)", fmt(data["solve_rate"], ".1%"))
    table.add_row("mean reward", fmt(data["mean_reward"], ".3f"))
    for outcome, number in data["outcomes"].items():
        table.add_row(f"outcome: {outcome}", str(number))
    table.add_row("turns per rollout", fmt(data["mean_turns"], ".1f"))
    table.add_row("sampled tokens per rollout", fmt(data["mean_sampled_tokens"], ".0f"))
    for phase, seconds in data["mean_seconds_per_phase"].items():
        table.add_row(f"seconds: {phase}", fmt(seconds, ".1f"))
    console = Console()
    console.print(table)
    console.print(escape(f"outputs in {out_dir}/ (rollouts.jsonl, samples.jsonl, summary.json)"))


async def run_with_progress(runner: Runner, jobs: Sequence[Any]) -> RunSummary:
    """Run the jobs under a live progress line (done / running / solved / failed, tokens/s)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task("rollouts", total=len(jobs), stats="")

        def update(summary: RunSummary) -> None:
            progress.update(
                bar,
                completed=summary.done,
                stats=(
                    f"running {summary.running} · solved {summary.solved} · "
                    f"failed {summary.failed} · {summary.tokens_per_second:.0f} tok/s"
                ),
            )

        return await runner.run(jobs, on_update=update)


@click.command("rollout")
@click.argument("tasks", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--harness",
    default="claude_code",
    show_default=True,
    type=PluginName("harness"),
    help="Agent harness plugin.",
)
@click.option(
    "--sandbox",
    default="local",
    show_default=True,
    type=PluginName("sandbox"),
    help="Sandbox plugin.",
)
@click.option(
    "--grader",
    default=None,
    type=PluginName("grader", also=("auto",)),
    help="Grader plugin, or 'auto' to pick per row (what check-tasks and images do) "
    "[default: AGENTRL_TRAIN_GRADER / AGENTRL_EVAL_GRADER, else auto].",
)
@click.option(
    "--engine",
    default="sglang",
    show_default=True,
    type=PluginName("engine"),
    help="Engine plugin.",
)
@click.option(
    "--engine-url",
    help="The engine's server: sglang, the server or router URL; vllm, one server's URL or "
    "several, comma-separated.",
)
@click.option("--engine-options", help="JSON object passed to the engine (see docs/engines.md).")
@click.option("--model-path", type=click.Path(file_okay=False), help="Local model directory.")
@click.option("--tokenizer", type=click.Path(file_okay=False), help="Local tokenizer directory.")
@parser_options(reasoning_default=None)
@prompt_mode_option
@click.option("-n", "--samples-per-task", default=1, show_default=True, type=click.IntRange(1))
@click.option("-c", "--concurrency", default=2, show_default=True, type=click.IntRange(1))
@workers_option
@click.option("--out", default="runs/rollout", show_default=True, type=click.Path(file_okay=False))
@click.option("--eval", "evaluation", is_flag=True, help="Evaluate: rewards only, no samples.")
@click.option("--agent-time-budget", default=1800.0, show_default=True, type=float)
@click.option("--eval-timeout", default=600.0, show_default=True, type=float)
@click.option("--max-context-tokens", default=0, show_default=True, type=int)
@click.option("--temperature", default=None, type=float, help="Sampling temperature.")
@click.option("--max-new-tokens", default=None, type=int, help="Per-turn generation cap.")
@click.option(
    "--cli-dir",
    type=click.Path(file_okay=False),
    help="Host install of the agent CLIs (bin/claude, bin/codex) the local sandbox binds "
    "read-only [default: $AGENTRL_CLI_DIR, else .cache/clis here or in the checkout, else "
    "~/.cache/agentrl/clis (agentrl install-clis), else the harness's CLI on PATH].",
)
@click.option("--public-host", help="Address sandboxes dial to reach the middleware (non-local).")
@click.option("--sandbox-options", help="JSON object passed to the sandbox backend.")
@click.option("--harness-options", help="JSON object passed to the harness.")
@click.option(
    "--instance",
    "instances",
    multiple=True,
    metavar="ID",
    help="Run only the task with this instance id (repeatable); an unknown id is an error.",
)
@click.option(
    "--limit",
    type=click.IntRange(0),
    default=None,
    help="Run at most this many tasks (the first ones, after --instance).",
)
@click.option(
    "--ray",
    "ray_address",
    metavar="ADDRESS|auto",
    default=None,
    help="Run the rollouts on a Ray cluster's nodes (one stack per node; this process "
    "writes --out): 'auto' or the cluster's address. See docs/rollouts.md.",
)
@click.option(
    "--concurrency-per-node",
    type=click.IntRange(1),
    default=None,
    help="With --ray: rollouts (and sandbox boots) at once on each node that does not "
    "advertise an agentrl_slots resource [default: --concurrency].",
)
@click.option(
    "--skip-missing-images",
    is_flag=True,
    help="Leave out (and list) the tasks whose image the sandbox backend lacks, instead of "
    "failing before the run (the images are checked once, up front; not with --ray).",
)
@click.option(
    "--keep-failed",
    is_flag=True,
    help="On resume, count rollouts that ended in infra_error or grader_error as done "
    "instead of running them again.",
)
@track_options
def rollout_command(**kw: Any) -> None:
    """Run agents on TASKS (JSONL rows) and write graded, token-exact samples.

    Re-running the same command with the same --out resumes: finished rollouts are not
    redone, except those that ended in infra_error or grader_error, which run again
    (their old rows move to rollouts.failed.jsonl) unless --keep-failed. Ctrl-C stops
    cleanly, killing sandboxes and closing sessions.

    \b
    Exit status:
      0    every rollout of this run ended normally (solved, unsolved,
           agent_error, timeout or context_overflow), or none was left to run
      1    some rollouts of this run ended in infra_error or grader_error (a
           one-line count on stderr), a tasks file cannot be read or holds no
           task, the engine does not answer, the stack could not start, a task
           cannot run in its sandbox, or a task's image is missing (listed
           before anything starts; see --skip-missing-images)
      2    usage error: a bad option or option value (an unknown --harness,
           --sandbox, --engine, --grader or parser name lists the choices),
           an unknown --sandbox-options or --harness-options key
      130  interrupted (Ctrl-C); re-run the same command to resume
    """
    from agentrl.graders.tasks import AUTO_GRADER, select_grader

    evaluation = kw["evaluation"]
    # The same default as check-tasks and images: each row names its grader, so all three
    # commands parse a row alike and name the same image for it.
    grader = kw["grader"] or select_grader(None, evaluation=evaluation, default=AUTO_GRADER)
    rows = load_task_files(kw["tasks"], grader=grader, evaluation=evaluation)
    tasks = [row.task for row in rows]
    tasks = _select_tasks(tasks, kw["instances"], kw["limit"])
    track = track_from(kw, default_directory=kw["out"])
    cli_dir = kw["cli_dir"]
    if cli_dir is None:
        cli_dir = _default_cli_dir(kw["harness"], kw["harness_options"])
    sampling = {}
    if kw["temperature"] is not None:
        sampling["temperature"] = kw["temperature"]
    if kw["max_new_tokens"] is not None:
        sampling["max_new_tokens"] = kw["max_new_tokens"]
    try:
        options = StackOptions(
            harness=kw["harness"],
            sandbox=kw["sandbox"],
            grader=grader,
            engine=kw["engine"],
            engine_url=kw["engine_url"],
            engine_options=json_object_option(kw["engine_options"], "--engine-options"),
            model_path=kw["model_path"],
            tokenizer=kw["tokenizer"],
            tool_parser=kw["tool_parser"] or None,
            reasoning_parser=kw["reasoning_parser"],
            prompt_mode=kw["prompt_mode"],
            cli_dir=cli_dir,
            public_host=kw["public_host"],
            sandbox_options=json_object_option(kw["sandbox_options"], "--sandbox-options"),
            harness_options=json_object_option(kw["harness_options"], "--harness-options"),
            sampling=sampling,
            max_context_tokens=kw["max_context_tokens"],
            boot_concurrency=kw["concurrency"],
            workers=kw["workers"],
            rollout={
                "agent_time_budget": kw["agent_time_budget"],
                "eval_timeout": kw["eval_timeout"],
            },
            track=track,
        )
        options.check()
    except StackError as exc:
        raise click.UsageError(str(exc)) from None
    except PluginError as exc:
        raise click.ClickException(str(exc)) from None
    if kw["ray_address"] is None:  # a Ray node's daemon is its own: not this machine's
        tasks = rollout_tasks(options, tasks, kw["tasks"], skip_missing=kw["skip_missing_images"])
    out = pathlib.Path(kw["out"])
    summary = run_stack(
        options,
        tasks,
        out,
        samples_per_task=kw["samples_per_task"],
        concurrency=kw["concurrency"],
        evaluation=evaluation,
        keep_failed=kw["keep_failed"],
        ray_address=kw["ray_address"],
        concurrency_per_node=kw["concurrency_per_node"],
    )
    print_summary(summary, out, evaluation=evaluation)
    failed = {o: n for o, n in sorted(summary.outcomes.items()) if o in RETRIED_OUTCOMES}
    if failed:
        counts = ", ".join(f"{n} {o}" for o, n in failed.items())
        click.echo(
            f"{count(sum(failed.values()), 'rollout')} of {summary.done} ended in "
            f"infra_error/grader_error ({counts}); see the error field in "
            f"{out / 'rollouts.jsonl'}; re-run the same command to retry them",
            err=True,
        )
        click.get_current_context().exit(1)


def _select_tasks(tasks: list[Task], instances: Sequence[str], limit: int | None) -> list[Task]:
    """``--instance`` and ``--limit``: the tasks named (all when none), then the first ``limit``."""
    from agentrl.graders.datasets.select import UnknownInstance, select_instances

    try:
        return select_instances(
            tasks, lambda task: task.instance_id, instances=instances, limit=limit
        )
    except UnknownInstance as exc:
        raise click.ClickException(str(exc)) from None


def run_stack(
    options: StackOptions,
    tasks: Sequence[Task],
    out: pathlib.Path,
    *,
    samples_per_task: int,
    concurrency: int,
    evaluation: bool,
    keep_failed: bool = False,
    ray_address: str | None = None,
    concurrency_per_node: int | None = None,
) -> RunSummary:
    """Build the stack and run every job not yet done in ``out``, for a CLI command.

    A stack that cannot start (unknown plugin, unreadable tokenizer, missing agent CLI,
    impossible options), an engine that does not answer its health check, or a task that cannot run in its sandbox (``Stack.check_tasks``)
    becomes a one-line error before the first rollout; Ctrl-C exits 130 once rollouts
    have cleaned up. ``keep_failed``: see ``Runner``. ``ray_address``: run on that Ray
    cluster's nodes instead (``agentrl.rollout.cluster``), ``concurrency_per_node`` at once
    on each (default ``concurrency``).
    """
    from agentrl.harnesses.errors import HarnessError
    from agentrl.rollout.engine_check import check_engine_answers

    async def run() -> RunSummary:
        if ray_address is not None:
            from agentrl.rollout.cluster import run_on_cluster

            await check_engine_answers(options)

            return await run_on_cluster(
                options,
                tasks,
                out,
                address=ray_address,
                slots_per_node=concurrency_per_node or concurrency,
                samples_per_task=samples_per_task,
                evaluation=evaluation,
                keep_failed=keep_failed,
                run_jobs=run_with_progress,
            )
        async with Stack(options) as stack:
            await check_engine_answers(options, stack.engine)
            runner = Runner(
                stack.rollout,
                out,
                concurrency=concurrency,
                evaluation=evaluation,
                decode=stack.decode,
                keep_failed=keep_failed,
                tokenizer=options.tokenizer or options.model_path,
            )
            jobs = runner.plan(tasks, samples_per_task)
            stack.check_tasks({job.task.instance_id: job.task for job in jobs}.values())
            return await run_with_progress(runner, jobs)

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        # asyncio.run cancelled the run: rollouts cleaned up their sandboxes and sessions.
        click.echo(
            f"interrupted: finished rollouts are kept in {out}/; re-run the same command to resume",
            err=True,
        )
        sys.exit(130)
    except (PluginError, StackError, TokenizerError, HarnessError) as exc:
        raise click.ClickException(str(exc)) from None
