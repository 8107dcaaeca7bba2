"""agentrl's version (``agentrl.__version__``), in a module anything may import."""

__version__ = "0.1.0"
