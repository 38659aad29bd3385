"""What a client is told of a cloud provider's error message (issue 32, item 6; Claude Code's gateway contract).

- A message the client's recovery reads is kept exactly: Claude Code compacts on Bedrock's ``Input is too long.``
  (it matches the whole message), and on the API's ``prompt is too long: …``.
- Vertex's request-size refusal ("The request size (N bytes) exceeds 30.000MB limit.") means the same thing and
  is answered ``Input is too long.``.
- A message that names the operator's cloud account — an ARN, a 12-digit AWS account id, a Google
  ``projects/<id>`` path — is logged for the operator (with the provider's request id) and replaced by a generic
  one; the error's type and status are kept, so the client's SDK still acts on them.
"""

from __future__ import annotations

import logging
import re

__all__ = ["INPUT_TOO_LONG", "VERTEX_TOO_BIG", "client_message"]

log = logging.getLogger("gateway")

INPUT_TOO_LONG = "Input is too long."
VERTEX_TOO_BIG = re.compile(r"The request size \(\d+ bytes\) exceeds [\d.]+MB limit\.?")
_ACCOUNT = re.compile(r"arn:aws[a-z-]*:|(?<![\d.])\d{12}(?![\d.])|projects/[a-z][a-z0-9-]{4,}|service-\d+@")


def client_message(message: str, *, provider: str, error_type: str, request_id: str = "") -> str:
    """``message`` as the client may read it (see the module's rules)."""
    if not message or (message.startswith(INPUT_TOO_LONG[:-1]) and _ACCOUNT.search(message) is None):
        return message
    if VERTEX_TOO_BIG.search(message):
        return INPUT_TOO_LONG
    if _ACCOUNT.search(message) is None:
        return message
    log.warning(
        "provider %s answered %s (request %s): %s — the client is told a generic message",
        provider,
        error_type,
        request_id or "-",
        message[:500],
    )
    return f"provider {provider!r} refused the request ({error_type}); the gateway's log has the provider's message"
