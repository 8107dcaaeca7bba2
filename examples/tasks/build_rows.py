"""Writes scaleswe.jsonl and swebench.jsonl from the files beside this script.

The rows embed issue texts, an f2p script, a test patch and an eval script; keeping their
sources as files and generating the JSONL keeps the two in step. Run it after editing any
of them: ``python examples/tasks/build_rows.py`` (``--check`` only compares).
"""

from __future__ import annotations

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
PYTEST = "python -m pytest -p no:cacheprovider"


def _read(relative: str) -> str:
    return (HERE / relative).read_text()


def _row(instance_id: str, issue: str, metadata: dict) -> dict:
    statement = _read(f"issues/{issue}.md")
    return {
        "prompt": statement,
        "label": instance_id,
        "metadata": {"instance_id": instance_id, "problem_statement": statement, **metadata},
    }


def scaleswe_rows() -> list[dict]:
    """One row per scaleswe grading method: eval_cmd, f2p_script, swepro."""
    separators = "tests/test_separators.py"
    return [
        _row(
            "textstats-1",
            "textstats",
            {
                "repo": "repos/textstats",
                "workdir": "/workspace",
                "eval_cmd": f"{PYTEST} -q tests/test_core.py",
                "gold_patch_path": "gold/textstats.diff",
            },
        ),
        _row(
            "intervals-1",
            "intervals",
            {
                "repo": "repos/intervals",
                "workdir": "/workspace",
                "remote_env_info": {"f2p_script": _read("f2p/intervals.py")},
                "gold_patch_path": "gold/intervals.diff",
            },
        ),
        _row(
            "slugkit-1",
            "slugkit",
            {
                "repo": "repos/slugkit",
                "workdir": "/workspace",
                "swepro": {
                    "run_script_path": "swepro/run_script.sh",
                    "parser_script_path": "swepro/parser.py",
                    "selected_test_files": [separators, "tests/test_slug.py"],
                    "fail_to_pass": [
                        f"{separators}::test_punctuation_and_spaces_collapse_to_one_separator",
                        f"{separators}::test_no_leading_or_trailing_separator",
                        f"{separators}::test_custom_separator",
                    ],
                    "pass_to_pass": [
                        "tests/test_slug.py::test_single_word",
                        "tests/test_slug.py::test_accents_are_dropped",
                        "tests/test_slug.py::test_unique_slug_numbers_duplicates",
                    ],
                },
                "gold_patch_path": "gold/slugkit.diff",
            },
        ),
    ]


def _eval_script(test_file: str, test_patch: str) -> str:
    """A SWE-bench style eval script: reset the test file, apply the test patch, run."""
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            f"git checkout HEAD -- {test_file}",
            "git apply -v - <<'EOF_AGENTRL_TEST_PATCH'",
            test_patch.rstrip("\n"),
            "EOF_AGENTRL_TEST_PATCH",
            ": '>>>>> Start Test Output'",
            f"{PYTEST} -rA {test_file}",
            ": '>>>>> End Test Output'",
            f"git checkout HEAD -- {test_file}",
            "",
        ]
    )


def swebench_rows() -> list[dict]:
    """A SWE-bench instance that swebench 5.x builds (it carries its eval script)."""
    test_file = "tests/test_version.py"
    test_patch = _read("test_patches/semver_lite.diff")
    statement = _read("issues/semver_lite.md")
    instance = {
        "instance_id": "semver_lite-1",
        "repo": "agentrl-examples/semver_lite",
        "version": "0.1",
        "problem_statement": statement,
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "patch": _read("gold/semver_lite.diff"),
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps([f"{test_file}::test_compare_numeric_components"]),
        "PASS_TO_PASS": json.dumps(
            [
                f"{test_file}::test_parse_round_trips",
                f"{test_file}::test_parse_rejects_garbage",
                f"{test_file}::test_compare_equal_and_prerelease",
            ]
        ),
        "environment_setup_commit": "",
        "workdir": "/testbed",
        "eval_script": _eval_script(test_file, test_patch),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    return [
        {
            "prompt": statement,
            "label": "semver_lite-1",
            "metadata": {"repo": "repos/semver_lite", "remote_env_info": instance},
        }
    ]


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def outputs() -> dict[pathlib.Path, str]:
    return {
        HERE / "scaleswe.jsonl": render(scaleswe_rows()),
        HERE / "swebench.jsonl": render(swebench_rows()),
    }


def main(argv: list[str]) -> int:
    stale = [
        path for path, text in outputs().items() if not path.exists() or path.read_text() != text
    ]
    if "--check" in argv:
        for path in stale:
            print(f"{path} is out of date; run python {pathlib.Path(__file__).name}")
        return 1 if stale else 0
    for path, text in outputs().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
