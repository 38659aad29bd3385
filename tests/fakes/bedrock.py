"""A faithful fake of the Amazon Bedrock runtime (and the two newer AWS Claude surfaces) for tests.

:class:`FakeBedrock` serves, on 127.0.0.1 from an aiohttp server in a background thread:

* ``POST /model/{modelId}/invoke`` and ``/invoke-with-response-stream`` (InvokeModel family: Anthropic
  events as base64 ``chunk`` frames in ``application/vnd.amazon.eventstream``, docs/wire-formats.md §3.4),
* ``POST /model/{modelId}/count-tokens`` (CountTokens),
* ``POST /model/{modelId}/converse`` and ``/converse-stream`` (replayed from JSON files in ``converse_dir``),
* ``POST /anthropic/v1/messages`` (the "Bedrock Messages endpoint" / mantle, §7) and ``POST /v1/messages``
  (Claude Platform on AWS, §7): first-party body, first-party JSON/SSE exactly like
  :class:`~tests.fakes.claude_api.FakeClaudeAPI` (plus ``…/count_tokens``).

Every request is authenticated: ``Authorization: Bearer <api key>`` or a SigV4 signature that the fake
*verifies* by recomputing it with botocore's ``SigV4Auth`` over the raw path as received, the signed
headers and the body bytes. Signing names are chosen by path: ``/model/…`` → ``bedrock``,
``/anthropic/v1/…`` → ``bedrock-mantle``, ``/v1/…`` → ``aws-external-anthropic`` (which also takes
``x-api-key`` and needs an ``anthropic-workspace-id`` header).

**Scenarios.** The model id picks a scenario (:func:`scenario_name`): take the part of an ARN after its
last ``/``, strip a geography prefix (``us.``, ``eu.``, ``apac.``, ``jp.``, ``au.``, ``global.``,
``us-gov.``), an ``anthropic.`` prefix and a ``-v1:0`` / ``:0`` suffix. The rest names a FakeClaudeAPI
scenario (``fake-text``, ``fake-tools``, ``fake-text-d200`` …; unknown names behave like ``fake-text``
and echo the name as ``model``), a Bedrock-only stream scenario (:data:`BEDROCK_STREAM_SCENARIOS`) or a
status scenario (:data:`STATUS_SCENARIOS`). Bedrock rewrites ids to ``msg_bdrk_…`` / ``toolu_bdrk_…``
(:func:`bdrk_ids`).

**Strict by default** (``FakeBedrock(strict=False)`` keeps only the schema checks; ``extra_betas=`` or an assigned
``fake.beta_families`` widens the betas): the fake refuses what the
real service refuses (issue 32), the accepted lists being :data:`BETA_FAMILIES`, :data:`INVOKE_FIELDS`,
:data:`MANTLE_FIELDS` and :data:`REFUSED_TOOL_FIELDS`. Betas match by family (:func:`beta_family`: the name
without its date). InvokeModel and CountTokens' inner invoke body (:func:`validate_invoke_body`): a top-level key
outside :data:`INVOKE_FIELDS` (``model``, ``stream``, ``context_management``, ``tags``, ``safeguards`` …) or
``eager_input_streaming`` in a tool definition is 400 ``ValidationException`` "Malformed input request: #: extraneous
key [<key>] is not permitted, …"; an ``anthropic_beta`` item outside :data:`BETA_FAMILIES` is 400
``ValidationException`` "invalid beta flag" (the ``anthropic-beta`` header is not read there). Converse: the same
beta rule for ``additionalModelRequestFields.anthropic_beta``. Mantle (``/anthropic/v1/messages``): betas of the
``anthropic-beta`` header, fields of :data:`MANTLE_FIELDS`, refused in the Anthropic envelope (400
``invalid_request_error``). Claude Platform on AWS (``/v1/messages``) is the first party: nothing refused. Every
refusal is recorded on the request (:attr:`BedrockRequest.refusal`, :attr:`BedrockRequest.refused`;
:attr:`FakeBedrock.refusals`).

**Converse.** ``/model/{id}/converse[-stream]`` reads ``<converse_dir>/<converse_name(id)>.json``: a list
of ``{"event": "<:event-type>", "payload": {...}}`` or ``{"exception": "<name>", "payload": {...}}``.
:func:`converse_name` strips the ARN part, a geography prefix, one vendor prefix (``amazon.``,
``meta.``, ``mistral.``, ``anthropic.``, ``cohere.``, ``ai21.``, ``deepseek.``), the version suffix and
then a ``converse-`` prefix: ``us.amazon.nova-text`` → ``nova-text.json``,
``anthropic.converse-tools-v1:0`` → ``tools.json``. (``fake-status-*`` scenarios apply here too.)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import copy
import hashlib
import hmac
import json
import random
import re
import string
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import unquote

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from adapters._eventstream import HeaderValue, encode_message

from ._server import BackgroundServer
from .claude_api import STATUS_SCENARIOS as CLAUDE_STATUS_SCENARIOS
from .claude_api import RecordedRequest, Scenario, accumulate, get_scenario, rename_ids, signature_problem

__all__ = [
    "ANTHROPIC_VERSION",
    "BEDROCK_NAMESPACE",
    "BEDROCK_STREAM_SCENARIOS",
    "BETA_FAMILIES",
    "CORAL_NAMESPACE",
    "ERROR_CHUNK",
    "INVALID_BETA_MESSAGE",
    "INVOKE_FIELDS",
    "MANTLE_FIELDS",
    "METRICS_KEY",
    "REFUSED_TOOL_FIELDS",
    "STATUS_SCENARIOS",
    "STREAM_EXCEPTIONS",
    "STREAM_EXCEPTION_STATUS",
    "UNMODELED_ERROR_CODE",
    "BedrockRequest",
    "FakeBedrock",
    "Frame",
    "StreamPlan",
    "bdrk_ids",
    "beta_family",
    "chunk_frame",
    "converse_name",
    "converse_response",
    "error_frame",
    "event_frame",
    "exception_frame",
    "final_bedrock_message",
    "invocation_metrics",
    "scenario_name",
    "stream_body",
    "stream_plan",
    "validate_invoke_body",
]

Event = dict[str, Any]
_T = TypeVar("_T")

ANTHROPIC_VERSION = "bedrock-2023-05-31"
BEDROCK_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"
CORAL_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.coral.service/"
EVENTSTREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
METRICS_KEY = "amazon-bedrock-invocationMetrics"

GEO_PREFIXES = ("us-gov.", "us.", "eu.", "apac.", "jp.", "au.", "global.")
CONVERSE_VENDOR_PREFIXES = ("amazon.", "meta.", "mistral.", "anthropic.", "cohere.", "ai21.", "deepseek.")
_VERSION_SUFFIX = re.compile(r"(?:-v\d+:\d+|:\d+)$")

FIRST_BYTE_LATENCY_MS = 187  # deterministic fake latencies, so stream bodies are reproducible
MS_PER_EVENT = 23
SIGV4_MAX_SKEW_SECONDS = 300
SPLIT_SEED = 20250930  # fake-split: seed of the 1-7 byte write sizes
_PAD_ALPHABET = string.ascii_lowercase + string.ascii_uppercase + string.digits

# ---------------------------------------------------------------------------------------------
# What Bedrock accepts (issue 32): the one place the fake's strictness is defined
# ---------------------------------------------------------------------------------------------

#: Beta families (a beta name without its ``-YYYY-MM-DD`` / ``-YYYYMMDD`` date) Bedrock takes, in InvokeModel's
#: ``anthropic_beta``, Converse's ``additionalModelRequestFields.anthropic_beta`` and Mantle's ``anthropic-beta``.
#: Sources: what Claude Code 2.1.332 sends Bedrock in its own Bedrock mode (../shared/claude-code-traffic.md,
#: Bedrock-mode column: ``claude-code``, ``effort``, ``thinking-token-count`` in the header; ``interleaved-thinking``,
#: ``tool-search-tool``, ``thinking-token-count`` in the body), and AWS, "Anthropic Claude Messages API — Request
#: and Response" (https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-
#: request-response.html: ``computer-use``, ``token-efficient-tools``, ``output-128k``, ``context-1m``,
#: ``dev-full-thinking``, ``fine-grained-tool-streaming``, ``tool-examples``). Anything else — the first party's
#: ``context-management``, ``per-turn-control``, ``mid-conversation-tool-changes``, ``advanced-tool-use``,
#: ``request-tags``, ``extended-cache-ttl`` (anthropics/claude-code#56595) … — is "invalid beta flag".
BETA_FAMILIES = frozenset(
    {
        "claude-code",
        "interleaved-thinking",
        "tool-search-tool",
        "effort",
        "thinking-token-count",
        "computer-use",
        "token-efficient-tools",
        "output-128k",
        "context-1m",
        "dev-full-thinking",
        "fine-grained-tool-streaming",
        "tool-examples",
    }
)
#: Top-level InvokeModel (and CountTokens invoke) body fields. Sources: the AWS page above (its request body:
#: ``anthropic_version``, ``anthropic_beta``, ``max_tokens``, ``system``, ``messages``, ``temperature``, ``top_p``,
#: ``top_k``, ``tools``, ``tool_choice``, ``stop_sequences``, ``thinking``, ``output_format``, ``metadata``) and the
#: capture's Bedrock-mode column (``output_config``). Any other key (``model``, ``stream``, ``context_management``,
#: ``tags``, ``safeguards`` …) is "extraneous key [<key>] is not permitted", Bedrock's own wording.
INVOKE_FIELDS = frozenset(
    {
        "anthropic_version",
        "anthropic_beta",
        "messages",
        "system",
        "max_tokens",
        "metadata",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "output_format",
    }
)
#: The Mantle Messages endpoint's body: InvokeModel's plus ``model`` and ``stream`` (a first-party shaped body;
#: ``anthropic_version`` is not needed there).
MANTLE_FIELDS = INVOKE_FIELDS | {"model", "stream"}
#: Tool-definition fields Bedrock refuses: fine-grained tool streaming's per-tool flag (anthropics/claude-code#33229,
#: "extraneous key [eager_input_streaming] is not permitted"); Claude Code in Bedrock mode sends only ``name``,
#: ``description``, ``input_schema``, ``defer_loading`` (the capture).
REFUSED_TOOL_FIELDS = frozenset({"eager_input_streaming"})
INVALID_BETA_MESSAGE = "invalid beta flag"  # Bedrock's whole message (ValidationException)

_BETA_DATE = re.compile(r"-\d{4}-?\d{2}-?\d{2}$")


def beta_family(name: str) -> str:
    """A beta's feature: ``effort-2025-11-24`` -> ``effort`` (``claude-code-20250219`` -> ``claude-code``)."""
    return _BETA_DATE.sub("", name.strip())


