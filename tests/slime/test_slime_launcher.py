"""The multi-node slime launcher, run with stand-ins for the cluster commands.

``ray`` and ``ssh`` are replaced by scripts that record their argv (there is no Ray
cluster here), and slime's model script by one defining ``MODEL_ARGS``; everything else in
``examples/slime/run_coding_agent.sh`` runs for real, including its Python snippets.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

LAUNCHER = (
    pathlib.Path(__file__).resolve().parents[2] / "examples" / "slime" / "run_coding_agent.sh"
)
#: `python -m sglang_router.launch_router --help` of the released sglang-router 0.3.2 (PyPI),
#: whose --policy choices lack consistent_hashing.
ROUTER_0_3_2_HELP = (
    pathlib.Path(__file__).resolve().parents[1]
    / "data"
    / "sglang_router_0.3.2_launch_router_help.txt"
)
RELEASED_HELP = ROUTER_0_3_2_HELP.read_text()
#: The same help from a router that has consistent_hashing (slime's own image).
WITH_CONSISTENT_HASHING = RELEASED_HELP.replace(
    "power_of_two,manual}", "power_of_two,consistent_hashing,manual}"
)
#: A stand-in ``sglang_router`` package whose launch_router prints a captured --help.
ROUTER_STUB = """import sys
if "--help" in sys.argv:
    sys.stdout.write(open({help!r}).read())
    sys.exit(0)
