"""Images checked before work starts, on a real dockerd: one listing, named the same way
by the rollout's pre-check, ``check-tasks`` and ``agentrl images``; the bundled
semver_lite-1 task's image built offline by ``scripts/docker-example-images.sh``.

``CountingDockerProxy`` relays the real Docker API to the suite's daemon and records what a
command asked it (how many listings, whether a container was created).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys

import attrs
import pytest
from click.testing import CliRunner
from docker_proxy import CountingDockerProxy
from rollout_support import CLI_DIR, claude_solution, textstats_task

from agentrl.cli.group import cli
from agentrl.graders.tasks import load_tasks
from agentrl.rollout.stack import StackOptions
from agentrl.sandboxes.docker import DockerSandbox

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "tasks"
NEVER_BUILT = "agentrl-test/never-built-images:7"


@pytest.fixture
def proxy(dockerd_host, tmp_path_factory):
    """A counting relay to the suite's daemon, in a short directory (socket path limit)."""
    relay = CountingDockerProxy(dockerd_host, tmp_path_factory.mktemp("dp"))
    yield relay
    relay.close()


def _row(instance_id: str, image: str | None, **metadata) -> dict:
    """The textstats example row as ``instance_id``, on ``image``, host paths absolute."""
    row = json.loads((EXAMPLES / "scaleswe.jsonl").read_text().splitlines()[0])
    row["label"] = instance_id
    meta = row["metadata"]
    meta["instance_id"] = instance_id
    for key in ("repo", "gold_patch_path"):
        meta[key] = str(EXAMPLES / meta[key])
    if image is not None:
        meta["image"] = image
    meta.update(metadata)
    return row


def _task_file(path: pathlib.Path, *rows: dict) -> pathlib.Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _docker(host: str, *args: str) -> str:
    return subprocess.run(
        ["docker", *args],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


async def test_one_listing_answers_for_every_task(proxy, dockerd_host, docker_base_image, tmp_path):
    """Six tasks on four names: the base image by tag, by id prefix and by a Docker Hub
    spelling of a local tag (``docker.io/library/NAME``, no tag: ``latest``), and one image
    the daemon lacks (two tasks). The backend asks the daemon one thing, its image list,
    and groups the tasks by image, saying which is missing."""
    alias = f"agentrl-test-hub-{tmp_path.name.lower()[-12:]}"
    await asyncio.to_thread(_docker, dockerd_host, "tag", docker_base_image, f"{alias}:latest")
    try:
        image_id = await asyncio.to_thread(
            _docker, dockerd_host, "image", "inspect", "-f", "{{.Id}}", docker_base_image
        )
        short_id = image_id.removeprefix("sha256:")[:12]
        base = textstats_task()
        images = {
            "a": docker_base_image,
            "b": docker_base_image,
            "c": short_id,
            "d": NEVER_BUILT,
            "e": NEVER_BUILT,
            "f": f"docker.io/library/{alias}",
        }
        tasks = [attrs.evolve(base, instance_id=key, image=image) for key, image in images.items()]
        report = await DockerSandbox.image_report(tasks, docker_host=proxy.host)
    finally:
        await asyncio.to_thread(_docker, dockerd_host, "rmi", f"{alias}:latest")
    # /version: aiodocker's API version negotiation, before any question.
    assert [p for p in proxy.paths() if p != "/version"] == ["/images/json"], proxy.requests
    assert [(n.name, n.tasks, n.missing) for n in report.needs] == [
        (docker_base_image, ("a", "b"), False),
        (short_id, ("c",), False),
        (NEVER_BUILT, ("d", "e"), True),
        (f"docker.io/library/{alias}", ("f",), False),
    ]
    assert report.missing_tasks() == {"d", "e"}


async def test_rollout_fails_before_any_sandbox_starts_naming_the_missing_images(
    proxy, docker_base_image, scripted_engine, qwen_tokenizer_dir, tmp_path
):
    """``agentrl rollout --sandbox docker`` with two tasks on an image the daemon lacks and
    one on the base image: exit 1 before anything starts, naming the image, its tasks and
    ``agentrl images pull TASKS``. The daemon was asked for its image list once and never
    for a container; the engine served nothing; no rollout row was written."""
    tasks = _task_file(
        tmp_path / "tasks.jsonl",
        _row("ok-1", docker_base_image),
        _row("gone-1", NEVER_BUILT),
        _row("gone-2", NEVER_BUILT),
    )
    out = tmp_path / "out"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        "rollout",
        str(tasks),
        "--sandbox",
        "docker",
        "--sandbox-options",
        json.dumps({"docker_host": proxy.host}),
        "--engine-url",
        scripted_engine.url,
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 300)
    stderr = err.decode()
    assert proc.returncode == 1, stderr[-3000:]
    assert f"{NEVER_BUILT}  (2 tasks: gone-1, gone-2)" in stderr, stderr[-3000:]
    assert f"agentrl images pull {tasks}" in stderr
    assert "Traceback" not in stderr
    assert proxy.paths("GET").count("/images/json") == 1
    assert not [p for p in proxy.paths() if p.startswith("/containers")], proxy.requests
    assert not scripted_engine.served
    assert not (out / "rollouts.jsonl").exists()


