"""A stand-in for SGLang's parser modules, laid out on disk as SGLang lays them out.

CI does not install SGLang (it is heavy), yet a slime job always has it. To test what
agentrl does with SGLang's modules present, :func:`install` writes a tiny ``sglang``
package into a directory and puts it first on ``sys.path``: the real import machinery finds
``sglang.srt.function_call.function_call_parser.FunctionCallParser``,
``sglang.srt.parser.reasoning_parser.ReasoningParser`` and
``sglang.srt.entrypoints.openai.protocol.Tool`` where SGLang has them, with the interfaces
``agentrl.parsers.sglang`` calls (``ToolCallParserEnum`` / ``DetectorMap``, the
constructors' keywords, ``parse_non_stream``, ``detector.has_tool_call`` / ``bot_token`` /
``think_end_token``). It is not SGLang: its detectors read simplified formats.

Names it exposes: tool calls ``glm45`` and ``glm`` (GLM-4.5's ``<arg_key>``/``<arg_value>``
format, which no built-in reads), ``hermes`` and ``qwen25`` (JSON in ``<tool_call>``),
``qwen3_coder`` (a name only: it reads JSON too);
reasoning ``glm45``, ``qwen3``, ``qwen3-thinking`` and ``deepseek-r1``.
"""

from __future__ import annotations

import pathlib
import sys
import textwrap

__all__ = ["STANDIN_MARK", "install", "is_standin", "unload"]

#: Every stand-in module carries this attribute, so a test can tell it from real SGLang.
STANDIN_MARK = "AGENTRL_SGLANG_STANDIN"

