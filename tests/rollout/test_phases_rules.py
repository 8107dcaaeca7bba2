"""The outcome and reward rules of one rollout (``agentrl.rollout.phases``), one by one.

No agent CLI runs here: each rule is exercised on ``State``, ``classify`` and
``Phases._judge`` directly, so a change to any rule (the mutants these tests were written
against: dropping "before the policy acted", letting a later failure overwrite an
untrainable outcome, paying an untrainable rollout, ``>=`` to ``>`` at the context
boundary, reward for solved-as-reward) fails a test here.
"""

from __future__ import annotations

import asyncio

import pytest

from agentrl.harnesses.base import EXIT_TIME_BUDGET_EXCEEDED
from agentrl.harnesses.errors import HarnessError
from agentrl.rollout import RolloutConfig
from agentrl.rollout.phases import Failure, Phases, State, classify
from agentrl.sandboxes.base import SandboxError
from agentrl.types import Grade, Outcome, TurnFact

CONFIG = RolloutConfig(max_context_tokens=1000, agent_time_budget=60, eval_timeout=60)
TURN = TurnFact(prompt_tokens=100, output_tokens=20, finish_reason="stop")
SOLVED = Grade(reward=1.0, solved=True)
UNSOLVED = Grade(reward=0.0, solved=False)


def state(**values) -> State:
    """A state at the end of the agent phase: the CLI exited 0 after one recorded turn."""
    return State(sid="s", **{"exit_code": 0, "recorded_turns": 1, **values})


def classified(turns=(TURN,), **values) -> State:
    result = state(**values)
    classify(result, list(turns), CONFIG)
    return result


# -- State.fail and State.reward ----------------------------------------------------------


def test_a_later_failure_never_overwrites_an_untrainable_outcome():
    """infra_error first, agent_error later: the infra_error (and its message) stays."""
    s = state()
    s.fail(Outcome.INFRA_ERROR, "the sandbox did not boot")
    s.fail(Outcome.AGENT_ERROR, "the CLI exited 1")
    assert s.outcome is Outcome.INFRA_ERROR and s.error == "the sandbox did not boot"


def test_an_untrainable_failure_overwrites_a_trainable_one():
    """agent_error first, infra_error later: the untrainable outcome wins."""
    s = state()
    s.fail(Outcome.AGENT_ERROR, "the CLI exited 1")
    s.fail(Outcome.GRADER_ERROR, "the grader broke")
    assert s.outcome is Outcome.GRADER_ERROR


@pytest.mark.parametrize("outcome", [Outcome.INFRA_ERROR, Outcome.GRADER_ERROR])
def test_an_untrainable_rollout_is_never_paid_the_graders_reward(outcome):
    """A solved grade on an infra or grader error pays 0."""
    assert state(outcome=outcome, grade=SOLVED).reward == 0.0


def test_a_trainable_rollout_is_paid_the_graders_reward_as_it_is():
    """A shaped reward (0.25) reaches the trainer unchanged; no grade pays 0."""
    shaped = Grade(reward=0.25, solved=False)
    assert state(outcome=Outcome.UNSOLVED, grade=shaped).reward == 0.25
    assert state(outcome=Outcome.SOLVED, grade=SOLVED).reward == 1.0
    assert state(outcome=Outcome.UNSOLVED).reward == 0.0


def test_a_suspicious_grade_pays_nothing_whatever_its_reward():
    """A grader that flagged suspicious edits but left a reward: still 0."""
    flagged = Grade(reward=1.0, solved=False, suspicious=("pkg/__init__.py:3: os._exit(0)",))
    assert state(outcome=Outcome.REWARD_HACK_SUSPECTED, grade=flagged).reward == 0.0


# -- classify ---------------------------------------------------------------------------


def test_solved_comes_from_grade_solved_not_from_the_reward():
    """Reward 1 without solved is unsolved; solved with a shaped reward is solved."""
    assert classified(grade=Grade(reward=1.0, solved=False)).outcome is Outcome.UNSOLVED
    assert classified(grade=Grade(reward=0.5, solved=True)).outcome is Outcome.SOLVED


