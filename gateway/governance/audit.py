"""The audit log: one JSON line per security-relevant step on the ``gateway.audit`` logger (issue 34), named as
Anthropic's gateway names its events: ``device.authorize``, ``device.verify``, ``device.deny``, ``session.mint``,
``session.refresh``, ``session.revoke``, ``managed.serve``, ``auth.denied``, ``spend.blocked``, ``admin.denied``,
``admin.limit.upsert``, ``admin.limit.delete``, ``admin.session.revoke``. Never a token, a code or a secret: the
callers pass identities (subject, email, session id, key name), outcomes and reasons only, and ``event`` drops a
field whose name says it holds a secret."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

__all__ = ["audit", "audit_log"]

audit_log = logging.getLogger("gateway.audit")
_encode = msgspec.json.Encoder().encode
_SECRET_WORDS = ("token", "secret", "code", "password", "verifier", "cookie")


def audit(event: str, **fields: Any) -> None:
    """Log one audit event (``{"ts", "event", …fields}``) when ``gateway.audit`` is enabled for INFO."""
    if not audit_log.isEnabledFor(logging.INFO):
        return
    record: dict[str, Any] = {"ts": round(time.time(), 3), "event": event}
    for name, value in fields.items():
        if value is None or any(word in name for word in _SECRET_WORDS):
            continue
        record[name] = value
    audit_log.info("%s", _encode(record).decode())
