"""Reads pytest "-rA" output and writes {"tests": [{"name", "status"}]} as JSON.

Usage: parser.py STDOUT_LOG STDERR_LOG RESULT_JSON
"""

import json
import re
import sys

STATUS = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def main(stdout_path: str, stderr_path: str, result_path: str) -> None:
    tests = {}
    for path in (stdout_path, stderr_path):
        with open(path, errors="replace") as handle:
            for line in handle:
                match = STATUS.match(line)
                if match:
                    tests[match.group(2)] = match.group(1)
    with open(result_path, "w") as handle:
        json.dump({"tests": [{"name": n, "status": s} for n, s in tests.items()]}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
