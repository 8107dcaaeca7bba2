"""``python -m agentrl.cli``: the ``agentrl`` command."""

from agentrl.cli.group import main

main()
