#!/bin/bash
set -e

run_selected_tests() {
  local test_files=("$@")
  cd /app
  pytest -v "${test_files[@]}"
}

if [ $# -eq 0 ]; then
  echo 'no test files given' >&2
  exit 1
fi
IFS=',' read -r -a files <<< "$1"
run_selected_tests "${files[@]}"
