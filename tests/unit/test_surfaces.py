"""The surfaces' pure parts: which routes they answer, the default rule that maps cloud model ids onto
aliases, the canonical body, and Bedrock's error shapes."""

from __future__ import annotations

import json

import pytest

import surfaces
from gateway.routing.table import RouteTable
from gateway.settings import parse_settings
from gateway.wire.errors import NotFound
from surfaces.base import canonical_body, cloud_model_names, resolve_cloud_model
from surfaces.bedrock import bedrock_error


@pytest.mark.parametrize(
    ("model_id", "names"),
    [
        ("claude-sonnet-4-6", ["claude-sonnet-4-6"]),
        ("us.anthropic.claude-opus-5-5", ["us.anthropic.claude-opus-5-5", "claude-opus-5-5"]),
        (
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            ["anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929", "claude-sonnet-4-5"],
        ),
        (
            "arn:aws:bedrock:us-east-1:1:inference-profile/global.anthropic.claude-haiku-4-5-20251001-v1:0",
            [
                "arn:aws:bedrock:us-east-1:1:inference-profile/global.anthropic.claude-haiku-4-5-20251001-v1:0",
                "claude-haiku-4-5-20251001",
                "claude-haiku-4-5",
            ],
        ),
        ("claude-opus-4-5@20251101", ["claude-opus-4-5@20251101", "claude-opus-4-5-20251101", "claude-opus-4-5"]),
    ],
)
def test_the_default_rule_strips_region_prefix_provider_and_versions(model_id: str, names: list[str]) -> None:
    assert cloud_model_names(model_id) == names


def routes(yaml: str) -> RouteTable:
    settings = parse_settings("auth: {open: true}\nproviders: {m: {kind: mock}}\n" + yaml)
    from adapters import build_adapter

    adapters = {n: build_adapter(n, c, None, lambda p: None) for n, c in settings.providers.items()}  # type: ignore[arg-type]
    return RouteTable(settings.models, adapters)


def test_explicit_ids_win_then_exact_aliases_then_globs_then_the_id_itself() -> None:
    table = routes(
        """
models:
  opus: {bedrock_ids: [us.anthropic.claude-opus-5-5], targets: [{provider: m}]}
  claude-sonnet-4-5: {targets: [{provider: m}]}
  "claude-haiku-*": {targets: [{provider: m}]}
  "arn:*": {targets: [{provider: m}]}
"""
    )
    assert resolve_cloud_model("bedrock", "us.anthropic.claude-opus-5-5", table) == "opus"
    with pytest.raises(NotFound):  # bedrock_ids are Bedrock's only
        resolve_cloud_model("vertex", "us.anthropic.claude-opus-5-5", table)
    assert resolve_cloud_model("bedrock", "eu.anthropic.claude-sonnet-4-5-20250929-v1:0", table) == "claude-sonnet-4-5"
    assert resolve_cloud_model("vertex", "claude-haiku-4-5@20251001", table) == "claude-haiku-4-5-20251001"
    assert resolve_cloud_model("bedrock", "arn:aws:bedrock:x:1:application-inference-profile/zz", table).startswith(
        "arn:"
    )
    with pytest.raises(NotFound):
        resolve_cloud_model(
            "bedrock", "us.anthropic.claude-opus-5-5", routes("models: {only: {targets: [{provider: m}]}}")
        )


def test_the_surfaces_answer_their_routes_only() -> None:
    call = surfaces.match("POST", "/model/us.anthropic.claude-opus-5-5/invoke-with-response-stream")
    assert call is not None and (call.kind, call.model_id, call.stream, call.count) == (
        "bedrock",
        "us.anthropic.claude-opus-5-5",
        True,
        False,
    )
    call = surfaces.match("POST", "/model/anthropic.claude-x-v1%3A0/count-tokens")
    assert call is not None and call.model_id == "anthropic.claude-x-v1:0" and call.count
    vertex = "/v1/projects/p/locations/global/publishers/anthropic/models"
    call = surfaces.match("POST", f"{vertex}/claude-opus-4-5@20251101:streamRawPredict")
    assert call is not None and (call.kind, call.model_id, call.stream) == ("vertex", "claude-opus-4-5@20251101", True)
    call = surfaces.match("POST", f"{vertex}/count-tokens:rawPredict")
    assert call is not None and call.count
    for method, path in [
        ("POST", "/model/x/converse"),
        ("POST", "/model//invoke"),
        ("POST", f"{vertex}/count-tokens:streamRawPredict"),
        ("POST", f"{vertex}/x:predict"),
        ("POST", "/v1/projects/p/locations/l/publishers/google/models/gemini:rawPredict"),
        ("POST", "/v1/messages"),
    ]:
        assert surfaces.match(method, path) is None, path


