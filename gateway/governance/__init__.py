"""Governance: who may ask, how much, and what it cost.

Client keys and authorisation (``keys``), runtime-issued keys (``identity``), JWT verification (``jwt_auth``), rate
limits and budgets (``limits``) over memory or Redis (``redis_client``, the gateway's own RESP client), the prices
they count with (``pricing``: the config's, then the shipped Claude list prices), the usage ledger's writer
(``ledger``) and its store (``store``: SQLite or PostgreSQL, with the report queries). Claude Code's ``/login``: the
device flow (``signin``), its relying party (``oidc``), its state (``signin_store``), the bearers' check
(``sessions``) and the ``audit`` log. The spend limits set at run time (``spend_limits``), their store and audit
(``spend_limit_store``), and what Claude Code shows of a cap (``overage``: the ``anthropic-ratelimit-unified-*``
headers).

May import: the wire layer, ``gateway.settings``, ``gateway.routing``'s table (a key's allowed models are matched
against a route) and its own modules. Not the metrics, not the pipeline, not HTTP.
"""