async def test_skip_missing_images_rolls_out_only_the_tasks_whose_image_is_there(
    dockerd_host, docker_base_image, scripted_engine, qwen_tokenizer_dir, tmp_path
):
    """``--skip-missing-images``: the task on a missing image is listed on stderr and not
    rolled out; the task on the base image is (Claude Code in a container, solved)."""
    tasks = _task_file(
        tmp_path / "tasks.jsonl",
        _row("textstats-1", docker_base_image),
        _row("gone-1", NEVER_BUILT),
    )
    for reply in claude_solution():
        scripted_engine.queue(reply)
    out = tmp_path / "out"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrl.cli",
        "rollout",
        str(tasks),
        "--sandbox",
        "docker",
        "--sandbox-options",
        json.dumps({"docker_host": dockerd_host}),
        "--skip-missing-images",
        "--engine-url",
        scripted_engine.url,
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--cli-dir",
        str(CLI_DIR),
        "--out",
        str(out),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 600)
    stderr = err.decode()
    assert proc.returncode == 0, stderr[-3000:]
    assert "skipping 1 of 2 tasks" in stderr
    assert f"{NEVER_BUILT}  (1 task: gone-1)" in stderr
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["instance_id"], r["outcome"]) for r in rows] == [("textstats-1", "solved")]


