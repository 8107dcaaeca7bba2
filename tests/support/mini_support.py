"""The mini-swe-agent rollout tests' shared pieces: a scripted solution of the textstats
example task with mini-swe-agent's ``bash`` tool, and the token-exactness check."""

from __future__ import annotations

from rollout_support import BUGGY, FIXED, RUN_TESTS, tool_call

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: The fix, as a policy writes it with mini-swe-agent's bash tool.
EDIT = (
    "python3 - <<'EOF'\n"
    "import pathlib\n"
    "path = pathlib.Path('textstats/core.py')\n"
    f"path.write_text(path.read_text().replace({BUGGY!r}, {FIXED!r}))\n"
    "EOF"
)


def mini_solution() -> list[str]:
    """Read the module, fix it, run the tests, submit: four turns of one bash call each."""
    return [
        "Let me look at how words are split.\n"
        + tool_call("bash", command="cat textstats/core.py"),
        "split(' ') keeps empty tokens; split() does not.\n" + tool_call("bash", command=EDIT),
        tool_call("bash", command=RUN_TESTS),
        "The tests pass.\n" + tool_call("bash", command=SUBMIT),
    ]


def trained_runs_are_the_outputs(result, engine) -> bool:
    """One sample whose trained tokens are exactly every engine output, in order."""
    [sample] = result.samples
    response = sample.tokens[sample.prompt_length :]
    trained = [t for t, m in zip(response, sample.loss_mask, strict=True) if m]
    logprobs = [lp for lp, m in zip(sample.rollout_logprobs, sample.loss_mask, strict=True) if m]
    served = [g for g in engine.served if g.routing_key == result.session_id]
    return trained == [t for g in served for t in g.output_ids] and logprobs == [
        lp for g in served for lp in g.logprobs
    ]
