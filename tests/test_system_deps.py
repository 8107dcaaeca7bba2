"""``scripts/system-deps.sh``: apt waits for a lock another apt holds instead of failing.

The tests run the script's ``apt_get`` with real apt-get against a private apt state
(``APT_CONFIG``: its own package lists directory and cache, no sources), whose lists lock
this test holds the way apt does (an fcntl lock), as a concurrent ``apt-get update`` would.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "system-deps.sh"


def _private_apt(tmp_path: Path) -> dict[str, str]:
    """The environment of an apt-get whose state lives under ``tmp_path`` (nothing to fetch)."""
    for sub in ("lists/partial", "cache/archives/partial", "sources.list.d"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "sources.list").write_text("")
    conf = tmp_path / "apt.conf"
    conf.write_text(
        f'Dir::State::Lists "{tmp_path}/lists";\n'
        f'Dir::Cache "{tmp_path}/cache";\n'
        f'Dir::Etc::SourceList "{tmp_path}/sources.list";\n'
        f'Dir::Etc::SourceParts "{tmp_path}/sources.list.d";\n'
    )
    return {**os.environ, "APT_CONFIG": str(conf)}


def _apt_update(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "-c", f'source "{SCRIPT}"; apt_get update -qq'],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hold_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    return fd


def test_apt_get_update_waits_for_the_lists_lock_another_apt_holds(tmp_path):
    """Another apt holds the package lists' lock: the script's ``apt-get update`` says it
    waits, is still running, and succeeds once the lock is let go, where it used to fail
    at once with "Could not get lock" (DPkg::Lock::Timeout does not cover that lock)."""
    env = _private_apt(tmp_path)
    fd = _hold_lock(tmp_path / "lists" / "lock")
    proc = _apt_update(env)
    try:
        first = proc.stderr.readline()
        assert "another apt holds its lock; waiting up to 600s" in first, first
        assert proc.poll() is None
    finally:
        os.close(fd)  # lets go of the lock
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def test_apt_get_gives_up_at_the_deadline_with_apts_error(tmp_path):
    """APT_LOCK_WAIT=0 and the lock still held: the script fails with apt's own error."""
    env = {**_private_apt(tmp_path), "APT_LOCK_WAIT": "0"}
    fd = _hold_lock(tmp_path / "lists" / "lock")
    try:
        proc = _apt_update(env)
        _, err = proc.communicate(timeout=120)
    finally:
        os.close(fd)
    assert proc.returncode != 0
    assert "Could not get lock" in err, err