def _unknown_betas(betas: list[str], families: frozenset[str] = BETA_FAMILIES) -> list[str]:
    return [b for b in betas if beta_family(b) not in families]


def _header_betas(request: web.Request) -> list[str]:
    """Every beta of the ``anthropic-beta`` header(s), comma-separated, in order."""
    return [b.strip() for v in request.headers.getall("anthropic-beta", []) for b in v.split(",") if b.strip()]


# ---------------------------------------------------------------------------------------------
# Error catalogues
# ---------------------------------------------------------------------------------------------

#: ``fake-status-<Name>`` -> (HTTP status, exception name, message); docs/wire-formats.md §3.5.
STATUS_SCENARIOS: dict[str, tuple[int, str, str]] = {
    f"fake-status-{name}": (status, name, message)
    for name, status, message in (
        ("ValidationException", 400, "Input is too long for requested model."),
        (
            "ServiceQuotaExceededException",
            400,
            "Your request exceeds the service quota for your account. You can view your quotas at "
            "https://console.aws.amazon.com/servicequotas/. You can resubmit your request later.",
        ),
        ("AccessDeniedException", 403, "You don't have access to the model with the specified model ID."),
        ("ResourceNotFoundException", 404, "Model not found: the requested model or inference profile is unknown."),
        ("ModelTimeoutException", 408, "Model has timed out in processing the request. Try your request again."),
        ("ThrottlingException", 429, "Too many requests, please wait before trying again."),
        (
            "ModelNotReadyException",
            429,
            "Model is not ready to serve inference requests. The AWS SDK will automatically retry the "
            "operation up to 5 times.",
        ),
        ("ModelErrorException", 424, "The model encountered an error processing your request."),
        ("ModelStreamErrorException", 424, "The model encountered an error while streaming the response."),
        (
            "InternalServerException",
            500,
            "The system encountered an unexpected error during processing. Try your request again.",
        ),
        ("ServiceUnavailableException", 503, "Bedrock is unable to process your request."),
    )
}

#: ``ResponseStream`` exception members -> their ``{"message": ...}`` payload (``fake-exc-<name>``).
STREAM_EXCEPTIONS: dict[str, dict[str, Any]] = {
    "throttlingException": {"message": "Too many requests, please wait before trying again."},
    "modelStreamErrorException": {
        "message": "The model encountered an error while streaming the response.",
        "originalStatusCode": 529,
        "originalMessage": "Overloaded",
    },
    "validationException": {"message": "Output blocked by content filtering policy."},
    "internalServerException": {
        "message": "The system encountered an unexpected error during processing. Try your request again."
    },
    "modelTimeoutException": {"message": "Model has timed out in processing the request. Try your request again."},
    "serviceUnavailableException": {"message": "Bedrock is unable to process your request."},
}

