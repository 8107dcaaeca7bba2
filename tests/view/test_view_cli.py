"""`agentrl view`: the --html export from the command line, and its errors."""

from __future__ import annotations

import json

from click.testing import CliRunner
from view_support import SESSION_TASK

from agentrl.cli.group import cli


def test_html_export_writes_one_self_contained_file(tmp_path, crafted_dir):
    """--html writes a file with the run and every rollout in it, and nothing to fetch."""
    out = tmp_path / "view.html"
    result = CliRunner().invoke(cli, ["view", str(crafted_dir), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "2 rollouts" in result.output
    html = out.read_text()
    data = json.loads(html.split('id="agentrl-data">', 1)[1].split("</script>", 1)[0])
    assert f"{SESSION_TASK}#0" in data["details"] and data["tokenizer"]
    assert "http://" not in html and "https://" not in html  # no CDN, nothing fetched
    assert "script-src 'sha256-" in html


def test_a_directory_that_is_no_run_is_a_usage_error(tmp_path):
    """A directory without rollouts.jsonl or samples.jsonl: a one-line error, exit 1."""
    result = CliRunner().invoke(cli, ["view", str(tmp_path), "--html", str(tmp_path / "x.html")])
    assert result.exit_code == 1 and "not an agentrl rollout output directory" in result.output


def test_serve_output_file_lists_its_sessions(tmp_path, crafted_source):
    """`agentrl serve --output` samples (rows keyed by "session"): one rollout per session,
    ids shown without a tokenizer."""
    path = tmp_path / "samples.jsonl"
    rows = crafted_source.samples(f"{SESSION_TASK}#0")
    path.write_text("".join(json.dumps({"session": "s1", **r}) + "\n" for r in rows))
    out = tmp_path / "v.html"
    result = CliRunner().invoke(cli, ["view", str(path), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert "token ids are shown" in result.output
    data = json.loads(out.read_text().split('id="agentrl-data">', 1)[1].split("</script>", 1)[0])
    assert [r["key"] for r in data["rollouts"]] == ["s1"] and data["kind"] == "serve"
    assert len(data["details"]["s1"]["session"]["samples"]) == len(rows)


def test_html_export_of_two_runs_holds_their_comparison(tmp_path, crafted_dir):
    """`agentrl view RUN_A RUN_B --html FILE`: run A's pages and the comparison, offline."""
    out = tmp_path / "compare.html"
    result = CliRunner().invoke(
        cli, ["view", str(crafted_dir), str(crafted_dir), "--html", str(out)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text().split('id="agentrl-data">', 1)[1].split("</script>", 1)[0])
    runs = data["compare"]["runs"]
    assert [r["rollouts"] for r in runs] == [2, 2] and runs[0]["outcomes"] == runs[1]["outcomes"]
    assert f"{SESSION_TASK}#0" in data["details"]
