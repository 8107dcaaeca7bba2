"""The ``e2b`` sandbox: E2B's cloud sandboxes through the official SDK (``sandbox``), with
the SDK's errors classified for retry (``errors``) and the options and their environment
variables (``options``). The SDK is imported only when a sandbox is constructed."""

from __future__ import annotations

from agentrl.sandboxes.e2b.sandbox import E2BSandbox, RetryEvent

__all__ = ["E2BSandbox", "RetryEvent"]
