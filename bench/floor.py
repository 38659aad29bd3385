"""The floor: a bare Python pass-through of ``POST /v1/messages``, measured in the same run as the gateway
(``python -m bench.run --floor``) so that the gateway's cost can be read against what Python can do here that
hour, not only against figures of another day.

uvicorn (uvloop + httptools, no access log, no proxy headers) serving a plain ASGI function that sends the
request body to the fake upstream with the gateway's own upstream client (``gateway.wire.upstream.H1Client``, the
minimal ``asyncio.Protocol`` + httptools client) and writes the answer's bytes back as they arrive: no key, no
routing, no limits, no decode, no validation, no usage, no metrics, no access line. What the gateway does on top
of this is its features; what this costs is the server, the client and the kernel.

    python -m bench.floor --port 8090 --upstream http://127.0.0.1:9100
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.wire.upstream import H1Client, Timeouts

__all__ = ["main", "make_app"]

_TIMEOUTS = Timeouts(connect=5.0, read=60.0)
_FORWARDED = {"content-type", "request-id"}
_HEADERS = {"content-type": "application/json", "x-api-key": "bench"}


def make_app(upstream: str) -> Any:
    client: H1Client | None = None
    url = upstream.rstrip("/") + "/v1/messages"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal client
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    client = H1Client()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if client is not None:
                        await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        assert client is not None
        resp = await client.send("POST", url, headers=_HEADERS, body=body, timeouts=_TIMEOUTS)
        headers = [(k.encode(), v.encode()) for k, v in resp.headers.items() if k.lower() in _FORWARDED]
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        async for chunk in resp.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the fake upstream's base URL")
    args = parser.parse_args(argv)
    uvicorn.run(
        make_app(args.upstream),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
