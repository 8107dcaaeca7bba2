"""Small real wheels for pip to install offline: stand-ins for a Python agent CLI's package."""

from __future__ import annotations

import pathlib
import zipfile

#: A module that prints its argv, the PYTHONPATH it sees and where its package was loaded.
MAIN = """\
import os, sys
import {package}
print("argv", sys.argv[1:])
print("pythonpath", os.environ.get("PYTHONPATH", ""))
print("from", os.path.dirname({package}.__file__))
"""


def build_wheel(directory: pathlib.Path, name: str, version: str, module: str) -> pathlib.Path:
    """``NAME-VERSION-py3-none-any.whl`` holding package ``module`` (runnable with -m)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": "",
        f"{module}/__main__.py": MAIN.format(package=module),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(path, text)
    return wheel
