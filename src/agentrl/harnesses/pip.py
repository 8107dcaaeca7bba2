"""Installing a pinned Python agent CLI with pip, self-contained, for a sandbox to run as is.

``agentrl install-clis`` installs a ``python`` harness's package into its own directory::

    DEST/<binary>-<version>/site/          pip install --target (the package and its deps)
    DEST/<binary>-<version>/bin/<binary>   a launcher: python3 -m <module>, site first on sys.path
    DEST/<binary>-<version>/.installed

pip runs under the Python that runs agentrl, so binary wheels are that Python's
(``cp311`` for 3.11); the launcher runs the module with the sandbox's own ``python3.X``
(else ``python3``) and refuses, naming both versions, any other minor version. The site
directory goes on ``sys.path`` of that one process only (no ``PYTHONPATH``), so the
commands the agent runs see the task's Python untouched. ``<binary> --version`` (alone)
prints the installed package's version.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from agentrl.harnesses.errors import HarnessError
from agentrl.retry import RetryPolicy

__all__ = ["TRANSIENT_PIP", "launcher_script", "pip_install"]

logger = logging.getLogger(__name__)

#: pip failures worth retrying: network trouble and index hiccups, not bad packages.
TRANSIENT_PIP = re.compile(
    r"ConnectionError|ConnectTimeout|ReadTimeout|Read timed out|Temporary failure in name|"
    r"Connection reset|Connection refused|RemoteDisconnected|IncompleteRead|"
    r"HTTP error (?:429|5\d\d)|status code (?:429|5\d\d)",
    re.IGNORECASE,
)
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PIP_FLAGS = (
    "--no-input",
    "--disable-pip-version-check",
    "--no-warn-script-location",
    "--no-warn-conflicts",
    "--quiet",
)

# Runs under `python -c` (sys.argv: -c SITE ARGS...); no single quotes (the shell quotes it).
_BOOT = """\
import sys
site = sys.argv.pop(1)
if sys.version_info[:2] != {python!r}:
    sys.exit("{binary}: this install of {spec} is for Python {python_text} (pip --target), "
             "but %s is Python %s; use a sandbox whose python{python_text} or python3 is "
             "{python_text}, or reinstall it with `agentrl install-clis` run by a Python "
             "{python_text}" % (sys.executable, sys.version.split()[0]))
if sys.path and sys.path[0] == "":
    sys.path[0] = site
else:
    sys.path.insert(0, site)
if sys.argv[1:] == ["--version"]:
    import importlib.metadata, importlib.util
    if importlib.util.find_spec("{module}".partition(".")[0]) is None:
        sys.exit("{binary}: module {module} is missing from " + site)
    print("{binary}", importlib.metadata.version("{package}"))
    sys.exit(0)
import runpy
sys.argv[0] = "{binary}"
runpy.run_module("{module}", run_name="__main__", alter_sys=True)
"""


def launcher_script(
    *,
    binary: str,
    package: str,
    version: str,
    module: str,
    python: tuple[int, int] = (sys.version_info.major, sys.version_info.minor),
) -> str:
    """The ``bin/<binary>`` launcher of a ``pip install --target`` under ``../site``.

    ``python`` is the (major, minor) version pip installed for: the only one it runs under.
    """
    if not _MODULE.match(module):
        raise HarnessError(f"{binary}: {module!r} is not a Python module name")
    python_text = ".".join(map(str, python))
    boot = _BOOT.format(
        python=python,
        python_text=python_text,
        binary=binary,
        package=package,
        spec=f"{package}=={version}",
        module=module,
    )
    if "'" in boot:  # the shell line quotes it in single quotes
        raise HarnessError(f"{binary}: {package!r} cannot be quoted in its launcher")
    return (
        "#!/bin/sh\n"
        f"# {package}=={version} for Python {python_text}, installed by `agentrl install-clis`.\n"
        'prefix=$(dirname "$(dirname "$(readlink -f "$0")")")\n'
        f"py=$(command -v python{python_text} || command -v python3) || {{\n"
        f'  echo "{binary}: no python3 on PATH; {package} needs Python {python_text}" >&2\n'
        "  exit 127\n"
        "}\n"
        f'exec "$py" -c \'{boot}\' "$prefix/site" "$@"\n'
    )


def pip_install(
    *,
    package: str,
    version: str,
    binary: str,
    module: str,
    prefix: pathlib.Path,
    attempts: int,
    python: str = sys.executable,
) -> pathlib.Path:
    """``pip install --target PREFIX/site PACKAGE==VERSION`` plus the launcher; returns it.

    A transient failure (network, index 429/5xx) is retried with jittered backoff; any other
    raises ``HarnessError`` with pip's output.
    """
    spec = f"{package}=={version}"
    argv = [python, "-m", "pip", "install", "--target", str(prefix / "site"), *_PIP_FLAGS, spec]
    for attempt in range(1, attempts + 1):
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            raise HarnessError(f"could not run {python} -m pip: {exc}") from exc
        if proc.returncode == 0:
            break
        output = (proc.stderr + "\n" + proc.stdout).strip()
        if "No module named pip" in output:
            raise HarnessError(
                f"{python} has no pip, and {spec} must be installed with it; run agentrl "
                "install-clis from a Python with pip (a virtual environment has it)"
            )
        if not TRANSIENT_PIP.search(output) or attempt == attempts:
            raise HarnessError(
                f"`pip install {spec}` failed (exit {proc.returncode}, attempt "
                f"{attempt}/{attempts}): {output[-1500:] or 'no output'}; check the version "
                "and your access to the package index, then rerun agentrl install-clis"
            )
        delay = RetryPolicy(attempts=attempts).delay(attempt)
        logger.warning("pip install %s failed transiently, retrying in %.1fs", spec, delay)
        time.sleep(delay)
    launcher = prefix / "bin" / binary
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(
        launcher_script(binary=binary, package=package, version=version, module=module)
    )
    launcher.chmod(0o755)
    check = subprocess.run(
        [str(launcher), "--version"], capture_output=True, text=True, check=False, env=os.environ
    )
    if check.returncode != 0 or version not in check.stdout:
        raise HarnessError(
            f"pip installed {spec} but `{launcher} --version` answered "
            f"{(check.stdout + check.stderr).strip()[-500:]!r}; is {module} the module of "
            f"{package} that runs `{binary}`?"
        )
    return launcher
