"""``python -m agentrl``: the ``agentrl`` command, for environments without its script."""

from agentrl.cli import main

if __name__ == "__main__":
    main()
