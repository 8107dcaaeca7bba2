"""``agentrl images list|pull TASKS`` against the suite's real dockerd.

Pulls come from ``RegistryDouble`` (a Registry API V2 server on 127.0.0.1: no registry is
reachable offline) or fail against a port nothing listens on; either way the daemon itself
does the pulling.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner
from registry_double import RegistryDouble

from agentrl.cli.group import cli

pytestmark = pytest.mark.slow

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tasks"


def _task_file(path: pathlib.Path, images: dict[str, str]) -> pathlib.Path:
    """One textstats row per ``instance id: image``."""
    template = json.loads((EXAMPLES / "scaleswe.jsonl").read_text().splitlines()[0])
    lines = []
    for instance_id, image in images.items():
        row = json.loads(json.dumps(template))
        row["label"] = row["metadata"]["instance_id"] = instance_id
        row["metadata"]["image"] = image
        row["metadata"]["repo"] = str(EXAMPLES / row["metadata"]["repo"])
        lines.append(json.dumps(row) + "\n")
    path.write_text("".join(lines))
    return path


async def _agentrl(*args: str, cwd: pathlib.Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode, out.decode(), err.decode()


def _remove_image(host: str, name: str) -> None:
    subprocess.run(
        ["docker", "rmi", "-f", name],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        check=False,
    )


@pytest.fixture
async def registry(tmp_path):
    """A registry double serving ``agentrl-test/tiny-<test>:1``."""
    double = RegistryDouble(f"agentrl-test/tiny-{tmp_path.name.lower()[-20:]}", "1")
    await double.start()
    yield double
    await double.close()


async def test_pull_fetches_the_missing_image_from_its_registry(
    registry, dockerd_host, docker_base_image, tmp_path
):
    """One task on the base image (present), two on an image a registry serves by tag and
    one on it by digest (missing): ``images list`` says so, ``images pull`` pulls only the
    missing ones, exits 0, and the daemon lists both references afterwards."""
    image = f"{registry.address}/{registry.repository}:{registry.tag}"
    pinned = f"{registry.address}/{registry.repository}@{registry.manifest_digest}"
    tasks = _task_file(
        tmp_path / "tasks.jsonl",
        {"here-1": docker_base_image, "far-1": image, "far-2": image, "far-3": pinned},
    )
    options = json.dumps({"docker_host": dockerd_host})
    try:
        code, out, err = await _agentrl(
            "images", "list", str(tasks), "--sandbox-options", options, "--json", cwd=tmp_path
        )
        assert code == 0, err
        before = {row["image"]: row for row in map(json.loads, out.splitlines())}
        assert before[image]["present"] is False and before[image]["tasks"] == 2
        assert before[docker_base_image]["present"] is True

        code, out, err = await _agentrl(
            "images", "pull", str(tasks), "--sandbox-options", options, cwd=tmp_path
        )
        assert code == 0, err
        assert f"pulled: {image}" in out and f"pulled: {pinned}" in out
        assert "3 images: 1 already present, 2 pulled, 0 failed" in err
        assert any("/blobs/" in line for line in registry.requests), registry.requests

        code, out, _ = await _agentrl(
            "images", "list", str(tasks), "--sandbox-options", options, "--json", cwd=tmp_path
        )
        after = {row["image"]: row for row in map(json.loads, out.splitlines())}
        assert after[image]["present"] is True and after[pinned]["present"] is True
    finally:
        await asyncio.to_thread(_remove_image, dockerd_host, image)
        await asyncio.to_thread(_remove_image, dockerd_host, pinned)


async def test_pull_reports_each_failed_image_and_exits_1(
    registry, dockerd_host, docker_base_image, tmp_path
):
    """Two images no registry has (a port nothing listens on; a repository the registry
    does not serve) and one present: each failure is reported with the registry's answer,
    the present one is left alone, and the command exits 1."""
    refused = "127.0.0.1:1/agentrl-test/nowhere:1"
    unknown = f"{registry.address}/agentrl-test/not-served:1"
    tasks = _task_file(
        tmp_path / "tasks.jsonl", {"a-1": refused, "b-1": unknown, "c-1": docker_base_image}
    )
    options = json.dumps({"docker_host": dockerd_host})
    code, _, err = await _agentrl(
        "images", "pull", str(tasks), "--sandbox-options", options, cwd=tmp_path
    )
    assert code == 1, err
    assert f"failed: {refused}: pull of {refused} failed:" in err
    assert "connection refused" in err
    assert f"failed: {unknown}: pull of {unknown} failed:" in err
    assert "manifest unknown" in err.lower() or "not found" in err.lower(), err
    assert "3 images: 1 already present, 0 pulled, 2 failed" in err


def test_list_prints_each_distinct_image_once_with_its_task_count(
    dockerd_host, docker_base_image, tmp_path
):
    """Four tasks on two images: the table shows each image once with how many tasks need
    it and whether the daemon has it; the summary counts images, tasks and missing ones."""
    missing = "agentrl-test/never-built-list:1"
    tasks = _task_file(
        tmp_path / "tasks.jsonl",
        {"a": docker_base_image, "b": docker_base_image, "c": docker_base_image, "d": missing},
    )
    result = CliRunner().invoke(
        cli,
        [
            "images",
            "list",
            str(tasks),
            "--sandbox-options",
            json.dumps({"docker_host": dockerd_host}),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "│" in line]
    assert [(r.count(docker_base_image), r.count(missing)) for r in rows] == [(1, 0), (0, 1)]
    assert "│     3 │ yes" in rows[0] and "│     1 │ missing" in rows[1]
    assert f"2 images for 4 tasks on the docker daemon at {dockerd_host}: 1 missing" in (
        result.output
    )
    assert f"agentrl images pull {tasks}" in result.output


def test_a_backend_without_images_says_it_has_none_to_list(tmp_path):
    """``--sandbox local`` boots from directories, not images it must hold: ``images list``
    says so and exits 1 instead of printing an empty table."""
    tasks = _task_file(tmp_path / "tasks.jsonl", {"a": "/nonexistent-root"})
    result = CliRunner().invoke(cli, ["images", "list", str(tasks), "--sandbox", "local"])
    assert result.exit_code == 1
    assert "the 'local' sandbox holds no images to check or pull" in result.output