#: stream exception member -> the exception a non-streaming call raises instead (InvokeModel, Converse)
STREAM_EXCEPTION_STATUS: dict[str, str] = {
    "throttlingException": "ThrottlingException",
    "modelStreamErrorException": "ModelErrorException",
    "validationException": "ValidationException",
    "internalServerException": "InternalServerException",
    "modelTimeoutException": "ModelTimeoutException",
    "serviceUnavailableException": "ServiceUnavailableException",
}
_STATUS_BY_NAME: dict[str, tuple[int, str]] = {name: (st, msg) for st, name, msg in STATUS_SCENARIOS.values()}

UNMODELED_ERROR_CODE = "InternalFailure"
UNMODELED_ERROR_MESSAGE = "An internal error occurred while streaming the response."
ERROR_CHUNK: Event = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

#: Bedrock-only streaming scenarios (FakeClaudeAPI's scenarios, including ``fake-slow``, work too).
BEDROCK_STREAM_SCENARIOS: tuple[str, ...] = (
    *(f"fake-exc-{name}" for name in STREAM_EXCEPTIONS),
    "fake-error-unmodeled",
    "fake-bad-crc",
    "fake-split",
    "fake-cut-frame",
    "fake-metrics-mismatch",
    "fake-error-chunk",
)

# ---------------------------------------------------------------------------------------------
# Model ids -> scenarios
# ---------------------------------------------------------------------------------------------


def _strip_geo(name: str) -> str:
    for prefix in GEO_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def scenario_name(model_id: str) -> str:
    """The scenario a Bedrock model id (base id, inference profile id or ARN) names."""
    name = model_id.rsplit("/", 1)[-1] if model_id.startswith("arn:") else model_id
    name = _strip_geo(name).removeprefix("anthropic.")
    return _VERSION_SUFFIX.sub("", name)


def converse_name(model_id: str) -> str:
    """The fixture name (``<converse_dir>/<name>.json``) a Converse model id names."""
    name = model_id.rsplit("/", 1)[-1] if model_id.startswith("arn:") else model_id
    name = _strip_geo(name)
    for prefix in CONVERSE_VENDOR_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return _VERSION_SUFFIX.sub("", name).removeprefix("converse-")


def bdrk_ids(obj: _T) -> _T:
    """A deep copy of ``obj`` with FakeClaudeAPI ids (``msg_fake_…``) rewritten the Bedrock way (``msg_bdrk_…``)."""
    renamed: _T = rename_ids(obj, "bdrk")
    return renamed


# ---------------------------------------------------------------------------------------------
# Event-stream frames
# ---------------------------------------------------------------------------------------------


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _padding(index: int) -> str:
    """The ``p`` member: a run of ``abc…XYZ012…`` whose length varies from frame to frame."""
    return _PAD_ALPHABET[: 1 + (index * 17 + 11) % len(_PAD_ALPHABET)]


