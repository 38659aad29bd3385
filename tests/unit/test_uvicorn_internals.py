"""``gateway/http/server.py`` subclasses uvicorn's httptools protocol and response cycle and reads their internals
(issue 37, 14). pyproject.toml bounds uvicorn to the minor version this was written against; this test fails
loudly, naming what moved, when those internals change — at an upgrade, before a request finds out."""

from __future__ import annotations

import inspect
import re

import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

TESTED = "0.54."


def assigned(function: object) -> set[str]:
    return set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=(?!=)", inspect.getsource(function)))  # type: ignore[arg-type]


def test_the_uvicorn_this_was_written_against() -> None:
    assert uvicorn.__version__.startswith(TESTED), (
        f"uvicorn {uvicorn.__version__}: gateway/http/server.py was written against {TESTED}x; check the internals "
        "below, then move the bound in pyproject.toml and TESTED here"
    )


def test_the_names_the_gateways_protocol_imports_and_overrides() -> None:
    for name in ("HEADER_RE", "HEADER_VALUE_RE", "STATUS_LINE"):
        assert hasattr(httptools_impl, name), name
    assert isinstance(httptools_impl.HEADER_RE, re.Pattern) and isinstance(httptools_impl.HEADER_VALUE_RE, re.Pattern)
    for method in (
        "_start_asgi_task",
        "connection_made",
        "connection_lost",
        "data_received",
        "on_header",
        "on_headers_complete",
        "on_message_complete",
        "on_response_complete",
        "send_400_response",
    ):
        assert callable(getattr(HttpToolsProtocol, method, None)), f"HttpToolsProtocol.{method}"
    assert list(inspect.signature(HttpToolsProtocol._start_asgi_task).parameters) == ["self", "cycle", "app"]
    assert inspect.iscoroutinefunction(RequestResponseCycle.send)


def test_the_attributes_the_gateway_reads() -> None:
    cycle = assigned(RequestResponseCycle.__init__)
    for name in (
        "flow",
        "transport",
        "scope",
        "disconnected",
        "keep_alive",
        "chunked_encoding",
        "expected_content_length",
        "response_complete",
        "message_event",
        "on_response",
        "default_headers",
    ):
        assert name in cycle, f"RequestResponseCycle no longer sets self.{name}"
    protocol = assigned(HttpToolsProtocol)  # set somewhere in the class (__init__, connection_made, on_message_begin…)
    for name in ("cycle", "headers", "scope", "expect_100_continue", "transport", "flow", "loop", "url"):
        assert name in protocol, f"HttpToolsProtocol no longer sets self.{name}"
