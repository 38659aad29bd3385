"""Routing: where a request goes, and the loop that takes it there.

The route table (``table``: aliases, globs, targets, model ids), the per-target health and retry decisions
(``balance``: breakers, panic mode, back-off), one config's resilience settings (``resilience``), and the pipeline
(``pipeline``: attempts, fallback, the first event, metering the stream it hands back).

May import: the wire layer, ``gateway.settings`` and ``adapters.base``, for the table, balance and resilience
(policy). The pipeline is one layer up (the request layer, with ``gateway.runtime`` and ``gateway.context``):
it drives a request's usage tally (``gateway.observability.usage``) and the metrics, so it may import those too.
"""
