"""``agentrl view PATH [OTHER] [--port P | --html FILE]``: look at a run in a browser."""

from __future__ import annotations

import asyncio
import pathlib

import click

from agentrl.wording import count

__all__ = ["view_command"]


@click.command("view")
@click.argument("path", type=click.Path(exists=True, path_type=pathlib.Path))
@click.argument("other", required=False, type=click.Path(exists=True, path_type=pathlib.Path))
@click.option(
    "--html",
    "html",
    type=click.Path(dir_okay=False, path_type=pathlib.Path),
    help="Write one self-contained HTML file (works offline) instead of serving.",
)
@click.option("--port", type=int, default=0, help="Port to serve on (default: a free one).")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind (the data is a run's: keep it local).",
)
@click.option("--tokenizer", help="Tokenizer directory to decode ids with (default: the run's).")
def view_command(
    path: pathlib.Path,
    other: pathlib.Path | None,
    html: pathlib.Path | None,
    port: int,
    host: str,
    tokenizer: str | None,
) -> None:
    """Show PATH, an `agentrl rollout` output directory, an `agentrl serve --output`
    JSONL file or slime --save-debug-rollout-data files (.pt): outcomes, pass@k, timings and failures; each rollout's diff, grade,
    session tree and tokens coloured by loss mask. With OTHER, a second run, the two side
    by side. The server follows a run in progress (docs/view.md)."""
    from agentrl.view import RunSource, ViewError, export_html

    try:
        sources = [RunSource.open(p, tokenizer=tokenizer) for p in (path, other) if p]
    except ViewError as exc:
        raise click.ClickException(str(exc)) from None
    if not sources[0].token_text.decodes:
        click.echo("no tokenizer (pass --tokenizer DIR): token ids are shown, not text", err=True)
    if html is not None:
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(export_html(*sources), encoding="utf-8")
        click.echo(f"wrote {html} ({count(len(sources[0].rows), 'rollout')})")
        return
    try:
        asyncio.run(_serve(sources, host, port, " and ".join(str(p) for p in (path, other) if p)))
    except KeyboardInterrupt:
        pass


async def _serve(sources: list, host: str, port: int, what: str) -> None:
    from agentrl.view.server import ViewServer

    server = ViewServer(sources, host=host, port=port)
    try:
        url = await server.start()
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve on {host}:{port}: {exc.strerror or exc}; pick another --port "
            "(or leave it out for a free one)"
        ) from None
    click.echo(f"serving {what} at {url}")
    click.echo("open that URL (it holds the viewer's token); Ctrl-C to stop")
    try:
        await asyncio.Event().wait()
    finally:
        await server.close()
