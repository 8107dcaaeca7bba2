#!/bin/bash
# Runs the selected test files (one comma-separated argument) with pytest, reporting
# every test's outcome in pytest's "-rA" summary for parser.py to read.
set -u
IFS=',' read -r -a files <<< "${1:-}"
if [ "${#files[@]}" -eq 0 ]; then files=(tests); fi
py="$(command -v python || command -v python3)"
"$py" -m pytest -rA -p no:cacheprovider "${files[@]}"