def test_suspicious_edits_are_reward_hack_suspected_and_train():
    """A guard hit is its own trainable outcome, named in the error, before time-outs."""
    flagged = Grade(reward=0.0, solved=False, suspicious=("a.py:1: os._exit(0)  [os-exit]",))
    for code in (0, 1, EXIT_TIME_BUDGET_EXCEEDED):
        result = classified(grade=flagged, exit_code=code)
        assert result.outcome is Outcome.REWARD_HACK_SUSPECTED
        assert result.outcome.trainable and "os._exit" in result.error


def test_a_first_untrainable_outcome_survives_classify():
    """classify keeps an infra error set earlier, even with a solved grade."""
    result = classified(outcome=Outcome.INFRA_ERROR, error="guard fired", grade=SOLVED)
    assert result.outcome is Outcome.INFRA_ERROR and result.error == "guard fired"


@pytest.mark.parametrize(
    ("used", "overflowed"), [(1000, True), (1001, True), (999, False)], ids=["at", "past", "under"]
)
def test_the_context_budget_boundary(used, overflowed):
    """A last turn cut by length whose prompt + output reach the budget exactly (or pass
    it) is context_overflow; one token short is not."""
    last = TurnFact(prompt_tokens=used - 50, output_tokens=50, finish_reason="length")
    result = classified(turns=(TURN, last), grade=UNSOLVED)
    expected = Outcome.CONTEXT_OVERFLOW if overflowed else Outcome.UNSOLVED
    assert result.outcome is expected


def test_the_time_budget_and_exit_codes():
    """Time budget exceeded is timeout; a non-zero exit is agent_error; exit 0 unsolved."""
    assert classified(exit_code=EXIT_TIME_BUDGET_EXCEEDED).outcome is Outcome.TIMEOUT
    assert classified(exit_code=2, grade=UNSOLVED).outcome is Outcome.AGENT_ERROR
    assert classified(grade=UNSOLVED).outcome is Outcome.UNSOLVED


def test_no_turn_reaching_the_engine_is_infra():
    """An agent that never reached the engine did not act: infra_error."""
    result = classified(turns=(), recorded_turns=0, grade=SOLVED)
    assert result.outcome is Outcome.INFRA_ERROR


# -- Phases._judge: whose failure a sandbox failure is ------------------------------------


class Session:
    """The counters ``Phases`` reads from a middleware session."""

    closed = True
    turn_facts = ()

    def __init__(self, recorded: int) -> None:
        self.turns_recorded = self.turns_started = recorded


class Lost:
    """A sandbox whose backend does or does not say it lost the sandbox itself."""

    def __init__(self, external: bool) -> None:
        self.external = external

    async def lost_externally(self, error: BaseException) -> bool:
        return self.external


def judge(recorded: int, error: Exception, external: bool = False) -> Failure:
    phases = Phases(
        task=None,
        harness=None,
        grader=None,
        sandbox_factory=None,
        middleware=None,
        config=CONFIG,
        sampling_params={},
        booter=None,
        prompt="",
        state=State(sid="s"),
        session=Session(recorded),
    )
    return asyncio.run(phases._judge(Lost(external), "capture the diff", error))


def test_a_sandbox_failure_before_the_policy_acted_is_infra():
    """No turn recorded yet: the policy cannot have caused it."""
    failure = judge(0, SandboxError("exec failed"))
    assert failure.outcome is Outcome.INFRA_ERROR and "before the policy acted" in str(failure)


@pytest.mark.parametrize("error", [SandboxError("gone"), HarnessError("no diff"), OSError("io")])
def test_a_sandbox_failure_after_the_policy_acted_is_the_agents(error):
    """A recorded turn and no word from the backend: agent_error (reward 0, it trains)."""
    assert judge(1, error).outcome is Outcome.AGENT_ERROR


def test_a_backend_that_lost_the_sandbox_makes_it_infra():
    """After the policy acted, only the backend's own evidence makes it infra."""
    assert judge(3, SandboxError("gone"), external=True).outcome is Outcome.INFRA_ERROR


def test_a_bug_of_ours_is_infra_with_its_traceback():
    """An exception no sandbox raises (our bug) is infra_error, its traceback kept."""
    failure = judge(3, KeyError("oops"))
    assert failure.outcome is Outcome.INFRA_ERROR and "KeyError" in failure.trace
