"""Both graders on the ``docker`` sandbox, and check-tasks' missing-image report, on a real dockerd."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from click.testing import CliRunner

from agentrl.cli.group import cli
from agentrl.graders.check import MISSING_IMAGE, OK, check_task, sandbox_factory_for
from agentrl.graders.swebench import instance_image
from agentrl.graders.tasks import gold_patch, load_tasks, make_grader

pytestmark = pytest.mark.slow

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "tasks"
INSTANCE_IMAGE = "sweb.eval.x86_64.semver_lite-1:latest"


class Recording:
    """A docker ``SandboxFactory`` that keeps every sandbox it made."""

    def __init__(self, options):
        self.inner = sandbox_factory_for("docker", options=options)
        self.built = []

    def __call__(self, task):
        sandbox = self.inner(task)
        self.built.append(sandbox)
        return sandbox


def _build_instance_image(host: str, base: str) -> None:
    """A tiny image named as swebench's spec names the example instance's image."""
    subprocess.run(
        ["docker", "build", "--network", "none", "-q", "-t", INSTANCE_IMAGE, "-"],
        input=f"FROM {base}\nLABEL agentrl.test=swebench-instance\n",
        env={**os.environ, "DOCKER_HOST": host, "DOCKER_BUILDKIT": "0"},
        check=True,
        capture_output=True,
        text=True,
    )


def _remove_instance_image(host: str) -> None:
    subprocess.run(
        ["docker", "rmi", "-f", INSTANCE_IMAGE],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        check=False,
    )


def _swebench_task():
    (row,) = load_tasks(EXAMPLES / "swebench.jsonl", grader="swebench")
    return row


async def test_exit_code_grader_grades_gold_and_empty_in_fresh_containers(docker_options):
    """The scaleswe (exit-code) grader: the gold patch scores 1 and the empty one 0, each in a
    fresh container of the base image."""
    rows = load_tasks(EXAMPLES / "scaleswe.jsonl")
    row = next(r for r in rows if r.task.instance_id == "textstats-1")
    grader = make_grader(row.task.grader)
    factory = Recording(docker_options)
    gold = await grader.grade(row.task, gold_patch(row.task), factory)
    empty = await grader.grade(row.task, "", factory)
    assert gold.reward == 1.0, gold
    assert empty.reward == 0.0, empty
    assert len({box.container_id for box in factory.built}) == 2


def test_swebench_rows_name_the_instance_image_swebench_names():
    """The swebench grader asks swebench's own spec for the instance image's name."""
    row = _swebench_task()
    assert instance_image(row.task.grading["instance"]) == INSTANCE_IMAGE
    assert list(row.task.metadata["docker_images"]) == [INSTANCE_IMAGE]


async def test_swebench_grader_runs_in_the_local_instance_image(
    docker_options, dockerd_host, docker_base_image
):
    """check-tasks reports the instance image missing (naming it); once it is built locally,
    the swebench grader grades gold 1 / empty 0 in containers of exactly that image."""
    row = _swebench_task()
    options = {**docker_options, "default_image": None}
    _remove_instance_image(dockerd_host)
    grader = make_grader("swebench")
    missing = await check_task(row, grader, sandbox_factory_for("docker", options=options), runs=1)
    assert missing.status == MISSING_IMAGE
    assert INSTANCE_IMAGE in missing.reasons[0]

    _build_instance_image(dockerd_host, docker_base_image)
    factory = Recording(options)
    checked = await check_task(row, grader, factory, runs=1)
    assert checked.status == OK, checked
    assert checked.gold_rewards == (1.0,) and checked.empty_rewards == (0.0,)
    assert {box.image for box in factory.built} == {INSTANCE_IMAGE}


def test_check_tasks_command_lists_missing_images(docker_options, tmp_path):
    """``agentrl check-tasks --sandbox docker`` names a task's missing image and exits 1."""
    row = json.loads((EXAMPLES / "scaleswe.jsonl").read_text().splitlines()[0])
    row["metadata"]["image"] = "agentrl-test/not-built:1"
    row["metadata"]["repo"] = str(EXAMPLES / row["metadata"]["repo"])
    row["metadata"]["gold_patch_path"] = str(EXAMPLES / row["metadata"]["gold_patch_path"])
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    result = CliRunner().invoke(
        cli,
        [
            "check-tasks",
            str(tasks),
            "--sandbox",
            "docker",
            "--sandbox-options",
            json.dumps({"docker_host": docker_options["docker_host"]}),
            "--runs",
            "1",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "missing image: textstats-1" in result.output
    assert "agentrl-test/not-built:1" in result.output
