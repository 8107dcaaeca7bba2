"""The middleware: the aiohttp server every agent's LLM calls reach.

:mod:`~agentrl.serve.middleware` (``Middleware``: routes, sessions API, auth),
:mod:`~agentrl.serve.turns` (one turn: prompt → generate → parse → reply → record),
:mod:`~agentrl.serve.sessions`, :mod:`~agentrl.serve.replies` (writing an adapter's reply),
:mod:`~agentrl.serve.limits` and :mod:`~agentrl.serve.offload` (what one request may cost),
:mod:`~agentrl.serve.aborts` (engine aborts continued), and the sticky worker processes
(:mod:`~agentrl.serve.shards` and the ``shard_*`` modules). Wire protocols are
:mod:`agentrl.adapters`; prompt building is :mod:`agentrl.prompts`.
"""
