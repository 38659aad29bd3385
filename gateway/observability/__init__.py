"""Observability: what the gateway tells its operators.

The Prometheus registry (``metrics``), tracing spans (``tracing``), the recording seam and its sinks
(``recording``: metrics, the ledger, the limiter's settlement, the access line) and a request's usage tally
(``usage``: what the stream reported, folded, recorded once).

May import: the wire layer, ``gateway.settings`` and ``gateway.governance`` (the ledger the recorder writes to), for
``metrics``, ``tracing`` and ``recording`` (policy). The tally is one layer up, the request layer: it holds the
request's context (``gateway.context``), so it may import that too.
"""
