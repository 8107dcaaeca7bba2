"""The ``local`` sandbox: bubblewrap on this machine.

``sandbox`` holds ``LocalSandbox`` (the lifecycle), configured by ``options``
(``LocalOptions``); it composes ``bwrap`` (the mounts, bubblewrap's command line and
process), ``exec`` (the request protocol with the in-sandbox scripts of ``scripts``),
``limits`` (memory and process limits), ``fs`` (workspace and host-path handling) and
``proc`` (process and namespace helpers).
"""

from __future__ import annotations

from agentrl.sandboxes.local.fs import host_python_options
from agentrl.sandboxes.local.options import LocalOptions
from agentrl.sandboxes.local.proc import processes_in_namespace
from agentrl.sandboxes.local.sandbox import LocalSandbox

__all__ = ["LocalOptions", "LocalSandbox", "host_python_options", "processes_in_namespace"]
