"""``agentrl.verl.engine.VerlEngine``: agentrl's Engine contract over verl's generate call.

The server manager here returns verl's own ``TokenOutput`` (imported from the real verl
package) as verl's vLLM server fills it; what it receives is recorded, so each test checks
both directions of the contract without a server.
"""

from __future__ import annotations

import pytest
from verl_support import import_verl

from agentrl.engines.base import EngineError
from agentrl.verl import VerlEngine, verl_sampling_params


class RecordingManager:
    """verl's ``generate(request_id, prompt_ids=..., sampling_params=...)``, replying from a list."""

    def __init__(self, *outputs) -> None:
        self.outputs = list(outputs)
        self.calls: list[tuple] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        return self.outputs.pop(0)


def _token_output(**fields):
    import_verl()
    from verl.workers.rollout.replica import TokenOutput

    return TokenOutput(**fields)


def test_sampling_params_keep_what_both_verl_servers_read():
    """SGLang-only keys are dropped, max_new_tokens becomes max_tokens, log-probs are on."""
    params = verl_sampling_params(
        {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "max_new_tokens": 321,
            "stop_token_ids": [151645],
            "no_stop_trim": True,
            "skip_special_tokens": False,
            "stop": None,
        }
    )
    assert params == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "stop_token_ids": [151645],
        "max_tokens": 321,
        "logprobs": True,
    }


async def test_a_turn_goes_through_verl_sticky_to_its_session():
    """The session id is verl's request id; ids, log-probs and stop reason come back exact."""
    manager = RecordingManager(
        _token_output(
            token_ids=[5, 6, 7],
            log_probs=[-0.5, -0.25, -0.125],
            stop_reason="completed",
            extra_fields={"global_steps": 3},
        ),
        _token_output(
            token_ids=[8], log_probs=[-1.0], stop_reason="aborted", extra_fields={"global_steps": 4}
        ),
    )
    engine = VerlEngine(manager)
    first = await engine.generate([1, 2], {"max_new_tokens": 8}, rid="r1", routing_key="sess")
    second = await engine.generate([1, 2, 5, 6, 7], {}, rid="r2", routing_key="sess")
    assert (first.output_ids, first.logprobs, first.finish_reason) == (
        (5, 6, 7),
        (-0.5, -0.25, -0.125),
        "stop",
    )
    assert second.finish_reason == "abort"  # the middleware continues it
    assert [c[0] for c in manager.calls] == ["sess", "sess"]
    assert manager.calls[0][2] == {"max_tokens": 8, "logprobs": True}
    assert engine.pop_steps("sess") == (3, 4) and engine.pop_steps("sess") == (None, None)


async def test_a_server_without_logprobs_is_an_error_saying_what_to_fix():
    """verl's output without log-probs cannot train token-exactly: EngineError says why."""
    engine = VerlEngine(RecordingManager(_token_output(token_ids=[5], log_probs=None)))
    with pytest.raises(EngineError, match="one per token"):
        await engine.generate([1], {}, routing_key="s")


def test_something_that_is_not_a_server_manager_is_refused():
    """A wrong object fails at construction, naming what was expected."""
    with pytest.raises(TypeError, match="server manager"):
        VerlEngine(object())


async def test_a_budget_hit_verls_vllm_server_calls_completed_is_a_length_finish():
    """verl's vLLM server reports vLLM's ``length`` as ``completed``: an output that used all
    of ``max_tokens`` is ``length`` again, unless it ends in EOS or a stop token id (vLLM
    checks those first); SGLang's ``length`` passes through."""
    manager = RecordingManager(
        _token_output(token_ids=[5, 6, 7], log_probs=[-0.1] * 3, stop_reason="completed"),
        _token_output(token_ids=[5, 6, 2], log_probs=[-0.1] * 3, stop_reason="completed"),
        _token_output(token_ids=[5, 6, 9], log_probs=[-0.1] * 3, stop_reason="completed"),
        _token_output(token_ids=[5, 6], log_probs=[-0.1] * 2, stop_reason="completed"),
        _token_output(token_ids=[5, 6], log_probs=[-0.1] * 2, stop_reason="length"),
    )
    engine = VerlEngine(manager, eos_token_ids=[2])
    finishes = [
        (await engine.generate([1], params, routing_key="s")).finish_reason
        for params in (
            {"max_new_tokens": 3},
            {"max_new_tokens": 3},
            {"max_new_tokens": 3, "stop_token_ids": [9]},
            {"max_new_tokens": 3},
            {"max_new_tokens": 3},
        )
    ]
    assert finishes == ["length", "stop", "stop", "stop", "length"]
