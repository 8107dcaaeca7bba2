"""Options of the ``e2b`` sandbox: explicit arguments first, then environment defaults.

The environment is read here and only here, when a sandbox is constructed (never at
import), through ``agentrl.settings``. Each option has an ``AGENTRL_E2B_*`` variable; slime's
and the E2B SDK's names are accepted too, so an existing slime deployment works unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from agentrl import settings
from agentrl.retry import RetryPolicy
from agentrl.sandboxes.base import SandboxError

__all__ = ["ENV_VARS", "E2BOptions", "RetryPolicy"]

#: option -> its setting in ``agentrl.settings`` (types, defaults and aliases live there).
_SETTINGS: dict[str, str] = {
    "api_key": "AGENTRL_E2B_API_KEY",
    "domain": "AGENTRL_E2B_DOMAIN",
    "api_url": "AGENTRL_E2B_API_URL",
    "sandbox_url": "AGENTRL_E2B_SANDBOX_URL",
    "template": "AGENTRL_E2B_TEMPLATE",
    "image_metadata_key": "AGENTRL_E2B_IMAGE_METADATA_KEY",
    "size": "AGENTRL_E2B_SIZE",
    "lifetime_sec": "AGENTRL_E2B_LIFETIME_SEC",
    "rpc_retries": "AGENTRL_E2B_RPC_RETRIES",
    "backoff_base_sec": "AGENTRL_E2B_BACKOFF_BASE_SEC",
    "backoff_cap_sec": "AGENTRL_E2B_BACKOFF_CAP_SEC",
    "request_timeout_sec": "AGENTRL_E2B_REQUEST_TIMEOUT_SEC",
    "owner": "AGENTRL_E2B_OWNER",
    "sweep_stale": "AGENTRL_E2B_SWEEP_STALE",
}
#: option -> environment variables consulted in order (first non-empty wins).
ENV_VARS: dict[str, tuple[str, ...]] = {
    option: settings.setting(name).names for option, name in _SETTINGS.items()
}


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value <= 0:
        raise SandboxError(f"e2b option {attribute.name} must be positive, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value < 0:
        raise SandboxError(f"e2b option {attribute.name} must be 0 or more, got {value!r}")


@attrs.frozen(kw_only=True)
class E2BOptions:
    """Everything the ``e2b`` backend needs besides the image.

    ``rpc_retries`` counts re-sends after the first attempt (a transient failure on an
    idempotent call is tried ``rpc_retries + 1`` times in all); slime's names for it
    (``SLIME_AGENT_SANDBOX_RPC_RETRIES``, ``SWE_RPC_RETRIES``) count attempts, so a value
    read from them is lowered by one (``agentrl.settings``, ``alias_offset``). ``run_id`` labels every
    sandbox this run creates (default: this process's id, ``sweep.process_run_id()``);
    ``owner`` names the deployment (default: this host's name) and ``sweep_stale`` kills,
    before the first creation, what an earlier run of it left (see ``sweep``).
    """

    api_key: str | None = None
    domain: str | None = None
    api_url: str | None = None
    sandbox_url: str | None = None
    template: str | None = None
    image_metadata_key: str | None = None
    size: str | None = None
    lifetime_sec: int = attrs.field(default=3600, validator=_positive)
    rpc_retries: int = attrs.field(default=5, validator=_non_negative)
    backoff_base_sec: float = attrs.field(default=1.0, validator=_non_negative)
    backoff_cap_sec: float = attrs.field(default=32.0, validator=_non_negative)
    request_timeout_sec: float = attrs.field(default=60.0, validator=_positive)
    max_output_bytes: int | None = None
    metadata: dict[str, str] = attrs.field(factory=dict, converter=dict)
    run_id: str | None = None
    owner: str | None = None
    sweep_stale: bool = False
    #: ``False``: the sandbox has no egress (the SDK's ``allow_internet_access``) except to
    #: the hosts in ``egress_allow`` (the middleware's). ``None``: the SDK's default (open).
    allow_internet_access: bool | None = None
    egress_allow: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, **explicit: Any) -> E2BOptions:
        """Explicit (non-None) arguments win; unset ones come from ``environ`` (default: os.environ)."""
        unknown = set(explicit) - set(attrs.fields_dict(cls))
        if unknown:
            raise TypeError(
                f"unknown e2b option(s) {sorted(unknown)}; expected some of "
                f"{sorted(attrs.fields_dict(cls))}"
            )
        values: dict[str, Any] = {k: v for k, v in explicit.items() if v is not None}
        for option, name in _SETTINGS.items():
            if option in values:
                continue
            try:
                value = settings.get(name, environ, default=None)
            except settings.SettingsError as exc:
                raise SandboxError(str(exc)) from None
            if value is not None:
                values[option] = value
        return cls(**values)

    @property
    def retry_policy(self) -> RetryPolicy:
        """``rpc_retries`` re-sends, full-jitter delays from ``backoff_base_sec`` up to
        ``backoff_cap_sec``."""
        return RetryPolicy.from_retries(
            self.rpc_retries, base=self.backoff_base_sec, cap=self.backoff_cap_sec
        )

    def size_metadata_key(self) -> str:
        """Where the size goes: next to the routing key (``a/image`` -> ``a/size``), else ``size``."""
        key = self.image_metadata_key or ""
        return f"{key.rsplit('/', 1)[0]}/size" if "/" in key else "size"

    def boot_metadata(self, image: str | None) -> dict[str, str]:
        """The creation metadata for ``image``; every configuration error surfaces here."""
        metadata = dict(self.metadata)
        key = self.image_metadata_key
        if image:
            if not key:
                raise SandboxError(
                    f"cannot route image {image!r}: no image metadata key is set. Set "
                    "AGENTRL_E2B_IMAGE_METADATA_KEY (or SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY) "
                    "to the metadata key your E2B gateway routes images by (often 'image'), "
                    "or pass image_metadata_key=..."
                )
            metadata[key] = image
            if self.size:
                metadata[self.size_metadata_key()] = self.size
        elif not self.template:
            raise SandboxError(
                "an e2b sandbox needs an image (task.image, routed by image_metadata_key) "
                "or a template (AGENTRL_E2B_TEMPLATE); neither is set"
            )
        return metadata

    def network_params(self) -> dict[str, Any]:
        """What ``AsyncSandbox.create`` gets to restrict egress (nothing when left open).

        ``allow_internet_access=False`` alone denies every outbound connection; with
        ``egress_allow`` it is E2B's "deny all but these": ``network={"allow_out": hosts,
        "deny_out": ["0.0.0.0/0"]}`` (hostnames, IPs or CIDR blocks).
        """
        if self.allow_internet_access is not False:
            return {}
        if not self.egress_allow:
            return {"allow_internet_access": False}
        return {"network": {"allow_out": list(self.egress_allow), "deny_out": ["0.0.0.0/0"]}}

    def sdk_params(self) -> dict[str, Any]:
        """Connection parameters for every e2b SDK call.

        The SDK's own response retries are turned off (``retries=0``) so that one policy,
        ours, decides what is re-sent; its connect-only retries stay (they never replay a
        request the server may have received). Debug mode is pinned off so that a stray
        ``E2B_DEBUG`` cannot skip sandbox creation.
        """
        params: dict[str, Any] = {
            "retries": 0,
            "debug": False,
            "request_timeout": self.request_timeout_sec,
        }
        for option in ("api_key", "domain", "api_url", "sandbox_url"):
            value = getattr(self, option)
            if value:
                params[option] = value
        return params
