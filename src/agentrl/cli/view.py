"""``agentrl view OUT_DIR [--port P | --html FILE]``: look at a run in a browser."""

from __future__ import annotations

import pathlib

import click

__all__ = ["view_command"]


@click.command("view")
@click.argument("path", type=click.Path(exists=True, path_type=pathlib.Path))
@click.option(
    "--html",
    "html",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    help="Write one self-contained HTML file (works offline) instead of serving.",
)
@click.option("--port", type=int, default=8765, show_default=True, help="Port to serve on.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind (the data is a run's: keep it local).",
)
@click.option("--tokenizer", help="Tokenizer directory to decode ids with (default: the run's).")
def view_command(
    path: pathlib.Path, html: pathlib.Path | None, port: int, host: str, tokenizer: str | None
) -> None:
    """Show PATH, an `agentrl rollout` output directory, an `agentrl serve --output`
    JSONL file or slime --save-debug-rollout-data files (.pt): outcomes, pass@k, timings and failures; each rollout's diff, grade,
    session tree and tokens coloured by loss mask (docs/view.md)."""
    from agentrl.view import RunSource, ViewError, export_html

    try:
        source = RunSource.open(path, tokenizer=tokenizer)
    except ViewError as exc:
        raise click.ClickException(str(exc)) from None
    if not source.token_text.decodes:
        click.echo("no tokenizer (pass --tokenizer DIR): token ids are shown, not text", err=True)
    if html is not None:
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(export_html(source), encoding="utf-8")
        click.echo(f"wrote {html} ({len(source.rows)} rollouts)")
        return
    from aiohttp import web

    from agentrl.view.server import make_app

    click.echo(f"serving {path} on http://{host}:{port}/ (Ctrl-C to stop)")
    web.run_app(make_app(source), host=host, port=port, print=None)
