"""What every route does at the edge, whichever server layer carries it: check the client's key, read
the body within the size limit, and describe the request for adapters."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Mapping

from gateway.errors import AuthenticationError, RequestTooLarge
from gateway.request import ProxyRequest

__all__ = ["authenticate", "proxy_request", "read_body"]

_CLIENT_KEY_HEADERS = ("x-api-key", "authorization")


def authenticate(keys: list[bytes], headers: Mapping[str, str]) -> dict[str, str]:
    """Check the client's key (``x-api-key`` or ``Authorization: Bearer``) against ``keys`` (none: open);
    return the key headers the client sent (forwarded upstream only where a provider asks for that)."""
    sent = {name: headers[name] for name in _CLIENT_KEY_HEADERS if name in headers}
    if not keys:
        return sent
    candidates = [sent.get("x-api-key", "").encode()]
    auth = sent.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        candidates.append(auth[7:].strip().encode())
    if not any(candidates):
        raise AuthenticationError("missing API key: send it as x-api-key or Authorization: Bearer")
    ok = False
    for key in keys:  # every comparison runs, in constant time each
        for candidate in candidates:
            ok |= hmac.compare_digest(key, candidate)
    if not ok:
        raise AuthenticationError("invalid API key")
    return sent


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole request body; ``RequestTooLarge`` as soon as it is known to exceed ``limit``."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def proxy_request(
    headers: Mapping[str, str],
    query: str,
    *,
    body: bytes,
    model: str,
    stream: bool,
    client_auth: dict[str, str],
    request_id: str,
) -> ProxyRequest:
    return ProxyRequest(
        body=body,
        model=model,
        stream=stream,
        request_id=request_id,
        anthropic_version=headers.get("anthropic-version"),
        anthropic_beta=headers.get("anthropic-beta"),
        client_auth=client_auth,
        beta="beta=true" in query.split("&"),
    )
