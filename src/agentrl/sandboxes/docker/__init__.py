"""The ``docker`` sandbox: containers on a Docker daemon, through aiodocker.

``sandbox`` holds ``DockerSandbox`` (the lifecycle and files), configured by ``options``
(``DockerOptions``); ``container`` builds what a container is created with (limits,
mounts, the service relays), ``execs`` runs one command (process group, capped output),
``labels`` labels containers and sweeps leftovers, ``users`` gives the image an ``agent``
account, ``images`` lists the daemon's images once for a run and pulls, ``client`` wraps
aiodocker and its errors. aiodocker is imported only when a sandbox talks to a daemon.
"""

from __future__ import annotations

from agentrl.sandboxes.docker.client import MissingImageError
from agentrl.sandboxes.docker.options import DockerOptions
from agentrl.sandboxes.docker.sandbox import DockerSandbox

__all__ = ["DockerOptions", "DockerSandbox", "MissingImageError"]
