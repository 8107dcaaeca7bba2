#!/usr/bin/env bash
# Capture Qwen Code's real traffic offline into tests/fixtures/clients/qwen_code/.
#
#   scripts/capture-qwen-code.sh [QWEN]     QWEN: the qwen executable (default .cache/clis/bin/qwen)
#   ONLY="tool_session ..." scripts/capture-qwen-code.sh   recaptures only those scenarios
#
# Each scenario runs the CLI headless (env -i, HOME = a fresh temp dir holding the settings
# the qwen_code harness writes, cwd = a fresh git repo /tmp/clients/runs/<name>/repo)
# against scripts/capture_client_traffic.py, a logging stub that records every request
# and answers with the scripted replies below (@REPO@ is the repo's path). The session
# token is the dummy sess-fixture-0003.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
qwen="$(readlink -f "${1:-$root/.cache/clis/bin/qwen}")"
python="${PYTHON:-$root/.venv/bin/python}"
out="$root/tests/fixtures/clients/qwen_code"
runs=/tmp/clients/runs
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

settings() {  # what the qwen_code harness writes to $HOME/.qwen/settings.json
    cat <<'JSON'
{
  "security": {"auth": {"selectedType": "openai"}},
  "model": {"name": "agentrl-policy", "generationConfig": {"timeout": 3600000, "maxRetries": 0}},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "general": {"enableAutoUpdate": false},
  "memory": {"enableManagedAutoMemory": false, "enableManagedAutoDream": false},
  "ui": {"enableFollowupSuggestions": false},
  "experimental": {"emitToolUseSummaries": false},
  "tools": {"useRipgrep": false}
}
JSON
}

# scenario DIR NAME REPLIES LINE: in LINE, $QWEN is the CLI with its environment.
scenario() {
    local dir="$1" name="$2" replies="$3" line="$4"
    if [[ -n ${ONLY:-} && " $ONLY " != *" $dir "* ]]; then return 0; fi
    local home="$work/$name/home" repo="$runs/$name/repo"
    rm -rf "$runs/$name" "$out/$dir"/[0-9][0-9][0-9]_*.json
    mkdir -p "$home/.qwen" "$out/$dir"
    settings > "$home/.qwen/settings.json"
    printf '%s\n' "${replies//@REPO@/$repo}" > "$work/replies.json"
    local cli="env -i PATH=$PATH HOME=$home TERM=dumb LANG=C.UTF-8 NO_COLOR=1"
    cli+=" OPENAI_BASE_URL=\$BASE_URL/v1 OPENAI_API_KEY=sess-fixture-0003"
    cli+=" QWEN_CODE_SUPPRESS_YOLO_WARNING=1 $qwen --yolo --output-format stream-json"
    "$python" "$root/scripts/capture_client_traffic.py" --out "$out/$dir" \
        --replies "$work/replies.json" --cwd "$repo" -- \
        bash -c "BASE_URL={base_url}; ${line//\$QWEN/$cli}" || true
    echo "$dir: $(find "$out/$dir" -maxdepth 1 -name '[0-9]*.json' | wc -l) requests" >&2
}

WRITE_HELLO='{"content": "I will create the file.", "tool_calls": [{"name": "write_file",
  "arguments": {"file_path": "@REPO@/hello.txt", "content": "hi\n"}}]}'

scenario . qwen_code "[$WRITE_HELLO, {\"content\": \"Created hello.txt.\"}]" \
    "\$QWEN -p 'Create a file hello.txt containing hi'"

# Replies with reasoning_content: Qwen Code sends it back, trimmed, in the replayed history.
scenario reasoning_echoed qwen_code_reasoning '[
 {"reasoning": "  The user wants a file.\n\n  Write it.  ", "content": "I will create the file.",
  "tool_calls": [{"name": "write_file", "arguments": {"file_path": "@REPO@/hello.txt", "content": "hi\n"}}]},
 {"reasoning": "It is written.", "content": "Created hello.txt."}]' \
    "\$QWEN -p 'Create a file hello.txt containing hi'"

scenario tool_session qwen_code_tools '[
 {"content": "", "tool_calls": [{"name": "write_file",
   "arguments": {"file_path": "@REPO@/greet.py", "content": "print(\"helo\")\n"}}]},
 {"content": "", "tool_calls": [{"name": "read_file", "arguments": {"file_path": "@REPO@/greet.py"}}]},
 {"content": "Fixing the typo.", "tool_calls": [{"name": "edit", "arguments": {
   "file_path": "@REPO@/greet.py", "old_string": "helo", "new_string": "hello"}}]},
 {"content": "", "tool_calls": [{"name": "run_shell_command",
   "arguments": {"command": "python3 greet.py", "description": "Run the script"}}]},
 {"content": "greet.py prints hello."}]' \
    "\$QWEN -p 'Write greet.py printing helo, then fix the typo and run it'"

scenario resume_continue qwen_code_resume "[$WRITE_HELLO, {\"content\": \"Created hello.txt.\"},
 {\"content\": \"\", \"tool_calls\": [{\"name\": \"run_shell_command\",
   \"arguments\": {\"command\": \"cat hello.txt\"}}]},
 {\"content\": \"hello.txt contains hi.\"}]" \
    "\$QWEN -p 'Create a file hello.txt containing hi' && \$QWEN --continue -p 'What does it contain?'"

SUB='"match": "You are a general-purpose subagent"'
scenario subagent_agent_tool qwen_code_subagent "[
 {\"content\": \"\", \"tool_calls\": [{\"name\": \"agent\", \"arguments\": {
   \"description\": \"Create hello.txt\", \"prompt\": \"Create the file @REPO@/hello.txt containing hi\",
   \"subagent_type\": \"general-purpose\"}}]},
 {$SUB, \"content\": \"\", \"tool_calls\": [{\"name\": \"write_file\",
   \"arguments\": {\"file_path\": \"@REPO@/hello.txt\", \"content\": \"hi\\n\"}}]},
 {$SUB, \"content\": \"Created @REPO@/hello.txt.\"},
 {\"content\": \"Waiting for the sub-agent.\"},
 {\"content\": \"The sub-agent created hello.txt.\"}]" \
    "\$QWEN -p 'SUBAGENT: use a sub-agent to create a file hello.txt containing hi'"

# /compress needs a history worth compressing: a long command output first.
scenario compress_command qwen_code_compress "[
 {\"content\": \"\", \"tool_calls\": [{\"name\": \"run_shell_command\",
   \"arguments\": {\"command\": \"seq 1 4000\"}}]},
 {\"content\": \"Printed 4000 numbers.\"},
 {\"content\": \"<state_snapshot>The user asked to print 1..4000; it was done.</state_snapshot>\"},
 {\"content\": \"The last number was 4000.\"}]" \
    "\$QWEN -p 'Print the numbers 1 to 4000' && \$QWEN --continue -p '/compress' \
     && \$QWEN --continue -p 'What was the last number?'"
