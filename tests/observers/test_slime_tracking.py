"""Inside slime: the per-process agent service builds its stack with the trackers
``AGENTRL_TRACK`` names (the stack then registers them, as test_stack_tracking shows)."""

from __future__ import annotations

import pytest

from agentrl.slime.config import SlimeConfig
from agentrl.slime.service import Service, ServiceSettings


def test_the_slime_service_tracks_what_agentrl_track_names(monkeypatch, tmp_path):
    """AGENTRL_TRACK / AGENTRL_TRACK_DIR / AGENTRL_TRACK_PROJECT reach the service's
    ``StackOptions.track``."""
    monkeypatch.setenv("AGENTRL_TRACK", "tensorboard,wandb")
    monkeypatch.setenv("AGENTRL_TRACK_DIR", str(tmp_path))
    monkeypatch.setenv("AGENTRL_TRACK_PROJECT", "grpo")
    built = []

    class Stopped(Exception):
        pass

    class StandInStack:
        def __init__(self, options):
            built.append(options)

        async def __aenter__(self):
            raise Stopped("the options are all this test needs")

        async def aclose(self):
            pass

    monkeypatch.setattr("agentrl.rollout.stack.Stack", StandInStack)
    config = SlimeConfig.from_env(
        {"AGENTRL_SANDBOX": "local", "AGENTRL_UNIX_SOCKET": str(tmp_path / "mw.sock")}
    )
    settings = ServiceSettings(
        hf_checkpoint=str(tmp_path),
        sglang_url="http://127.0.0.1:9",
        max_context_tokens=0,
        tool_parser=None,
        reasoning_parser=None,
        config=config,
    )
    service = Service(settings)
    try:
        with pytest.raises(Stopped):
            service.ready.result(30)
    finally:
        service.shutdown()
    (options,) = built
    assert options.track.trackers == ("tensorboard", "wandb")
    assert options.track.directory == tmp_path and options.track.project == "grpo"
