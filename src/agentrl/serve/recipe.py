"""A middleware described by picklable values, built where it runs (a worker process).

::

    recipe = MiddlewareRecipe(engine="sglang", engine_url=url, tokenizer=path,
                              tool_parser="hermes", reasoning_parser="qwen3")
    check_shardable(recipe.engine, workers=4)    # ValueError for an in-process engine
    ShardedMiddleware(workers=4, build=recipe)   # each worker calls recipe()

``agentrl serve``, the rollout stack and the slime service describe their middleware this
way, so the parent hands the recipe to its workers and never loads a tokenizer (or the
libraries behind it) on their behalf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from agentrl import plugins

if TYPE_CHECKING:
    from agentrl.serve.middleware import Middleware

__all__ = ["MiddlewareRecipe", "check_shardable"]


def check_shardable(engine: str, workers: int) -> None:
    """Raise ``ValueError`` when ``workers > 1`` cannot serve the ``engine`` plugin.

    An engine located by a model path (``transformers``) holds the model in the process
    that serves: worker processes cannot share it, and each loading its own copy is not
    what anyone asked for.
    """
    if workers > 1 and plugins.get_engine(engine).location == "model_path":
        raise ValueError(
            f"--workers {workers}: the {engine!r} engine runs the model inside the middleware's "
            "process and cannot be shared by worker processes; serve the model with SGLang or "
            "vLLM (--engine sglang|vllm --engine-url ...) or use --workers 1"
        )


@attrs.frozen(kw_only=True)
class MiddlewareRecipe:
    """Everything a worker needs to build its own :class:`Middleware`; calling it builds one."""

    engine: str = "sglang"
    engine_url: str | None = None
    model_path: str | None = None
    engine_options: dict[str, Any] = attrs.field(factory=dict)
    #: A local tokenizer directory (default: ``model_path``).
    tokenizer: str | None = None
    #: Parser plugin names or classes (classes pickle by reference).
    tool_parser: Any = None
    reasoning_parser: Any = None
    prompt_mode: str = "splice"
    #: ``TrajectoryManager`` options (``fork_threshold_tokens``, ``reward_split``).
    trajectory: dict[str, Any] = attrs.field(factory=dict)
    #: Other ``Middleware`` keyword arguments (``model_name``, ``max_body_bytes``, ...).
    middleware: dict[str, Any] = attrs.field(factory=dict)

    def __call__(self) -> Middleware:
        from agentrl.serve.middleware import Middleware
        from agentrl.tokenizers import load_tokenizer
        from agentrl.trajectory import TrajectoryManager

        path = self.tokenizer or self.model_path
        if path is None:
            raise ValueError("MiddlewareRecipe needs a tokenizer (or model_path) directory")
        tokenizer = load_tokenizer(path)
        engine = plugins.get_engine(self.engine).from_options(
            self.engine_options, url=self.engine_url, model_path=self.model_path
        )
        return Middleware(
            engine=engine,
            tokenizer=tokenizer,
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            prompt_mode=self.prompt_mode,
            trajectory=TrajectoryManager(**self.trajectory),
            **self.middleware,
        )