sys.exit("the stub router only answers --help")
"""

RECORDER = """#!/bin/sh
if [ "$1" = status ]; then printf 'Active:\\n 1 node_a\\n 1 node_b\\n 1 node_c\\n'; exit 0; fi
"{python}" -c 'import json, sys; print(json.dumps([sys.argv[1]] + sys.argv[2:]))' "$(basename "$0")" "$@" >> "{log}"
"""


def _router_stub(tmp_path: pathlib.Path, help_text: str | None) -> str:
    """A PYTHONPATH entry holding a stub ``sglang_router`` answering ``--help`` with
    ``help_text`` (None: no router installed)."""
    lib = tmp_path / "pylib"
    package = lib / "sglang_router"
    package.mkdir(parents=True)
    if help_text is None:
        package.rmdir()
        return str(lib)
    (package / "__init__.py").write_text("")
    (lib / "help.txt").write_text(help_text)
    (package / "launch_router.py").write_text(ROUTER_STUB.format(help=str(lib / "help.txt")))
    return str(lib)


def _run(
    tmp_path: pathlib.Path, router_help: str | None = RELEASED_HELP, **env: str
) -> list[list[str]]:
    return _run_full(tmp_path, router_help, **env)[0]


def _run_full(
    tmp_path: pathlib.Path, router_help: str | None = RELEASED_HELP, **env: str
) -> tuple[list[list[str]], str]:
    """Run the launcher; ``router_help`` is the installed router's --help (default: 0.3.2's;
    None: no router installed); returns the recorded calls and the launcher's stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.jsonl"
    for name in ("ray", "ssh"):
        tool = bin_dir / name
        tool.write_text(RECORDER.format(python=sys.executable, log=log))
        tool.chmod(0o755)
    models = tmp_path / "slime" / "scripts" / "models"
    models.mkdir(parents=True)
    (models / "qwen3-30B-A3B.sh").write_text("MODEL_ARGS=(--num-layers 48 --hidden-size 2048)\n")
    (tmp_path / "hostfile").write_text("10.0.0.2\n# a comment\n\n10.0.0.3\n")
    python_dir = os.path.dirname(sys.executable)
    full_env = {
        "PATH": f"{bin_dir}:{python_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLIME_DIR": str(tmp_path / "slime"),
        "HF_CHECKPOINT": "/models/q",
        "REF_LOAD": "/models/q_dist",
        "PROMPT_DATA": "/data/train.jsonl",
        "HOSTFILE": str(tmp_path / "hostfile"),
        "MASTER_ADDR": "10.0.0.1",
        "RUN_ROOT": str(tmp_path / "run"),
        "RAY_WAIT_SEC": "10",
        "PYTHONPATH": os.pathsep.join(
            p for p in (_router_stub(tmp_path, router_help), os.environ.get("PYTHONPATH")) if p
        ),
        **env,
    }
    # The launcher's own `python3` must be the one agentrl is installed in. A symlink to a
    # venv's interpreter placed outside the venv does not activate the venv, so exec it.
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    done = subprocess.run(
        ["bash", str(LAUNCHER)], env=full_env, check=True, capture_output=True, timeout=120
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return calls, done.stderr.decode()


def _submit(calls: list[list[str]]) -> tuple[dict[str, str], list[str]]:
    (submit,) = [c for c in calls if c[:3] == ["ray", "job", "submit"]]
    env = json.loads(submit[submit.index("--runtime-env-json") + 1])["env_vars"]
    return env, submit[submit.index("--") + 1 :]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.skipif(sys.platform != "linux", reason="bash launcher")
def test_launcher_starts_every_node_and_submits_agentrl_flags(tmp_path):
    """Head plus two ssh workers; the job gets agentrl's hooks and the fan-out-safe flags."""
    calls = _run(tmp_path)
    assert any(c[:3] == ["ray", "start", "--head"] for c in calls)
    workers = [c for c in calls if c[0] == "ssh"]
    assert sorted(w[3] for w in workers) == ["root@10.0.0.2", "root@10.0.0.3"]
    assert all("ray start --address 10.0.0.1:6379" in w[-1] for w in workers)
    env, argv = _submit(calls)
    assert argv[:3] == ["python3", "-u", "train.py"]
    assert _flag(argv, "--custom-generate-function-path") == "agentrl.slime.generate"
    assert _flag(argv, "--custom-reward-post-process-path") == "agentrl.slime.reward_post_process"
    assert _flag(argv, "--router-policy") == "manual"  # the released router's sticky policy
    assert "--use-dynamic-batch-size" in argv and "--colocate" in argv
    assert _flag(argv, "--rollout-top-p") == "1.0"
    for forbidden in (
        "--group-rm",
        "--partial-rollout",
        "--dynamic-sampling-filter-path",
        "--log-passrate",
    ):
        assert forbidden not in argv
    assert _flag(argv, "--actor-num-nodes") == "3"
    assert _flag(argv, "--rollout-num-gpus") == "24"
    assert _flag(argv, "--global-batch-size") == "64"
    assert _flag(argv, "--max-tokens-per-gpu") == str(65536 // 2)
    assert _flag(argv, "--sglang-tool-call-parser") == "qwen25"
    assert _flag(argv, "--sglang-reasoning-parser") == "qwen3"
    assert argv[
        argv.index("--rollout-stop-token-ids") + 1 : argv.index("--rollout-stop-token-ids") + 3
    ] == ["151645", "151643"]
    assert "--num-layers" in argv  # slime's model script was sourced
    assert env["AGENTRL_HARNESS"] == "claude_code" and env["AGENTRL_PUBLIC_HOST"] == "auto"
    assert env["PYTHONPATH"].endswith(str(tmp_path / "slime"))
    extra = json.loads(env["AGENTRL_CLAUDE_CODE_EXTRA_ARGS"])
    assert json.loads(extra[1])["autoCompactWindow"] == 65536 * 3 // 4
    assert "10.0.0.1" in env["no_proxy"]


@pytest.mark.skipif(sys.platform != "linux", reason="bash launcher")
def test_launcher_honours_slime_example_names(tmp_path):
    """SWE_AGENT / ADAPTER_* from a slime launcher carry over; an empty reasoning parser is dropped."""
    calls = _run(
        tmp_path,
        SWE_AGENT="codex",
        ADAPTER_PUBLIC_HOST="10.9.9.9",
        REASONING_PARSER="",
        TOOL_CALL_PARSER="qwen3_coder",
        E2B_DOMAIN="e2b.internal",
    )
    env, argv = _submit(calls)
    assert env["AGENTRL_HARNESS"] == "codex" and env["AGENTRL_PUBLIC_HOST"] == "10.9.9.9"
    assert env["E2B_DOMAIN"] == "e2b.internal" and env["SWE_AGENT"] == "codex"
    assert "AGENTRL_CLAUDE_CODE_EXTRA_ARGS" not in env
    assert "--sglang-reasoning-parser" not in argv
    assert _flag(argv, "--sglang-tool-call-parser") == "qwen3_coder"


def _policy_choices(help_text: str) -> list[str]:
    """The --policy choices argparse printed, as slime's --router-policy would take them."""
    line = next(x for x in help_text.splitlines() if x.strip().startswith("--policy {"))
    return line.split("{", 1)[1].split("}", 1)[0].split(",")


@pytest.mark.skipif(sys.platform != "linux", reason="bash launcher")
@pytest.mark.parametrize(
    ("router_help", "expected"),
    [
        (RELEASED_HELP, "manual"),  # sglang-router 0.3.2 from PyPI
        (WITH_CONSISTENT_HASHING, "consistent_hashing"),  # slime's image
    ],
)
def test_launcher_picks_a_router_policy_the_installed_router_accepts(
    tmp_path, router_help, expected
):
    """The launcher asks the installed sglang-router for its --policy choices and passes a
    policy it accepts that honours X-SMG-Routing-Key: consistent_hashing where it exists,
    else manual (the released 0.3.2 offers manual but rejects consistent_hashing)."""
    released = _policy_choices(RELEASED_HELP)
    assert "consistent_hashing" not in released and "manual" in released
    _, argv = _submit(_run(tmp_path, router_help))
    policy = _flag(argv, "--router-policy")
    assert policy == expected
    assert policy in _policy_choices(router_help)


@pytest.mark.skipif(sys.platform != "linux", reason="bash launcher")
def test_launcher_without_a_sticky_policy_passes_none_and_warns(tmp_path):
    """A router offering neither sticky policy (or none importable) gets no --router-policy
    (its default, cache_aware) and a warning pointing at the docs."""
    only_defaults = RELEASED_HELP.replace(",manual}", "}")
    calls, stderr = _run_full(tmp_path, only_defaults)
    assert "--router-policy" not in _submit(calls)[1]
    assert "neither consistent_hashing nor manual" in stderr and "docs/slime.md" in stderr
    calls, stderr = _run_full(tmp_path / "none", None)
    assert "--router-policy" not in _submit(calls)[1]
    assert "none found" in stderr


@pytest.mark.skipif(sys.platform != "linux", reason="bash launcher")
def test_router_policy_variable_overrides_the_detection(tmp_path):
    """ROUTER_POLICY=cache_aware is passed as is; an empty ROUTER_POLICY passes no flag."""
    _, argv = _submit(_run(tmp_path, ROUTER_POLICY="cache_aware"))
    assert _flag(argv, "--router-policy") == "cache_aware"
    _, argv = _submit(_run(tmp_path / "empty", ROUTER_POLICY=""))
    assert "--router-policy" not in argv