_MODULES: dict[str, str] = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/entrypoints/__init__.py": "",
    "sglang/srt/entrypoints/openai/__init__.py": "",
    "sglang/srt/entrypoints/openai/protocol.py": """
        class Function:
            def __init__(self, name, description="", parameters=None):
                self.name, self.description, self.parameters = name, description, parameters


        class Tool:
            def __init__(self, function):
                self.type, self.function = "function", function

            @classmethod
            def model_validate(cls, payload):
                return cls(Function(**payload["function"]))
        """,
    "sglang/srt/function_call/__init__.py": "",
    "sglang/srt/function_call/core_types.py": """
        class ToolCallItem:
            def __init__(self, tool_index, name, parameters):
                self.tool_index, self.name, self.parameters = tool_index, name, parameters


        class StreamingParseResult:
            def __init__(self, normal_text="", calls=None):
                self.normal_text, self.calls = normal_text, calls or []
        """,
    "sglang/srt/function_call/glm4_moe_detector.py": """
        import json
        import re

        from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem

        _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
        _ARG = re.compile(r"<arg_key>(.*?)</arg_key>\\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


        def _value(text):
            try:
                return json.loads(text)
            except ValueError:
                return text


        class Glm4MoeDetector:
            bot_token = "<tool_call>"
            eot_token = "</tool_call>"

            def has_tool_call(self, text):
                return self.bot_token in text

            def detect_and_parse(self, text, tools):
                start = text.find(self.bot_token)
                if start == -1:
                    return StreamingParseResult(normal_text=text)
                calls = []
                for index, match in enumerate(_CALL.finditer(text)):
                    name, _, body = match.group(1).strip().partition("\\n")
                    args = {k.strip(): _value(v.strip()) for k, v in _ARG.findall(body)}
                    calls.append(ToolCallItem(index, name.strip(), json.dumps(args)))
                return StreamingParseResult(normal_text=text[:start].strip(), calls=calls)
        """,
    "sglang/srt/function_call/qwen25_detector.py": """
        import json
        import re

        from sglang.srt.function_call.core_types import StreamingParseResult, ToolCallItem

        _CALL = re.compile(r"<tool_call>\\s*(.*?)\\s*</tool_call>", re.DOTALL)


        class Qwen25Detector:
            bot_token = "<tool_call>"
            eot_token = "</tool_call>"

            def has_tool_call(self, text):
                return self.bot_token in text

            def detect_and_parse(self, text, tools):
                start = text.find(self.bot_token)
                if start == -1:
                    return StreamingParseResult(normal_text=text)
                calls = []
                for index, match in enumerate(_CALL.finditer(text)):
                    payload = json.loads(match.group(1))
                    calls.append(
                        ToolCallItem(index, payload["name"], json.dumps(payload["arguments"]))
                    )
                return StreamingParseResult(normal_text=text[:start].strip(), calls=calls)
        """,
    "sglang/srt/function_call/function_call_parser.py": """
        from sglang.srt.function_call.glm4_moe_detector import Glm4MoeDetector
        from sglang.srt.function_call.qwen25_detector import Qwen25Detector


        class FunctionCallParser:
            ToolCallParserEnum = {
                "glm": Glm4MoeDetector,
                "glm45": Glm4MoeDetector,
                "hermes": Qwen25Detector,
                "qwen25": Qwen25Detector,
                # Only resolved in the tests, never parsed with: not Qwen3-Coder's format.
                "qwen3_coder": Qwen25Detector,
            }

            def __init__(self, tools, tool_call_parser, tokenizer=None):
                detector_class = self.ToolCallParserEnum.get(tool_call_parser)
                if detector_class is None:
                    raise ValueError(f"Unsupported tool_call_parser: {tool_call_parser}")
                self.detector, self.tools = detector_class(), tools

            def parse_non_stream(self, full_text):
                if not self.tools:
                    return full_text, []
                result = self.detector.detect_and_parse(full_text, self.tools)
                if result.calls or self.detector.has_tool_call(full_text):
                    return result.normal_text, result.calls
                return full_text, []
        """,
    "sglang/srt/parser/__init__.py": "",
    "sglang/srt/parser/reasoning_parser.py": """
        class BaseReasoningFormatDetector:
            def __init__(self, think_start_token, think_end_token, force_reasoning=False):
                self.think_start_token, self.think_end_token = think_start_token, think_end_token
                self.force_reasoning = force_reasoning

            def detect_and_parse(self, text):
                if not (self.force_reasoning or self.think_start_token in text):
                    return "", text
                body = text.replace(self.think_start_token, "", 1)
                if self.think_end_token not in body:
                    return body, ""
                reasoning, _, content = body.partition(self.think_end_token)
                return reasoning, content


        class DeepSeekR1Detector(BaseReasoningFormatDetector):
            def __init__(self, stream_reasoning=True, force_reasoning=True):
                super().__init__("<think>", "</think>", force_reasoning=True)


        class Qwen3Detector(BaseReasoningFormatDetector):
            def __init__(self, stream_reasoning=True, force_reasoning=False):
                super().__init__("<think>", "</think>", force_reasoning=force_reasoning)


        class Glm45Detector(Qwen3Detector):
            pass


        class ReasoningParser:
            DetectorMap = {
                "deepseek-r1": DeepSeekR1Detector,
                "glm45": Glm45Detector,
                "qwen3": Qwen3Detector,
                "qwen3-thinking": Qwen3Detector,
            }

            def __init__(self, model_type=None, stream_reasoning=True, force_reasoning=None):
                detector_class = self.DetectorMap.get((model_type or "").lower())
                if detector_class is None:
                    raise ValueError(f"Unsupported model type: {model_type}")
                if model_type.lower() == "qwen3-thinking":
                    force_reasoning = True
                kwargs = {"stream_reasoning": stream_reasoning}
                if force_reasoning is not None:
                    kwargs["force_reasoning"] = force_reasoning
                self.detector = detector_class(**kwargs)

            def parse_non_stream(self, full_text):
                return self.detector.detect_and_parse(full_text)
        """,
}


def unload() -> None:
    """Drop every ``sglang`` module from ``sys.modules`` (stand-in or real)."""
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


def install(root: pathlib.Path, monkeypatch) -> pathlib.Path:
    """Write the stand-in package under ``root`` and put ``root`` first on ``sys.path``.

    Any ``sglang`` module already imported is removed for the test (``monkeypatch``
    restores it); call :func:`unload` when done so the stand-in does not outlive the test.
    """
    for relative, source in _MODULES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        body = textwrap.dedent(source).lstrip("\n")
        path.write_text(f"{STANDIN_MARK} = True\n\n{body}")
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(root))
    return root


def is_standin(cls: type) -> bool:
    """Whether ``cls`` (an SGLang class) came from the stand-in rather than real SGLang."""
    return bool(getattr(sys.modules.get(cls.__module__), STANDIN_MARK, False))