def chunk_frame(event: Event, index: int = 0) -> bytes:
    """One InvokeModelWithResponseStream ``chunk`` frame carrying ``event`` (``index`` varies the padding)."""
    payload = {"bytes": base64.b64encode(_compact(event).encode()).decode("ascii"), "p": _padding(index)}
    headers: dict[str, HeaderValue] = {
        ":event-type": "chunk",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return encode_message(headers, _compact(payload).encode())


def exception_frame(name: str, payload: dict[str, Any]) -> bytes:
    """A modeled exception frame (``:message-type: exception``)."""
    headers: dict[str, HeaderValue] = {
        ":exception-type": name,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, _compact(payload).encode())


def error_frame(code: str, message: str) -> bytes:
    """An unmodeled error frame (``:message-type: error``, empty payload)."""
    headers: dict[str, HeaderValue] = {":error-code": code, ":error-message": message, ":message-type": "error"}
    return encode_message(headers, b"")


def event_frame(event_type: str, payload: Any) -> bytes:
    """A ConverseStream event frame (payload is the JSON itself, no base64)."""
    headers: dict[str, HeaderValue] = {
        ":event-type": event_type,
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return encode_message(headers, _compact(payload).encode())


def invocation_metrics(events: list[Event], *, output_offset: int = 0) -> dict[str, int]:
    """``amazon-bedrock-invocationMetrics`` for a complete stream: the canonical final usage."""
    message = accumulate(events)
    usage = message["usage"] if message else {}
    latency = FIRST_BYTE_LATENCY_MS + MS_PER_EVENT * len(events)
    return {
        "inputTokenCount": int(usage.get("input_tokens", 0)),
        "outputTokenCount": int(usage.get("output_tokens", 0)) + output_offset,
        "invocationLatency": latency,
        "firstByteLatency": FIRST_BYTE_LATENCY_MS,
    }


@dataclass(frozen=True)
class Frame:
    data: bytes
    delay: float = 0.0  # seconds of silence before writing it (fake-slow, fake-pause)


@dataclass(frozen=True)
class StreamPlan:
    """Everything the fake writes for an InvokeModelWithResponseStream call."""

    name: str  # scenario name
    model: str  # the model echoed in message_start
    events: list[Event]  # decoded chunk events in frame order (incl. invocation metrics)
    frames: list[Frame]  # exact bytes, one write each unless split
    ending: Literal["complete", "cut"] = "complete"  # cut: abort the transport after the frames
    split_seed: int | None = None  # write the concatenated frames in 1-7 byte pieces
    delta_interval: float = 0.0
    pacing: Scenario | None = None  # the scenario whose delays the frames carry (a non-streamed answer waits as long)
    output_offset: int = 0  # invocation metrics outputTokenCount minus canonical usage

    @property
    def body(self) -> bytes:
        return b"".join(f.data for f in self.frames)


def _prefix(events: list[Event]) -> list[Event]:
    """message_start, the first content_block_start and two deltas (pings skipped)."""
    out: list[Event] = []
    deltas = 0
    for event in events:
        etype = event["type"]
        if etype == "message_start" or (etype == "content_block_start" and len(out) == 1):
            out.append(event)
        elif etype == "content_block_delta" and len(out) >= 2:
            out.append(event)
            deltas += 1
            if deltas == 2:
                break
    return out


def _base_scenario(name: str) -> Scenario:
    return get_scenario(name)  # unknown names: fake-text echoing ``name`` as the model


def stream_plan(model_id: str) -> StreamPlan:
    """The frames the fake streams for ``model_id`` (see the module docstring for the names)."""
    name = scenario_name(model_id)
    scenario = _base_scenario(name)
    events: list[Event] = bdrk_ids(scenario.events)
    tail: list[Frame] = []
    ending: Literal["complete", "cut"] = "cut" if scenario.ending == "cut" else "complete"
    split_seed: int | None = None
    offset = 0
    corrupt: int | None = None
    if name.startswith("fake-exc-") and name.removeprefix("fake-exc-") in STREAM_EXCEPTIONS:
        exc = name.removeprefix("fake-exc-")
        events = _prefix(events)
        tail = [Frame(exception_frame(exc, STREAM_EXCEPTIONS[exc]))]
    elif name == "fake-error-unmodeled":
        events = _prefix(events)
        tail = [Frame(error_frame(UNMODELED_ERROR_CODE, UNMODELED_ERROR_MESSAGE))]
    elif name == "fake-error-chunk":
        events = [*_prefix(events), copy.deepcopy(ERROR_CHUNK)]
    elif name == "fake-cut-frame":
        full = events
        events = _prefix(full)
        half = chunk_frame(full[full.index(events[-1]) + 1], len(events))  # the event after the prefix
        tail = [Frame(half[: len(half) // 2])]
        ending = "cut"
    elif name == "fake-bad-crc":
        corrupt = events.index(_prefix(events)[-1]) + 1  # the frame after the prefix (and its ping)
    elif name == "fake-split":
        split_seed = SPLIT_SEED
    elif name == "fake-metrics-mismatch":
        offset = 5
    if events and events[-1]["type"] == "message_stop":
        events[-1] = {**events[-1], METRICS_KEY: invocation_metrics(events, output_offset=offset)}
    frames: list[Frame] = []
    deltas = 0
    for i, event in enumerate(events):
        data = chunk_frame(event, i)
        if i == corrupt:
            damaged = bytearray(data)
            damaged[-2] ^= 0x5A  # inside the message CRC
            data = bytes(damaged)
        delay = 0.0
        if scenario.paced and event["type"] == "content_block_delta":
            deltas += 1
            delay = scenario.delay_before_delta(deltas)
        frames.append(Frame(data, delay))
    frames += tail
    return StreamPlan(
        name=name,
        model=scenario.model,
        events=events,
        frames=frames,
        ending=ending,
        split_seed=split_seed,
        delta_interval=scenario.delta_interval,
        pacing=scenario,
        output_offset=offset,
    )


def stream_body(model_id: str) -> bytes:
    """The exact bytes streamed for ``model_id`` (a cut stream stops inside a frame)."""
    return stream_plan(model_id).body


def final_bedrock_message(model_id: str) -> dict[str, Any]:
    """The InvokeModel JSON body for ``model_id`` (the accumulated stream, with bdrk ids)."""
    message = accumulate(bdrk_ids(_base_scenario(scenario_name(model_id)).events))
    assert message is not None
    return message


def _split(data: bytes, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    i = 0
    while i < len(data):
        n = rng.randint(1, 7)
        yield data[i : i + n]
        i += n


# ---------------------------------------------------------------------------------------------
# Request validation
# ---------------------------------------------------------------------------------------------


def _malformed(detail: str) -> str:
    return f"Malformed input request: {detail}, please reformat your input and try again."


_JSON_TYPE_NAMES = {
    bool: "Boolean",
    int: "Integer",
    float: "Number",
    str: "String",
    list: "JSONArray",
    dict: "JSONObject",
}


def _json_type(value: Any) -> str:
    return "Null" if value is None else _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


@dataclass(frozen=True)
class _Refusal:
    """Why a body is refused: the ValidationException message and what was refused (``beta:<name>``,
    ``field:<key>``, ``tool_field:<key>``; empty for a schema error)."""

    message: str
    refused: tuple[str, ...] = ()


def validate_invoke_body(raw: bytes, *, strict: bool = True) -> tuple[dict[str, Any] | None, str | None]:
    """(parsed body, None) or (None, ValidationException message), the checks Bedrock makes (§3.3); ``strict``
    adds issue 32's (only :data:`INVOKE_FIELDS`, no :data:`REFUSED_TOOL_FIELDS`, only :data:`BETA_FAMILIES`)."""
    body, refusal = _check_invoke_body(raw, strict=strict)
    return body, None if refusal is None else refusal.message


def _check_invoke_body(
    raw: bytes, *, strict: bool = True, families: frozenset[str] = BETA_FAMILIES
) -> tuple[dict[str, Any] | None, _Refusal | None]:
    try:
        body = json.loads(raw)
    except ValueError:
        return None, _Refusal("Malformed input request, please reformat your input and try again.")
    if not isinstance(body, dict):
        return None, _Refusal(_malformed(f"#: expected type: JSONObject, found: {_json_type(body)}"))
    extraneous = [k for k in body if (k not in INVOKE_FIELDS if strict else k in ("model", "stream"))]
    violations = [f"#: extraneous key [{key}] is not permitted" for key in extraneous]
    refused = [f"field:{key}" for key in extraneous]
    tools = body.get("tools")
    if strict and isinstance(tools, list):
        for i, tool in enumerate(tools):
            for key in sorted(REFUSED_TOOL_FIELDS.intersection(tool) if isinstance(tool, dict) else ()):
                violations.append(f"#/tools/{i}: extraneous key [{key}] is not permitted")
                if f"tool_field:{key}" not in refused:
                    refused.append(f"tool_field:{key}")
    if violations:  # everit-style: the violations one after the other
        return None, _Refusal(_malformed("".join(violations)), tuple(refused))
    for key in ("anthropic_version", "max_tokens", "messages"):
        if key not in body:
            return None, _Refusal(_malformed(f"#: required key [{key}] not found"))
    version = body["anthropic_version"]
    if version != ANTHROPIC_VERSION:
        return None, _Refusal(_malformed(f"#/anthropic_version: {version} is not a valid enum value"))
    betas: list[str] = []
    if "anthropic_beta" in body:
        betas = body["anthropic_beta"]
        if not isinstance(betas, list):
            return None, _Refusal(_malformed(f"#/anthropic_beta: expected type: JSONArray, found: {_json_type(betas)}"))
        for i, beta in enumerate(betas):
            if not isinstance(beta, str):
                return None, _Refusal(
                    _malformed(f"#/anthropic_beta/{i}: expected type: String, found: {_json_type(beta)}")
                )
    if not isinstance(body["max_tokens"], int) or isinstance(body["max_tokens"], bool):
        return None, _Refusal(
            _malformed(f"#/max_tokens: expected type: Integer, found: {_json_type(body['max_tokens'])}")
        )
    if not isinstance(body["messages"], list):
        return None, _Refusal(
            _malformed(f"#/messages: expected type: JSONArray, found: {_json_type(body['messages'])}")
        )
    unknown = _unknown_betas(betas, families) if strict else []
    if unknown:
        return None, _Refusal(INVALID_BETA_MESSAGE, tuple(f"beta:{b}" for b in unknown))
    return body, None


# ---------------------------------------------------------------------------------------------
# Converse
# ---------------------------------------------------------------------------------------------


def converse_response(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Best-effort Converse (non-stream) response assembled from ConverseStream events."""
    blocks: dict[int, dict[str, Any]] = {}
    tool_inputs: dict[int, str] = {}
    response: dict[str, Any] = {
        "output": {"message": {"role": "assistant", "content": []}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
        "metrics": {"latencyMs": FIRST_BYTE_LATENCY_MS},
    }
    for entry in entries:
        event, payload = entry.get("event"), entry.get("payload") or {}
        if event == "messageStart":
            response["output"]["message"]["role"] = payload.get("role", "assistant")
        elif event == "contentBlockStart":
            start = payload.get("start", {})
            if "toolUse" in start:
                tool = start["toolUse"]
                block = {"toolUseId": tool.get("toolUseId"), "name": tool.get("name"), "input": {}}
                if "type" in tool:
                    block["type"] = tool["type"]
                blocks[payload.get("contentBlockIndex", len(blocks))] = {"toolUse": block}
        elif event == "contentBlockDelta":
            index = payload.get("contentBlockIndex", 0)
            delta = payload.get("delta", {})
            block = blocks.setdefault(index, {})
            if "text" in delta:
                block.setdefault("text", "")
                block["text"] += delta["text"]
            elif "toolUse" in delta:
                tool_inputs[index] = tool_inputs.get(index, "") + delta["toolUse"].get("input", "")
            elif "reasoningContent" in delta:
                reasoning = block.setdefault("reasoningContent", {})
                rdelta = delta["reasoningContent"]
                if "redactedContent" in rdelta:
                    reasoning["redactedContent"] = rdelta["redactedContent"]
                else:
                    text = reasoning.setdefault("reasoningText", {"text": ""})
                    text["text"] += rdelta.get("text", "")
                    if "signature" in rdelta:
                        text["signature"] = rdelta["signature"]
            elif "citation" in delta:
                block.setdefault("citations", []).append(delta["citation"])
        elif event == "contentBlockStop":
            index = payload.get("contentBlockIndex", 0)
            if index in tool_inputs and "toolUse" in blocks.get(index, {}):
                blocks[index]["toolUse"]["input"] = json.loads(tool_inputs.pop(index) or "{}")
        elif event == "messageStop":
            response["stopReason"] = payload.get("stopReason", "end_turn")
            if "additionalModelResponseFields" in payload:
                response["additionalModelResponseFields"] = payload["additionalModelResponseFields"]
        elif event == "metadata":
            if "usage" in payload:
                response["usage"] = payload["usage"]
            if "metrics" in payload:
                response["metrics"] = payload["metrics"]
    content = response["output"]["message"]["content"]
    for index in sorted(blocks):
        block = blocks[index]
        if "citations" in block:  # text with citations becomes a citationsContent block
            content.append(
                {
                    "citationsContent": {
                        "content": [{"text": block.get("text", "")}],
                        "citations": [_citation_from_delta(c) for c in block["citations"]],
                    }
                }
            )
        elif block:
            content.append(block)
    return response


def _citation_from_delta(delta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in delta.items() if k in ("title", "source", "sourceContent", "location")}


# ---------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------

Surface = Literal["bedrock", "bedrock-mantle", "aws-external-anthropic"]
AuthKind = Literal["sigv4", "bearer", "api-key"]
_MODEL_OPERATIONS = ("invoke", "invoke-with-response-stream", "count-tokens", "converse", "converse-stream")


@dataclass
class BedrockRequest(RecordedRequest):
    """A recorded request; ``path`` is aiohttp's decoded path, ``raw_path`` the bytes as sent."""

    raw_path: str = ""
    surface: Surface | None = None  # == the expected SigV4 signing name
    operation: str | None = None  # invoke, invoke-with-response-stream, count-tokens, converse, ..., messages
    model_id: str | None = None  # unquoted path segment (``/model/{modelId}/…`` only)
    scenario: str | None = None
    auth: AuthKind | None = None  # how the request authenticated (or tried to)
    auth_error: str | None = None  # exception name when authentication failed
    signing_name: str | None = None  # SigV4 credential-scope service
    inner_json: Any = None  # count-tokens: the decoded ``input.invokeModel.body``
    refusal: str | None = None  # the message when the body was refused (a 400 the real service answers too)
    refused: tuple[str, ...] = ()  # what was refused: ``beta:<name>``, ``field:<key>``, ``tool_field:<key>``


@dataclass(frozen=True)
class _Route:
    surface: Surface
    operation: str
    model_id: str | None = None


@dataclass(frozen=True)
class _AuthFailure:
    name: str
    message: str


@dataclass
class _Counters:
    disconnects: int = 0
    requests: list[BedrockRequest] = field(default_factory=list)


_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-f]+)\s*$"
)
_SIGNATURE_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your AWS "
    "Secret Access Key and signing method. Consult the service documentation for details."
)
_INVALID_TOKEN = "The security token included in the request is invalid."


def _route(method: str, raw_path: str) -> _Route | None:
    if method != "POST":
        return None
    path = raw_path.rstrip("/")
    if path in ("/anthropic/v1/messages", "/anthropic/v1/messages/count_tokens"):
        return _Route("bedrock-mantle", path.rsplit("/", 1)[-1])
    if path in ("/v1/messages", "/v1/messages/count_tokens"):
        return _Route("aws-external-anthropic", path.rsplit("/", 1)[-1])
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "model" and parts[2] and parts[3] in _MODEL_OPERATIONS:
        return _Route("bedrock", parts[3], unquote(parts[2]))
    return None


class FakeBedrock(BackgroundServer):
    """The fake Bedrock runtime. ``with FakeBedrock() as fake: ...`` starts and stops it."""

    def __init__(
        self,
        *,
        access_key_id: str = "AKIDFAKEBEDROCK",
        secret_access_key: str = "fake-secret",
        session_token: str | None = None,
        region: str = "us-east-1",
        api_keys: tuple[str, ...] | list[str] = ("bedrock-api-key",),
        converse_dir: Path | None = None,
        strict: bool = True,
        extra_betas: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.credentials = Credentials(access_key_id, secret_access_key, session_token)
        #: refuse unknown betas and fields as Bedrock does (module docstring); False: only the schema checks
        self.strict = strict
        #: the beta families taken: :data:`BETA_FAMILIES` plus ``extra_betas`` (names or families), e.g. a beta
        #: the provider ships before the gateway knows it (an operator's ``betas: {allow: …}``); assignable
        self.beta_families: frozenset[str] = BETA_FAMILIES | {beta_family(b) for b in extra_betas}
        self.region = region
        self.api_keys = tuple(api_keys)
        self.converse_dir = converse_dir
        #: when set, every event stream is written in 1-7 byte pieces drawn from this seed
        self.split_writes: int | None = None
        self._botocore_session: Any = None
        super().__init__()

    thread_name = "fake-bedrock"

    def _new_state(self) -> _Counters:
        return _Counters()

    # -- public state -----------------------------------------------------------------------

    @property
    def requests(self) -> list[BedrockRequest]:
        with self._cond:
            return list(self._state.requests)

    @property
    def refusals(self) -> list[BedrockRequest]:
        """The recorded requests whose body was refused (``refusal`` set), oldest first."""
        return [r for r in self.requests if r.refusal is not None]

    def botocore_client(self, **config: Any) -> Any:
        """A botocore ``bedrock-runtime`` client for this fake (SigV4 with its credentials, no retries)."""
        import botocore.config
        import botocore.session

        options: dict[str, Any] = {"retries": {"total_max_attempts": 1}, **config}
        if self._botocore_session is None:  # loading the service model is the slow part: share it
            self._botocore_session = botocore.session.get_session()
        return self._botocore_session.create_client(
            "bedrock-runtime",
            region_name=self.region,
            endpoint_url=self.base_url,
            aws_access_key_id=self.credentials.access_key,
            aws_secret_access_key=self.credentials.secret_key,
            aws_session_token=self.credentials.token,
            config=botocore.config.Config(**options),
        )

    # -- responses ------------------------------------------------------------------------------

    @staticmethod
    def _aws_error(
        status: int, name: str, message: str, request_id: str, namespace: str = BEDROCK_NAMESPACE
    ) -> web.Response:
        return web.Response(
            status=status,
            body=_compact({"message": message}).encode(),
            content_type="application/json",
            headers={"x-amzn-RequestId": request_id, "x-amzn-ErrorType": f"{name}:{namespace}"},
        )

    def _status_error(self, name: str, request_id: str, message: str | None = None) -> web.Response:
        status, default = _STATUS_BY_NAME[name]
        return self._aws_error(status, name, message or default, request_id)

    def _refuse(self, record: BedrockRequest, refusal: _Refusal, request_id: str) -> web.Response:
        """A 400 ValidationException for a refused body, recorded on the request."""
        with self._cond:
            record.refusal, record.refused = refusal.message, refusal.refused
        return self._status_error("ValidationException", request_id, refusal.message)

    @staticmethod
    def _anthropic_error(status: int, error_type: str, message: str, request_id: str) -> web.Response:
        payload = {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}
        return web.Response(
            status=status,
            body=_compact(payload).encode(),
            content_type="application/json",
            headers={"request-id": request_id, "x-amzn-RequestId": request_id},
        )

    # -- authentication -------------------------------------------------------------------------

    def _authenticate(
        self, request: web.Request, body: bytes, route: _Route, record: BedrockRequest
    ) -> _AuthFailure | None:
        authorization = request.headers.get("Authorization", "")
        if authorization.startswith("AWS4-HMAC-SHA256"):
            record.auth = "sigv4"
            return self._verify_sigv4(request, body, authorization, route.surface, record)
        if authorization[:7].lower() == "bearer ":
            record.auth = "bearer"
            if authorization[7:].strip() in self.api_keys:
                return None
            return _AuthFailure("UnrecognizedClientException", _INVALID_TOKEN)
        api_key = request.headers.get("x-api-key")
        if route.surface == "aws-external-anthropic" and api_key is not None:
            record.auth = "api-key"
            return None if api_key in self.api_keys else _AuthFailure("UnrecognizedClientException", _INVALID_TOKEN)
        return _AuthFailure("UnrecognizedClientException", "Missing Authentication Token")

    def _verify_sigv4(
        self, request: web.Request, body: bytes, authorization: str, service: str, record: BedrockRequest
    ) -> _AuthFailure | None:
        m = _AUTH_RE.match(authorization)
        if m is None:
            return _AuthFailure(
                "IncompleteSignatureException",
                "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' parameters.",
            )
        scope = m["cred"].split("/")
        if len(scope) != 5 or scope[4] != "aws4_request":
            return _AuthFailure("IncompleteSignatureException", f"Credential is malformed: {m['cred']}.")
        key_id, scope_date, scope_region, scope_service, _ = scope
        record.signing_name = scope_service
        if key_id != self.credentials.access_key:
            return _AuthFailure("UnrecognizedClientException", _INVALID_TOKEN)
        token = request.headers.get("X-Amz-Security-Token")
        if token != self.credentials.token:
            return _AuthFailure("UnrecognizedClientException", _INVALID_TOKEN)
        if scope_region != self.region:
            return _AuthFailure("InvalidSignatureException", "Credential should be scoped to a valid region.")
        if scope_service != service:
            return _AuthFailure(
                "InvalidSignatureException", f"Credential should be scoped to correct service: '{service}'."
            )
        amz_date = request.headers.get("X-Amz-Date", "")
        try:
            when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            return _AuthFailure(
                "IncompleteSignatureException",
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
            )
        now = datetime.now(UTC)
        skew = (now - when).total_seconds()
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        if skew > SIGV4_MAX_SKEW_SECONDS:
            return _AuthFailure(
                "InvalidSignatureException", f"Signature expired: {amz_date} is now earlier than {stamp} - 5 min."
            )
        if skew < -SIGV4_MAX_SKEW_SECONDS:
            return _AuthFailure(
                "InvalidSignatureException",
                f"Signature not yet current: {amz_date} is still later than {stamp} + 5 min.",
            )
        if scope_date != amz_date[:8]:
            return _AuthFailure(
                "InvalidSignatureException",
                f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
                f"'{scope_date}' != '{amz_date[:8]}', from '{amz_date}'.",
            )
        content_sha = request.headers.get("X-Amz-Content-SHA256")
        if content_sha is not None and content_sha not in ("UNSIGNED-PAYLOAD", hashlib.sha256(body).hexdigest()):
            return _AuthFailure(
                "InvalidSignatureException",
                "The provided 'x-amz-content-sha256' header does not match what was computed.",
            )
        signed = m["signed"].split(";")
        if "host" not in signed:
            return _AuthFailure(
                "InvalidSignatureException", "'Host' must be a 'SignedHeader' in the AWS Authorization."
            )
        # Rebuild the request exactly as received: the raw path (botocore quotes it again for the
        # canonical request, as the client did), the signed headers' values and the body bytes.
        aws_request = AWSRequest(method=request.method, url=f"http://{request.host}{request.raw_path}", data=body)
        for name in signed:
            values = request.headers.getall(name, [])
            if not values:
                return _AuthFailure("InvalidSignatureException", f"Signed header '{name}' is missing from the request.")
            for value in values:
                aws_request.headers[name] = value
        aws_request.context["timestamp"] = amz_date
        signer = SigV4Auth(self.credentials, service, self.region)
        canonical = signer.canonical_request(aws_request)
        string_to_sign = signer.string_to_sign(aws_request, canonical)
        expected = signer.signature(string_to_sign, aws_request)
        if signer.signed_headers(signer.headers_to_sign(aws_request)) != m["signed"] or not hmac.compare_digest(
            expected, m["sig"]
        ):
            return _AuthFailure(
                "InvalidSignatureException",
                f"{_SIGNATURE_MISMATCH}\n\nThe Canonical String for this request should have been\n'{canonical}'"
                f"\n\nThe String-to-Sign should have been\n'{string_to_sign}'\n",
            )
        return None

    # -- dispatch --------------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        parsed: Any = None
        if body:
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
        raw_path, _, query = request.raw_path.partition("?")
        route = _route(request.method, raw_path)
        record = BedrockRequest(
            method=request.method,
            path=request.path,
            query=query,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            json=parsed,
            raw_path=raw_path,
        )
        request_id = str(uuid.uuid4())
        if route is None:
            self._record(record)
            return self._aws_error(404, "UnknownOperationException", "Unknown operation", request_id, CORAL_NAMESPACE)
        record.surface, record.operation, record.model_id = route.surface, route.operation, route.model_id
        if route.model_id is not None:
            record.scenario = scenario_name(route.model_id)
        elif isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
            record.scenario = scenario_name(parsed["model"])
        failure = self._authenticate(request, body, route, record)
        if failure is not None:
            record.auth_error = failure.name
        if route.operation == "count-tokens" and failure is None:
            record.inner_json = _decode_count_tokens_inner(parsed)
        self._record(record)
        if failure is not None:
            return self._aws_error(403, failure.name, failure.message, request_id, CORAL_NAMESPACE)

        if route.surface != "bedrock":
            return await self._first_party(request, route, record, parsed, body, request_id)
        assert route.model_id is not None
        if route.operation in ("invoke", "invoke-with-response-stream"):
            return await self._invoke(request, record, body, request_id, route.operation != "invoke")
        if route.operation == "count-tokens":
            return self._count_tokens(record, parsed, request_id)
        return await self._converse(request, record, parsed, request_id, route.operation == "converse-stream")

    # -- InvokeModel -----------------------------------------------------------------------------

    async def _invoke(
        self, request: web.Request, record: BedrockRequest, body: bytes, request_id: str, stream: bool
    ) -> web.StreamResponse:
        assert record.model_id is not None
        model_id = record.model_id
        parsed, refusal = _check_invoke_body(body, strict=self.strict, families=self.beta_families)
        if refusal is not None:
            return self._refuse(record, refusal, request_id)
        problem = signature_problem(parsed)
        if problem is not None:  # Bedrock relays the model's own check: the API's message
            return self._refuse(record, _Refusal(problem, ("thinking_signature",)), request_id)
        name = scenario_name(model_id)
        if name in STATUS_SCENARIOS:
            return self._status_error(STATUS_SCENARIOS[name][1], request_id)
        plan = stream_plan(model_id)
        if stream:
            return await self._invoke_stream(request, plan, request_id)
        return await self._invoke_json(request, plan, request_id)

    async def _invoke_stream(self, request: web.Request, plan: StreamPlan, request_id: str) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": EVENTSTREAM_CONTENT_TYPE,
                "X-Amzn-Bedrock-Content-Type": "application/json",
                "x-amzn-RequestId": request_id,
            },
        )
        seed = plan.split_seed if plan.split_seed is not None else self.split_writes
        try:
            await resp.prepare(request)
            if seed is not None:
                for piece in _split(plan.body, seed):
                    if self._client_gone(request):
                        raise ConnectionResetError("client went away")
                    await resp.write(piece)
            else:
                for frame in plan.frames:
                    if frame.delay:
                        await asyncio.sleep(frame.delay)
                    if self._client_gone(request):
                        raise ConnectionResetError("client went away")
                    await resp.write(frame.data)
        except ConnectionError:
            self._note_disconnect()
            return resp
        except asyncio.CancelledError:
            self._note_disconnect()
            raise
        if plan.ending == "cut":
            self._abort(request)
        return resp

    async def _invoke_json(self, request: web.Request, plan: StreamPlan, request_id: str) -> web.StreamResponse:
        name = plan.name
        if name.startswith("fake-exc-") and name.removeprefix("fake-exc-") in STREAM_EXCEPTIONS:
            return self._status_error(STREAM_EXCEPTION_STATUS[name.removeprefix("fake-exc-")], request_id)
        if name == "fake-error-unmodeled":
            return self._status_error("InternalServerException", request_id)
        if plan.ending == "cut":
            self._abort(request)
            return web.Response(status=500)  # never reaches the client
        if plan.events and plan.events[-1]["type"] == "error":
            return self._status_error("ServiceUnavailableException", request_id, "Overloaded")
        if plan.pacing is not None and not await self._pace_json(request, plan.pacing):
            return web.Response(status=499)
        message = accumulate(plan.events)
        assert message is not None
        metrics = plan.events[-1].get(METRICS_KEY) or invocation_metrics(plan.events, output_offset=plan.output_offset)
        return web.Response(
            status=200,
            body=_compact(message).encode(),
            content_type="application/json",
            headers={
                "x-amzn-RequestId": request_id,
                "x-amzn-bedrock-input-token-count": str(metrics["inputTokenCount"]),
                "x-amzn-bedrock-output-token-count": str(metrics["outputTokenCount"]),
                "x-amzn-bedrock-invocation-latency": str(metrics["invocationLatency"]),
            },
        )

    # -- CountTokens -----------------------------------------------------------------------------

    def _count_tokens(self, record: BedrockRequest, parsed: Any, request_id: str) -> web.Response:
        assert record.model_id is not None
        name = scenario_name(record.model_id)
        if name in STATUS_SCENARIOS:
            return self._status_error(STATUS_SCENARIOS[name][1], request_id)
        if name.startswith("fake-nocount"):
            return self._status_error(
                "ValidationException", request_id, "The provided model doesn't support counting tokens."
            )
        source = parsed.get("input") if isinstance(parsed, dict) else None
        if not isinstance(source, dict) or len(source) != 1:
            return self._status_error(
                "ValidationException",
                request_id,
                "1 validation error detected: Value at 'input' failed to satisfy "
                "constraint: Member must have exactly one of invokeModel, converse set",
            )
        if "converse" in source:
            inner = _compact(source["converse"]).encode()
            refusal = self._converse_refusal(source["converse"])
            if refusal is not None:
                return self._refuse(record, refusal, request_id)
        else:
            invoke = source.get("invokeModel")
            blob = invoke.get("body") if isinstance(invoke, dict) else None
            try:
                inner = base64.b64decode(blob, validate=True) if isinstance(blob, str) else b""
            except (binascii.Error, ValueError):
                inner = b""
            if not inner:
                return self._status_error("ValidationException", request_id, "input.invokeModel.body: invalid blob")
            _, refusal = _check_invoke_body(inner, strict=self.strict, families=self.beta_families)
            if refusal is not None:
                return self._refuse(record, refusal, request_id)
        return web.Response(
            status=200,
            body=_compact({"inputTokens": len(inner) // 4 + 3}).encode(),
            content_type="application/json",
            headers={"x-amzn-RequestId": request_id},
        )

    # -- Converse --------------------------------------------------------------------------------

    def _converse_refusal(self, body: Any) -> _Refusal | None:
        """Converse's beta rule: ``additionalModelRequestFields.anthropic_beta`` items of :data:`BETA_FAMILIES`."""
        extra = body.get("additionalModelRequestFields") if isinstance(body, dict) else None
        betas = extra.get("anthropic_beta") if isinstance(extra, dict) else None
        if not self.strict or not isinstance(betas, list):
            return None
        unknown = _unknown_betas([b for b in betas if isinstance(b, str)], self.beta_families)
        return _Refusal(INVALID_BETA_MESSAGE, tuple(f"beta:{b}" for b in unknown)) if unknown else None

    async def _converse(
        self, request: web.Request, record: BedrockRequest, parsed: Any, request_id: str, stream: bool
    ) -> web.StreamResponse:
        assert record.model_id is not None
        model_id = record.model_id
        if not isinstance(parsed, dict) or ("messages" in parsed and not isinstance(parsed["messages"], list)):
            return self._status_error("ValidationException", request_id, "Malformed Converse request body.")
        refusal = self._converse_refusal(parsed)
        if refusal is not None:
            return self._refuse(record, refusal, request_id)
        name = scenario_name(model_id)
        if name in STATUS_SCENARIOS:
            return self._status_error(STATUS_SCENARIOS[name][1], request_id)
        path = self.converse_dir / f"{converse_name(model_id)}.json" if self.converse_dir is not None else None
        if path is None or not path.is_file():
            return self._status_error(
                "ValidationException",
                request_id,
                f"The provided model identifier is invalid. (fake: no fixture {path})",
            )
        entries: list[dict[str, Any]] = json.loads(path.read_text())
        if not stream:
            for entry in entries:
                if "exception" in entry:
                    name = entry["exception"]
                    mapped = STREAM_EXCEPTION_STATUS.get(name, "InternalServerException")
                    return self._status_error(mapped, request_id, (entry.get("payload") or {}).get("message"))
            return web.Response(
                status=200,
                body=_compact(converse_response(entries)).encode(),
                content_type="application/json",
                headers={"x-amzn-RequestId": request_id},
            )
        resp = web.StreamResponse(
            status=200, headers={"Content-Type": EVENTSTREAM_CONTENT_TYPE, "x-amzn-RequestId": request_id}
        )
        try:
            await resp.prepare(request)
            frames = [
                exception_frame(e["exception"], e.get("payload") or {})
                if "exception" in e
                else event_frame(e["event"], e.get("payload") or {})
                for e in entries
            ]
            data = b"".join(frames)
            pieces = _split(data, self.split_writes) if self.split_writes is not None else iter(frames)
            for piece in pieces:
                if self._client_gone(request):
                    raise ConnectionResetError("client went away")
                await resp.write(piece)
        except ConnectionError:
            self._note_disconnect()
        except asyncio.CancelledError:
            self._note_disconnect()
            raise
        return resp

    # -- first-party surfaces (mantle, Claude Platform on AWS) -----------------------------------

    async def _first_party(
        self, request: web.Request, route: _Route, record: BedrockRequest, body: Any, raw: bytes, request_id: str
    ) -> web.StreamResponse:
        if route.surface == "aws-external-anthropic" and not request.headers.get("anthropic-workspace-id"):
            return self._anthropic_error(
                400, "invalid_request_error", "anthropic-workspace-id header is required", request_id
            )
        if not isinstance(body, dict):
            return self._anthropic_error(400, "invalid_request_error", "body: invalid JSON", request_id)
        if route.surface == "bedrock-mantle" and self.strict:
            refusal = _mantle_refusal(_header_betas(request), body, self.beta_families)
            if refusal is not None:
                with self._cond:
                    record.refusal, record.refused = refusal.message, refusal.refused
                return self._anthropic_error(400, "invalid_request_error", refusal.message, request_id)
        if route.operation == "count_tokens":
            return web.Response(
                status=200,
                body=_compact({"input_tokens": len(raw) // 4 + 3}).encode(),
                content_type="application/json",
                headers={"request-id": request_id, "x-amzn-RequestId": request_id},
            )
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return self._anthropic_error(400, "invalid_request_error", "model: Field required", request_id)
        name = scenario_name(model)
        if name in CLAUDE_STATUS_SCENARIOS:
            status, error_type, message = CLAUDE_STATUS_SCENARIOS[name]
            return self._anthropic_error(status, error_type, message, request_id)
        scenario = get_scenario(name)
        headers = {"request-id": request_id, "x-amzn-RequestId": request_id}
        if body.get("stream") is not True:
            if scenario.ending == "error":
                return self._anthropic_error(529, "overloaded_error", "Overloaded", request_id)
            if scenario.ending == "cut":
                self._abort(request)
                return web.Response(status=500)
            final = accumulate(scenario.events)
            return web.Response(
                status=200, body=_compact(final).encode(), content_type="application/json", headers=headers
            )
        resp = web.StreamResponse(
            status=200,
            headers={**headers, "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"},
        )
        return await self._send_sse(request, resp, scenario.events, scenario)


def _mantle_refusal(betas: list[str], body: dict[str, Any], families: frozenset[str]) -> _Refusal | None:
    """Mantle's checks, answered in the Anthropic envelope with the first party's wording: betas of
    :data:`BETA_FAMILIES`, fields of :data:`MANTLE_FIELDS`, no :data:`REFUSED_TOOL_FIELDS` in a tool."""
    unknown = _unknown_betas(betas, families)
    if unknown:
        listed = ", ".join(f"`{b}`" for b in unknown)
        return _Refusal(
            f"Unexpected value(s) {listed} for the `anthropic-beta` header. Please consult our documentation at "
            "docs.anthropic.com or try again without the header.",
            tuple(f"beta:{b}" for b in unknown),
        )
    extra = [k for k in body if k not in MANTLE_FIELDS]
    refused = [f"field:{k}" for k in extra]
    messages = [f"{k}: Extra inputs are not permitted" for k in extra]
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        for key in sorted(REFUSED_TOOL_FIELDS.intersection(tool) if isinstance(tool, dict) else ()):
            messages.append(f"tools.{i}.{key}: Extra inputs are not permitted")
            if f"tool_field:{key}" not in refused:
                refused.append(f"tool_field:{key}")
    return _Refusal(messages[0], tuple(refused)) if messages else None


def _decode_count_tokens_inner(parsed: Any) -> Any:
    try:
        blob = parsed["input"]["invokeModel"]["body"]
        return json.loads(base64.b64decode(blob, validate=True))
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="run the fake until Ctrl-C and print its URL")
    parser.add_argument("--converse-dir", type=Path, default=None)
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free one)")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.print_help()
        return 0
    fake = FakeBedrock(converse_dir=args.converse_dir)
    fake.listen_port = args.port
    with fake:
        print(fake.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