def test_the_canonical_body_keeps_every_other_field_as_it_came() -> None:
    body = b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"stream":true,"tools":[{"a":  1}],"model":"x"}'
    out, fields = canonical_body(body, model="sonnet", stream=False, drop=("anthropic_version",))
    assert json.loads(out) == {"max_tokens": 5, "tools": [{"a": 1}], "model": "sonnet"}
    assert b'[{"a":  1}]' in out  # nested values untouched
    out, _ = canonical_body(body, model="m", stream=None, drop=())
    assert json.loads(out)["stream"] is True and "anthropic_version" in fields


@pytest.mark.parametrize(
    ("status", "error_type", "out_status", "name"),
    [
        (400, "invalid_request_error", 400, "ValidationException"),
        (401, "authentication_error", 401, "UnrecognizedClientException"),
        (403, "permission_error", 403, "AccessDeniedException"),
        (404, "not_found_error", 404, "ResourceNotFoundException"),
        (413, "request_too_large", 400, "ValidationException"),
        (429, "rate_limit_error", 429, "ThrottlingException"),
        (429, "billing_error", 429, "ServiceQuotaExceededException"),
        (500, "api_error", 500, "InternalServerException"),
        (504, "timeout_error", 408, "ModelTimeoutException"),
        (529, "overloaded_error", 503, "ServiceUnavailableException"),
    ],
)
def test_bedrock_error_shapes(status: int, error_type: str, out_status: int, name: str) -> None:
    envelope = json.dumps({"type": "error", "error": {"type": error_type, "message": "why"}, "request_id": "r"})
    headers = [(b"request-id", b"req_1"), (b"retry-after", b"3"), (b"content-length", b"9")]
    got_status, got_headers, body = bedrock_error(status, envelope.encode(), headers)
    found = dict(got_headers)
    assert got_status == out_status and json.loads(body) == {"message": "why"}
    assert found[b"x-amzn-errortype"].split(b":")[0] == name.encode()
    assert found[b"retry-after"] == b"3" and found[b"x-amzn-requestid"] == b"req_1"
    assert found[b"content-length"] == str(len(body)).encode()


def test_the_surfaces_error_names_are_the_inverse_of_the_adapters() -> None:
    """The Bedrock surface writes an Anthropic error type as the Bedrock exception the Bedrock adapter reads back
    as that same type — before the stream (BEDROCK_ERRORS) and during it (STREAM_EXCEPTIONS): a round trip
    through a Bedrock-shaped client and a Bedrock target changes no error's type."""
    from adapters.bedrock import BEDROCK_ERRORS, STREAM_EXCEPTIONS
    from surfaces.bedrock import _ERRORS, _STREAM_ERRORS

    # Bedrock has no exception of these types: they become the nearest one, and read back as its type
    nearest = {"request_too_large": "invalid_request_error", "billing_error": "rate_limit_error"}
    for error_type, (name, _) in _ERRORS.items():
        if name in BEDROCK_ERRORS:  # (UnrecognizedClientException, the key refused, is never read back)
            assert BEDROCK_ERRORS[name][1] == nearest.get(error_type, error_type), name
    assert {"ValidationException", "ThrottlingException", "ServiceUnavailableException"} <= {
        name for name, _ in _ERRORS.values()
    }
    for error_type, name in _STREAM_ERRORS.items():
        assert STREAM_EXCEPTIONS[name] == error_type, name
    assert STREAM_EXCEPTIONS["internalServerException"] == "api_error"  # what every other type becomes
