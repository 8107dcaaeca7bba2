"""Parse the test run's stdout into the result.json SWE-bench Pro's harness reads."""

import json
import re
import sys


def parse(stdout: str) -> list[dict]:
    tests = []
    for match in re.finditer(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)", stdout, re.M):
        tests.append({"name": match.group(1), "status": match.group(2)})
    return tests


if __name__ == "__main__":
    stdout_path, _stderr_path, output_path = sys.argv[1:4]
    with open(stdout_path) as handle:
        tests = parse(handle.read())
    with open(output_path, "w") as handle:
        json.dump({"tests": tests}, handle)
