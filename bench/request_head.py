"""What the upstream header check costs per request (issue 31, item 1): ``_request_head`` as it is (a set lookup per
name, one ``bytes.translate`` over the whole head) against the same function without the check (kept here as it
was before), and ``check_headers`` (the aiohttp and httpx clients' check, a regex per name and value), on the
headers a Claude Code request carries upstream. Rounds alternate so both see the same machine.

    python -m bench.request_head          # from the repository root

The figure to compare is the check's cost against the gateway's CPU per request (``bench.run``'s json-c10: a few
hundred microseconds): the report prints both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from gateway.wire.upstream import _request_head, check_headers

HEADERS = {
    "x-api-key": "sk-ant-api03-" + "x" * 95,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
    "content-type": "application/json",
    "user-agent": "claude-cli/2.1.332 (external, cli)",
    "x-stainless-lang": "js",
    "x-stainless-package-version": "0.60.0",
    "x-stainless-os": "Linux",
    "x-stainless-arch": "x64",
    "x-stainless-runtime": "node",
    "x-stainless-runtime-version": "v22.12.0",
    "x-stainless-retry-count": "0",
    "x-stainless-timeout": "600",
    "x-claude-code-session-id": "0b9c5d1e-7f3a-4c2b-9e8d-1a2b3c4d5e6f",
    "x-app": "cli",
}
BODY = b"x" * 4000


def _unchecked(method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
    """``_request_head`` before issue 31: the same lines, no check."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    seen = set()
    for name, value in headers.items():
        low = name.lower()
        if low in ("host", "content-length", "transfer-encoding", "connection"):
            continue
        seen.add(low)
        lines.append(f"{name}: {value}")
    if "accept-encoding" not in seen:
        lines.append("Accept-Encoding: gzip, deflate")
    if "accept" not in seen:
        lines.append("Accept: */*")
    lines.append(f"Content-Length: {len(body) if body else 0}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _time(fn: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e9


def main(rounds: int = 10, n: int = 50_000) -> None:
    assert _request_head("POST", "/v1/messages", "api.anthropic.com", HEADERS, BODY) == _unchecked(
        "POST", "/v1/messages", "api.anthropic.com", HEADERS, BODY
    )
    cases: dict[str, Callable[[], object]] = {
        "unchecked head (before)": lambda: _unchecked("POST", "/v1/messages", "api.anthropic.com", HEADERS, BODY),
        "checked head (h1, now)": lambda: _request_head("POST", "/v1/messages", "api.anthropic.com", HEADERS, BODY),
        "check_headers (aiohttp, httpx)": lambda: check_headers(HEADERS),
    }
    got: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            got[name].append(_time(fn, n))
    print(f"{len(HEADERS)} headers, {rounds} alternating rounds of {n} calls; CPU ns per call (median, min)")
    for name, values in got.items():
        values.sort()
        print(f"  {name:32s} {values[len(values) // 2]:8.0f} {values[0]:8.0f}")
    before = sorted(got["unchecked head (before)"])[rounds // 2]
    after = sorted(got["checked head (h1, now)"])[rounds // 2]
    print(f"  the check on the h1 path: +{after - before:.0f} ns per request ({after / before:.2f}x the head)")


if __name__ == "__main__":
    main()
