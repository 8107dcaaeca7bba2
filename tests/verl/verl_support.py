"""What the verl tests share: verl itself (required in CI), a server manager speaking verl's
generate contract, and an ``AgentLoopWorker`` holding just what verl's own methods read."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest
from rollout_support import TASKS

from agentrl.engines.sglang import SGLangEngine
from agentrl.testing.scripted_engine import ScriptedEngine, ScriptedReply

REPO = pathlib.Path(__file__).resolve().parents[2]
#: Where ``make verl-deps`` installs verl and the few dependencies the venv lacks.
VERL_SITE = REPO / ".cache" / "verl"


def import_verl():
    """verl's agent-loop module; fails in CI (``CI=true``) when verl is missing, skips elsewhere."""
    if VERL_SITE.is_dir() and str(VERL_SITE) not in sys.path:
        sys.path.append(str(VERL_SITE))  # appended: the venv's own packages win
    try:
        from verl.experimental.agent_loop import agent_loop
    except ImportError as exc:
        message = (
            f"verl is not importable ({exc}); run `make verl-deps` (installs the pinned "
            f"verl into {VERL_SITE})"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return agent_loop


class ForwardingServerManager:
    """verl's ``LLMServerClient.generate`` contract, served by an agentrl engine.

    It returns verl's own ``TokenOutput`` (``stop_reason`` ``completed``/``aborted``/``length``
    as verl's vLLM server says) and records every call as verl received it.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        params = dict(sampling_params)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **params})
        assert params.pop("logprobs") is True
        params["max_new_tokens"] = params.pop("max_tokens", 256)
        gen = await self.engine.generate(prompt_ids, params, routing_key=request_id)
        stop = {"abort": "aborted", "length": "length"}.get(gen.finish_reason, "completed")
        return TokenOutput(
            token_ids=list(gen.output_ids),
            log_probs=list(gen.logprobs),
            stop_reason=stop,
            extra_fields={"global_steps": 7},
        )


def verl_config(tokenizer_dir, *, prompt_length: int, response_length: int, loop_config: str):
    """The slice of verl's trainer config an agent loop and its worker read."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(tokenizer_dir)},
                "rollout": {
                    "name": "vllm",
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "agent": {
                        "agent_loop_config_path": loop_config,
                        "default_agent_loop": "agentrl",
                    },
                },
            },
            "data": {"apply_chat_template_kwargs": {}},
        }
    )


def agent_loop_worker(agent_loop, config, tokenizer, server_manager):
    """verl's ``AgentLoopWorker`` without its Ray and dataset start-up: the attributes its
    ``_run_agent_loop``, ``_agent_loop_postprocess`` and ``_postprocess`` read, and the
    agent-loop registry filled from ``agent_loop_config_path`` as its ``__init__`` does."""
    from omegaconf import OmegaConf

    worker = agent_loop.AgentLoopWorker.__new__(agent_loop.AgentLoopWorker)
    worker.config = config
    worker.llm_client = server_manager
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = None
    worker.dataset_cls = None
    worker.tools = []
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    for entry in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path):
        agent_loop._agent_loop_registry[entry.name] = entry
    return worker


#: verl's rollout.prompt_length in the end-to-end runs (Claude Code's first prompt is ~12k).
PROMPT = 32768

FIX = (
    "python3 - <<'PY'\nimport pathlib\np = pathlib.Path('textstats/core.py')\ns = p.read_text()\n"
    "s = s.replace('text.split(\" \")', 'text.split()')\n"
    "s = s.replace('        result.append(token)', "
    "'        if token:\\n            result.append(token)')\np.write_text(s)\n"
    "print('AGENTRL-' + 'FIX-APPLIED')\nPY"
)


def script_solution(tokenizer):
    def reply(body, headers) -> ScriptedReply:
        prompt = tokenizer.decode(body["input_ids"], skip_special_tokens=False)
        if "AGENTRL-FIX-APPLIED" in prompt:
            return ScriptedReply(text="All done: the fix is in place.")
        call = json.dumps({"name": "Bash", "arguments": {"command": FIX}})
        return ScriptedReply(text=f"Fixing it.\n<tool_call>\n{call}\n</tool_call>")

    return reply


def task_row() -> dict:
    row = json.loads(TASKS.read_text().splitlines()[0])
    row["metadata"]["repo"] = str(TASKS.parent / row["metadata"]["repo"])
    row["metadata"].pop("gold_patch_path", None)
    return row


def verl_row(task: dict | None) -> dict:
    """A row as verl's RLHFDataset hands it to an agent loop (the task in ``extra_info``)."""
    extra = {"index": 0} if task is None else {"index": 0, "agentrl_task": task}
    return {
        "raw_prompt": np.array([{"role": "user", "content": "fix textstats"}], dtype=object),
        "data_source": "agentrl/textstats",
        "extra_info": extra,
        "agent_name": "agentrl",
    }


async def run_rows(agent_loop, worker, rows):
    """verl's own path for a batch: ``_run_agent_loop`` per row, then ``_postprocess``."""
    params = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
    }
    outputs = []
    for k, row in enumerate(rows):
        trajectory = {"step": 1, "sample_index": k, "rollout_n": 0, "validate": False}
        outputs.append(await worker._run_agent_loop(dict(params), trajectory, trace=False, **row))
    return outputs, worker._postprocess(outputs, input_non_tensor_batch=None)


async def serve(tokenizer, tokenizer_dir, path, responder, rows, *, prompt_length, response_length):
    """Run ``rows`` through verl's worker methods, served by the scripted engine."""
    agent_loop = import_verl()
    from agentrl.verl.loop import close_stacks

    config = verl_config(
        tokenizer_dir,
        prompt_length=prompt_length,
        response_length=response_length,
        loop_config=str(path),
    )
    engine = ScriptedEngine(tokenizer, responder=responder)
    await engine.start()
    client = SGLangEngine(engine.url)
    manager = ForwardingServerManager(client)
    worker = agent_loop_worker(agent_loop, config, tokenizer, manager)
    try:
        outputs, batch = await run_rows(agent_loop, worker, rows)
    finally:
        await close_stacks()
        await client.aclose()
        await engine.close()
    return outputs, batch, engine, manager
