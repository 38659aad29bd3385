"""messages-gateway: the Anthropic Messages API, in its own shape, over every cloud that serves Claude."""

__version__ = "0.1.0"
