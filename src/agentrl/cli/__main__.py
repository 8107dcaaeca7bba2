"""``python -m agentrl.cli``: the ``agentrl`` command."""

from agentrl.cli.main import main

main()
