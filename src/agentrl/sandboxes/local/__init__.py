"""The ``local`` sandbox: bubblewrap on this machine (``sandbox``), with its workspace and
host-path handling (``fs``), process and namespace helpers (``proc``), resource limits
(``limits``) and the in-sandbox scripts (``scripts``)."""

from __future__ import annotations

from agentrl.sandboxes.local.fs import host_python_options
from agentrl.sandboxes.local.proc import processes_in_namespace
from agentrl.sandboxes.local.sandbox import LocalSandbox

__all__ = ["LocalSandbox", "host_python_options", "processes_in_namespace"]
