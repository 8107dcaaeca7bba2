"""Fixtures of the TRL tests: TRL itself (required in CI) and the demo model directory."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def trl_module():
    """TRL (``agentrl[trl]``); fails in CI (``CI=true``) when missing, skips elsewhere."""
    try:
        import trl
    except ImportError as exc:
        _unavailable(
            f"trl is not importable ({exc}); run `make trl-deps` (pip install trl==1.16.0)"
        )
    return trl


@pytest.fixture(scope="session")
def demo_model() -> pathlib.Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory (``scripts/vllm.sh model``)."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm.sh"), "model"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        _unavailable(f"the demo model could not be prepared: {done.stderr.strip()[-500:]}")
    return pathlib.Path(done.stdout.strip().splitlines()[-1])
