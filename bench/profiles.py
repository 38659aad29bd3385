"""What a provider profile costs per request (issue 32): ``filter_request`` on a Claude Code-sized Messages request
(its eight betas, 40 tool definitions, a 200 KB conversation) for the first party (a pass-through: one attribute
read) and for Bedrock (the beta header looked up in the profile's cache, the top-level keys checked, one substring
search of the body for the tool flags, one regex scan of the messages for a ``system`` turn). Rounds alternate so
both see the same machine; the figure to compare is the gateway's CPU per request or stream (``bench.run``:
burst-c10 ~400 µs a stream, bedrock-burst-c10 more).

    python -m bench.profiles          # from the repository root
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import msgspec

from adapters.profiles import PROFILES, filter_request
from gateway.wire.request import ProxyRequest

BETAS = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01,"
    "mid-conversation-tool-changes-2026-07-01,advanced-tool-use-2025-11-20,effort-2025-11-24,"
    "thinking-token-count-2026-05-13"
)
_WORDS = [
    *("the", "gateway", "sends", "each", "provider", "what", "it", "accepts"),
    *("of", "a", "request", "and", "names", "what", "it", "left", "out"),
]
TOOLS = [
    {
        "name": f"Tool{i}",
        "description": "d" * 800,
        "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}},
    }
    for i in range(40)
]
MESSAGES = [
    {"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": "t" * 2000}]}
    for i in range(100)
]
BODY = json.dumps(
    {"model": "claude-sonnet-4-6", "max_tokens": 32000, "stream": True, "messages": MESSAGES, "tools": TOOLS}
).encode()


SMALL = json.dumps(
    {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
).encode()  # the body of bench.run's scenarios (burst-c10, bedrock-burst-c10): no betas


def _request() -> ProxyRequest:
    return ProxyRequest(body=BODY, model="claude-sonnet-4-6", stream=True, request_id="r", anthropic_beta=BETAS)


def _small() -> ProxyRequest:
    return ProxyRequest(body=SMALL, model="claude-sonnet-4-6", stream=True, request_id="r")


def _time(fn: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e9


def main(rounds: int = 10, n: int = 2000) -> None:
    first, bedrock = PROFILES["anthropic"], PROFILES["bedrock"]

    def fields_only() -> object:  # what an adapter that rewrites the body decodes anyway (Bedrock, Vertex)
        return _request().fields()

    cases: dict[str, Callable[[], object]] = {
        "small: top-level decode": lambda: _small().fields(),
        "small: bedrock (decode + profile)": lambda: filter_request(bedrock, _small()),
        "top-level decode (the baseline)": fields_only,
        "first party (pass-through)": lambda: filter_request(first, _request()),
        "bedrock (decode + profile)": lambda: filter_request(bedrock, _request()),
    }
    got: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            got[name].append(_time(fn, n))
    print(f"a {len(BODY) // 1024} KB request, {rounds} alternating rounds of {n} calls; CPU µs per call (median, min)")
    for name, values in got.items():
        values.sort()
        print(f"  {name:34s} {values[len(values) // 2] / 1000:8.2f} {values[0] / 1000:8.2f}")
    base = sorted(got["top-level decode (the baseline)"])[rounds // 2]
    profile = sorted(got["bedrock (decode + profile)"])[rounds // 2]
    print(f"  the Bedrock profile beyond the decode: {(profile - base) / 1000:+.2f} µs per request")
    assert msgspec.json.decode(BODY)  # the body is valid JSON


if __name__ == "__main__":
    main()
