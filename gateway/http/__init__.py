"""HTTP: the server protocol and every route.

The uvicorn protocol with the head limits and timers (``server``), the ASGI application (``app``), the Messages edge
(``messages``: ``POST /v1/messages`` and ``count_tokens``, and the Bedrock- and Vertex-shaped routes through
``surfaces``), the Litestar routes (``routes``: models, health, metrics), the usage and cost reports (``reports``),
the keys API (``keys_api``), the browser pages (``pages``, ``status``) and their static files (``web/``).

May import every layer below: ``gateway.core`` (the process), the request layer, governance, observability,
routing, the providers and the wire. Nothing imports it but ``gateway.cli``.
"""
