"""Graders: task row formats and grading methods (built-in plugin `agentrl.graders`)."""

from __future__ import annotations

from agentrl.hookspecs import hookimpl


@hookimpl(trylast=True)
def register_graders(register):
    """Register the built-in classes; heavy dependencies load only when one is used."""
    from agentrl.graders.scaleswe import ScaleSWEGrader
    from agentrl.graders.swebench import SWEBenchGrader

    register(ScaleSWEGrader)
    register(SWEBenchGrader)
