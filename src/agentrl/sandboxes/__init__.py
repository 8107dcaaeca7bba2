"""Sandbox backends (built-in plugin `agentrl.sandboxes`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_sandboxes(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.sandboxes.docker import DockerSandbox
    from agentrl.sandboxes.e2b import E2BSandbox
    from agentrl.sandboxes.local import LocalSandbox

    register(DockerSandbox)
    register(E2BSandbox)
    register(LocalSandbox)
