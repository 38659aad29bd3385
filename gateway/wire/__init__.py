"""The wire: what travels, and nothing of what decides.

Canonical events and their partial-decode views (``events``, with the C extension ``_views_c`` beside it), the SSE
framer (``sse``), the stream validator (``validate``), the pure usage fold (``usage_fold``), errors with their wire
meaning (``errors``), the request as adapters see it and how it is built from the client's (``request``), and the
upstream HTTP client behind its seam (``upstream``).

May import: the standard library, msgspec, its own modules and ``gateway.settings`` (the config Structs). Nothing
above it: no adapter, no route, no metric, no policy.
"""