def test_check_tasks_counts_a_broken_tasks_missing_image_apart(dockerd_host, tmp_path):
    """A row the grader turns down (no way to grade it) on an image the daemon lacks: it is
    broken, its reasons name the missing image too, and the summary counts it apart from
    the gradable tasks with a missing image instead of saying "0 with a missing image"."""
    row = _row("ungradable-1", NEVER_BUILT)
    del row["metadata"]["eval_cmd"]
    tasks = _task_file(tmp_path / "tasks.jsonl", row)
    result = CliRunner().invoke(
        cli,
        [
            "check-tasks",
            str(tasks),
            "--sandbox",
            "docker",
            "--sandbox-options",
            json.dumps({"docker_host": dockerd_host}),
            "--runs",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 1, result.output
    (checked,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert checked["status"] == "broken"
    assert checked["image"] == NEVER_BUILT and checked["image_missing"] is True
    assert any(NEVER_BUILT in reason for reason in checked["reasons"])
    assert "0 gradable with a missing image (and 1 of the broken tasks' images)" in result.output
    assert f"agentrl images pull {tasks}" in result.output


def test_check_tasks_images_list_and_the_rollout_name_the_same_image(
    dockerd_host, docker_base_image, scripted_engine, qwen_tokenizer_dir, tmp_path
):
    """A swebench row (the bundled semver_lite-1 under another id) that names its own image:
    two candidates, swebench's locally built instance image first, neither on the daemon.
    ``check-tasks``, ``agentrl images list`` and the rollout's pre-check (all with the
    grader chosen per row) name the task's image the same way, as a boot would try it; so
    does ``agentrl rollout`` with its default grader (no --grader, no environment)."""
    row = json.loads((EXAMPLES / "swebench.jsonl").read_text().splitlines()[0])
    row["label"] = "semver_lite-twin"
    row["metadata"]["repo"] = str(EXAMPLES / row["metadata"]["repo"])
    row["metadata"]["remote_env_info"].update(
        instance_id="semver_lite-twin", image="agentrl-test/row-image:1"
    )
    tasks = _task_file(tmp_path / "tasks.jsonl", row)
    options = json.dumps({"docker_host": dockerd_host})
    runner = CliRunner()
    checked = runner.invoke(
        cli,
        ["check-tasks", str(tasks), "--sandbox", "docker", "--sandbox-options", options, "--json"],
    )
    listed = runner.invoke(
        cli, ["images", "list", str(tasks), "--sandbox-options", options, "--json"]
    )
    assert listed.exit_code == 0, listed.output
    (need,) = [json.loads(line) for line in listed.stdout.splitlines()]
    (check,) = [json.loads(line) for line in checked.stdout.splitlines()]
    local, own = need["candidates"]
    assert local.startswith("sweb.eval.") and "semver_lite-twin" in local
    assert own == "agentrl-test/row-image:1"
    expected = f"{local} or {own}"
    assert need["image"] == check["image"] == expected
    assert check["status"] == "missing-image"
    assert need["present"] is False and need["tasks"] == 1

    from agentrl.rollout.images import MissingImagesError, check_images  # new with the check

    stack = StackOptions(sandbox="docker", sandbox_options={"docker_host": dockerd_host})
    with pytest.raises(MissingImagesError) as raised:
        asyncio.run(check_images(stack, [r.task for r in load_tasks(tasks, grader="auto")]))
    assert f"  {expected}  (1 task: semver_lite-twin)" in str(raised.value)

    env = {"AGENTRL_TRAIN_GRADER": "", "AGENTRL_TRAIN_PROTOCOL": "", "SWE_TRAIN_PROTOCOL": ""}
    rolled = runner.invoke(
        cli,
        [
            "rollout",
            str(tasks),
            "--sandbox",
            "docker",
            "--sandbox-options",
            options,
            "--engine-url",
            scripted_engine.url,
            "--tokenizer",
            str(qwen_tokenizer_dir),
            "--out",
            str(tmp_path / "out"),
        ],
        env=env,
    )
    assert rolled.exit_code == 1, rolled.output
    assert f"  {expected}  (1 task: semver_lite-twin)" in rolled.output
    assert not scripted_engine.served


def test_semver_lite_grades_under_docker_from_its_built_image(dockerd_host, docker_base_image):
    """``scripts/docker-example-images.sh`` builds the image the bundled semver_lite-1 task
    (swebench) boots from, offline on the base image; ``check-tasks --sandbox docker`` then
    grades its reference patch solved and the empty patch unsolved in that image."""
    built = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "docker-example-images.sh"),
            str(ROOT / ".cache" / "docker"),
        ],
        env={**os.environ, "DOCKER_HOST": dockerd_host, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    image = built.stdout.split()[-1]
    assert image.startswith("sweb.eval.") and "semver_lite-1" in image
    result = CliRunner().invoke(
        cli,
        [
            "check-tasks",
            str(EXAMPLES / "swebench.jsonl"),
            "--sandbox",
            "docker",
            "--sandbox-options",
            json.dumps({"docker_host": dockerd_host}),
            "--runs",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    (checked,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert checked["status"] == "ok", checked
    assert checked["image"] == image
    assert checked["gold_rewards"] == [1.0] and checked["empty_rewards"] == [0.0]
