"""The shared sandbox contract (``agentrl.testing.sandbox_contract``) on every built-in backend."""

from __future__ import annotations

import pytest

from agentrl.sandboxes.docker import DockerSandbox
from agentrl.sandboxes.e2b import E2BSandbox
from agentrl.testing.sandbox_contract import SandboxContract


class TestLocalContract(SandboxContract):
    """The ``local`` (bubblewrap) sandbox."""

    @pytest.fixture
    def contract_factory(self, agentrl_local_sandboxes):
        return agentrl_local_sandboxes


class TestDockerContract(SandboxContract):
    """The ``docker`` sandbox on the session's real daemon and the base image."""

    @pytest.fixture
    def contract_factory(self, docker_options):
        return lambda task: DockerSandbox.from_task(task, **docker_options)


class TestE2BContract(SandboxContract):
    """The ``e2b`` sandbox against the E2B double (commands run as host subprocesses)."""

    agent_is_unprivileged = False
    takes_host_repo = False

    @pytest.fixture
    def contract_task(self):
        from agentrl.types import Task

        return Task(instance_id="contract-1", problem_statement="", image="registry/task:1")

    @pytest.fixture
    def contract_factory(self, agentrl_e2b_options):
        return lambda task: E2BSandbox.from_task(task, **agentrl_e2b_options)
