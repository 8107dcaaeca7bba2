"""Token-level inference engines (built-in plugin `agentrl.engines`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_engines(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.engines.sglang import SGLangEngine
    from agentrl.engines.transformers import TransformersEngine
    from agentrl.engines.vllm import VLLMEngine

    register(SGLangEngine)
    register(TransformersEngine)
    register(VLLMEngine)
