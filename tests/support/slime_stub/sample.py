"""Stand-in for ``slime.utils.types.Sample``: every field, its default, the nested types.

Written from the contract (SLIME_CONTRACT §2), without torch: tensor-typed fields accept
lists here. Behaviour that slime's pipeline relies on is reproduced: ``to_dict`` /
``from_dict``, ``get_reward_value``, ``effective_response_length``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


@dataclasses.dataclass
class Sample:
    """One slime rollout sample."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = dataclasses.field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclasses.dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            if self.spec_draft_token_num <= 0:
                return 0.0
            return self.spec_accept_token_num / self.spec_draft_token_num

        @property
        def spec_accept_length(self) -> float:
            if self.spec_verify_ct <= 0:
                return 0.0
            return self.completion_token_num / self.spec_verify_ct

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict:
            return dataclasses.asdict(self)

        @staticmethod
        def from_dict(data: dict) -> Sample.SpecInfo:
            names = {f.name for f in dataclasses.fields(Sample.SpecInfo)}
            return Sample.SpecInfo(**{k: v for k, v in data.items() if k in names})

    spec_info: SpecInfo = dataclasses.field(default_factory=SpecInfo)

    @dataclasses.dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            if self.total_prompt_tokens <= 0:
                return 0.0
            return self.cached_tokens / self.total_prompt_tokens

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict:
            return dataclasses.asdict(self)

        @staticmethod
        def from_dict(data: dict) -> Sample.PrefixCacheInfo:
            names = {f.name for f in dataclasses.fields(Sample.PrefixCacheInfo)}
            return Sample.PrefixCacheInfo(**{k: v for k, v in data.items() if k in names})

    prefix_cache_info: PrefixCacheInfo = dataclasses.field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict:
        value = dict(self.__dict__)
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(
            data.get("prefix_cache_info", {})
        )
        names = {f.name for f in dataclasses.fields(Sample)}
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args: Any) -> Any:
        key = getattr(args, "reward_key", None)
        return self.reward[key] if key else self.reward

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length
