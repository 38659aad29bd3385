"""Claude Code itself — the real ``claude`` CLI (npm ``@anthropic-ai/claude-code``, the version pinned in
``tests/claude_cli.py``, installed by ``.ci/run``) — through the gateway served as a process, in each of the CLI's
three ways to reach a gateway:

- ``messages``: ``ANTHROPIC_BASE_URL`` (``POST /v1/messages?beta=true``);
- ``bedrock``: ``CLAUDE_CODE_USE_BEDROCK`` + ``ANTHROPIC_BEDROCK_BASE_URL`` (``GET /inference-profiles``, then
  ``POST /model/{id}/invoke-with-response-stream``, ``/invoke``);
- ``vertex``: ``CLAUDE_CODE_USE_VERTEX`` + ``ANTHROPIC_VERTEX_BASE_URL`` (``POST /v1/projects/{p}/locations/{l}/
  publishers/anthropic/models/{m}:streamRawPredict``, ``:rawPredict``);

each with ``ANTHROPIC_AUTH_TOKEN`` as the gateway key (sent as ``Authorization: Bearer``), on the built-in mock
provider and on the fake Claude API. ``claude -p`` runs in a fresh HOME with its updater and telemetry off; each run
takes well under a second here. A failure shows what the CLI printed and every request the gateway saw from it
(its access lines: method, path, status).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.claude_cli import ClaudeRun, run_claude
from tests.fakes.claude_api import FakeClaudeAPI

MODES = ("messages", "bedrock", "vertex")
KEY = "sk-dev"
MOCK_CONFIG = """
auth: {keys: [{name: dev, key: sk-dev}]}
providers: {mock: {kind: mock}}
models: {"*": {targets: [{provider: mock}]}}
"""
PROMPT = "Say hello"
MOCK_ANSWER = f"This is a mock reply from messages-gateway to: {PROMPT}."  # adapters/_mock_answer.py
FAKE_ANSWER = (  # tests/fakes/claude_api.py, the fake-text scenario
    "Hello! I'm a fake Claude model answering from a local test server."
    " This reply arrives in several small pieces so framing can be checked."
)
STREAM_JSON = ("--output-format", "stream-json", "--verbose")
PARTIAL = "--include-partial-messages"  # stream-json then has each Messages event as it arrived

Serve = Callable[..., Any]


def mode_env(mode: str, url: str, key: str = KEY) -> dict[str, str]:
    """The environment that points Claude Code at the gateway ``url`` in ``mode`` (what the docs and
    the README's Claude Code section gives for each)."""
    if mode == "messages":
        return {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": key}
    if mode == "bedrock":
        return {
            "CLAUDE_CODE_USE_BEDROCK": "1",
            "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1",
            "ANTHROPIC_BEDROCK_BASE_URL": url,
            "AWS_REGION": "us-east-1",
            "ANTHROPIC_AUTH_TOKEN": key,
        }
    assert mode == "vertex"
    return {
        "CLAUDE_CODE_USE_VERTEX": "1",
        "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1",
        "ANTHROPIC_VERTEX_BASE_URL": f"{url}/v1",
        "ANTHROPIC_VERTEX_PROJECT_ID": "p",
        "CLOUD_ML_REGION": "us-east5",
        "ANTHROPIC_AUTH_TOKEN": key,
    }


def route_kind(mode: str, path: str) -> str | None:
    """``"stream"`` or ``"plain"`` when ``path`` (as the access line has it: no query) asks for a model's answer in
    ``mode`` on its streaming or non-streaming route, else None. In ``messages`` mode both are ``/v1/messages``
    (which the access line cannot tell apart: ``"stream"``, as the CLI streams)."""
    if mode == "messages":
        return "stream" if path == "/v1/messages" else None
    if mode == "bedrock":
        if path.startswith("/model/") and path.endswith("/invoke-with-response-stream"):
            return "stream"
        return "plain" if path.startswith("/model/") and path.endswith("/invoke") else None
    if not path.startswith("/v1/projects/p/locations/us-east5/publishers/anthropic/models/"):
        return None
    if path.endswith(":streamRawPredict"):
        return "stream"
    return "plain" if path.endswith(":rawPredict") and "count-tokens" not in path else None


def is_model_request(mode: str, path: str) -> bool:
    return route_kind(mode, path) is not None


def access_lines(served: Any) -> list[dict[str, Any]]:
    """Every access line in the served gateway's log but the fixture's own ``GET /healthz``."""
    lines = []
    for text in Path(served.log).read_text(errors="replace").splitlines():
        _, found, rest = text.partition("gateway.access: ")
        if not found:
            continue
        try:
            line = json.loads(rest)
        except ValueError:
            continue
        if line.get("path") != "/healthz":
            lines.append(line)
    return lines


def seen(served: Any, mode: str, *, timeout: float = 3.0) -> list[dict[str, Any]]:
    """The gateway's access lines of the CLI's requests, once one for a model's answer is there (or ``timeout`` s
    have passed: the line is written as the response ends, which may be just after the CLI exits)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = access_lines(served)
        if any(is_model_request(mode, str(line["path"])) for line in lines) or time.monotonic() > deadline:
            time.sleep(0.1)  # any line still being written
            return access_lines(served)
        time.sleep(0.05)


def show(lines: list[dict[str, Any]]) -> str:
    shown = [
        f"  {line['method']} {line['path']} -> {line['status']} {line['outcome']}"
        f" (alias {line['alias']!r}, provider {line['provider']!r}, model {line['model']!r}, key {line['key']!r},"
        f" session {line['session_id']!r})"
        for line in lines
    ]
    return "\n".join(shown) or "  (none)"


def report(run: ClaudeRun, lines: list[dict[str, Any]]) -> str:
    return f"{run.describe()}\n--- requests the gateway saw ---\n{show(lines)}"


def start(serve: Serve, tmp_path: Path, config: str, name: str = "gateway.yaml") -> Any:
    path = tmp_path / name
    path.write_text(config)
    return serve(path)


def fake_config(fake: FakeClaudeAPI) -> str:
    return f"""
auth: {{keys: [{{name: dev, key: sk-dev}}]}}
providers:
  claude: {{kind: anthropic, api_key: provider-key, base_url: "{fake.base_url}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""


def stream_events(run: ClaudeRun) -> list[dict[str, Any]]:
    """The Messages stream events the CLI printed (``--include-partial-messages``), in order."""
    return [e["event"] for e in run.events() if e.get("type") == "stream_event" and isinstance(e.get("event"), dict)]


# --------------------------------------------------------------------------------------------- the mock provider


@pytest.mark.parametrize("mode", MODES)
def test_claude_p_prints_the_mock_answer(mode: str, claude_cli: Path, serve: Serve, tmp_path: Path) -> None:
    """``claude -p`` exits 0 with the mock's answer, streamed (its first request for the answer is the streaming
    route, answered 200 by the mock for key ``dev``), and nothing else the CLI sent was refused."""
    served = start(serve, tmp_path, MOCK_CONFIG)
    run = run_claude(claude_cli, PROMPT, env=mode_env(mode, served.url))
    lines = seen(served, mode)
    why = report(run, lines)
    assert run.returncode == 0, why
    assert MOCK_ANSWER in run.stdout, why
    answers = [line for line in lines if is_model_request(mode, str(line["path"]))]
    assert answers, why
    first = answers[0]
    assert route_kind(mode, str(first["path"])) == "stream", why
    assert (first["status"], first["outcome"]) == (200, "completed"), why
    assert (first["provider"], first["key"]) == ("mock", "dev"), why
    # Bedrock mode's start-up GET /inference-profiles comes from the AWS SDK, without the gateway key (with
    # CLAUDE_CODE_SKIP_BEDROCK_AUTH it has no credential at all): the CLI goes on whether it is listed or refused.
    refused = [line for line in lines if int(line["status"]) >= 400 and line["path"] != "/inference-profiles"]
    assert not refused, why
    assert run.elapsed < 30, why


@pytest.mark.parametrize("mode", MODES)
def test_stream_json_shows_the_streamed_events(mode: str, claude_cli: Path, serve: Serve, tmp_path: Path) -> None:
    """``--output-format stream-json --verbose --include-partial-messages``: the Messages events as they arrived
    (message_start first, text deltas that add up to the answer, message_delta with end_turn, message_stop last),
    the assistant message from the mock, and a successful result."""
    served = start(serve, tmp_path, MOCK_CONFIG)
    run = run_claude(claude_cli, PROMPT, env=mode_env(mode, served.url), args=(*STREAM_JSON, PARTIAL))
    why = report(run, seen(served, mode))
    assert run.returncode == 0, why
    events = stream_events(run)
    kinds = [e.get("type") for e in events]
    assert kinds and kinds[0] == "message_start" and kinds[-1] == "message_stop", f"{kinds}\n{why}"
    assert str(events[0]["message"]["model"]).startswith("mock:"), why
    deltas = [e["delta"] for e in events if e.get("type") == "content_block_delta"]
    text = "".join(d["text"] for d in deltas if d.get("type") == "text_delta")
    assert MOCK_ANSWER in text and sum(d.get("type") == "text_delta" for d in deltas) > 1, why
    assert {"content_block_start", "content_block_stop", "message_delta"} <= set(kinds), why
    (end,) = [e for e in events if e.get("type") == "message_delta"]
    assert end["delta"]["stop_reason"] == "end_turn" and end["usage"]["output_tokens"] > 0, why
    assistant = [e for e in run.events() if e.get("type") == "assistant"]
    assert assistant and all(str(e["message"]["model"]).startswith("mock:") for e in assistant), why
    (result,) = [e for e in run.events() if e.get("type") == "result"]
    assert result["subtype"] == "success" and not result["is_error"] and MOCK_ANSWER in result["result"], why


@pytest.mark.parametrize("mode", MODES)
def test_a_wrong_key_fails_fast(mode: str, claude_cli: Path, serve: Serve, tmp_path: Path) -> None:
    """A key the gateway does not know: 401 with ``x-should-retry: false``, so the CLI gives up at once (without
    it, it retries a 401 with back-off for minutes) — a non-zero exit within 15 s, no request retried. (In Bedrock
    mode, 2.1.332 also retries a 403 with back-off, x-should-retry or not, and then probes older models.)"""
    served = start(serve, tmp_path, MOCK_CONFIG)
    run = run_claude(claude_cli, PROMPT, env=mode_env(mode, served.url, key="sk-wrong"), timeout=20)
    lines = seen(served, mode)
    why = report(run, lines)
    assert run.returncode not in (None, 0), why
    assert run.elapsed < 15, why
    assert MOCK_ANSWER not in run.stdout, why
    assert any(int(line["status"]) == 401 for line in lines), why
    assert all(int(line["status"]) == 401 for line in lines if is_model_request(mode, str(line["path"]))), why
    # No retrying with back-off (which x-should-retry: false stops); Vertex mode's own credential refresh sends the
    # refused request again twice, at once, before it gives up.
    sent = Counter(str(line["path"]) for line in lines)
    assert max(sent.values()) <= 3, f"retried: {sent}\n{why}"
    assert "401" in run.stdout + run.stderr or "authenticat" in (run.stdout + run.stderr).lower(), why


@pytest.mark.parametrize("mode", MODES)
def test_the_gateway_records_claude_codes_session(mode: str, claude_cli: Path, serve: Serve, tmp_path: Path) -> None:
    """The session id Claude Code reports (stream-json's ``init``) is the ``x-claude-code-session-id`` it sent: the
    access line of its request has it, and the usage ledger counts the request under it."""
    ledger = f'store: {{url: "sqlite:///{tmp_path}/ledger.db", flush_interval_s: 0.05}}'
    config = f"{MOCK_CONFIG}admin: {{keys: [sk-admin]}}\n{ledger}\n"
    served = start(serve, tmp_path, config)
    run = run_claude(claude_cli, PROMPT, env=mode_env(mode, served.url), args=STREAM_JSON)
    lines = seen(served, mode)
    why = report(run, lines)
    assert run.returncode == 0, why
    (init,) = [e for e in run.events() if e.get("type") == "system" and e.get("subtype") == "init"]
    session = init["session_id"]
    answers = [line for line in lines if is_model_request(mode, str(line["path"]))]
    assert answers and all(line["session_id"] == session for line in answers), f"session {session!r}\n{why}"
    day = 86_400
    params = {
        "starting_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime()),
        "ending_at": time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(time.time() + day)),
        "group_by[]": "session_id",
        "session_ids[]": session,
    }
    rows: dict[str, int] = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the ledger writes its rows in batches (every 50 ms here)
        got = httpx.get(
            f"{served.url}/v1/organizations/usage_report/messages", params=params, headers={"x-api-key": "sk-admin"}
        )
        assert got.status_code == 200, got.text
        rows = {r["session_id"]: r["requests"] for b in got.json()["data"] for r in b["results"]}
        if rows.get(session, 0) >= len(answers):
            break
        time.sleep(0.1)
    assert rows == {session: len(answers)}, f"{rows}\n{why}"


# ----------------------------------------------------------------------------------------- the fake Claude API


@pytest.mark.parametrize("mode", MODES)
def test_claude_p_through_the_gateway_to_the_claude_api(
    mode: str, claude_cli: Path, serve: Serve, tmp_path: Path, fake: FakeClaudeAPI
) -> None:
    """``claude -p --model fake-text`` through the gateway to the fake Claude API: the fake's answer, printed whole;
    the fake got a Messages request for fake-text with the gateway's provider key (never the client's) and Claude
    Code's betas (``anthropic-beta``)."""
    served = start(serve, tmp_path, fake_config(fake))
    run = run_claude(claude_cli, PROMPT, env=mode_env(mode, served.url), args=("--model", "fake-text"))
    lines = seen(served, mode)
    upstream = [r for r in fake.requests if r.method == "POST" and r.path == "/v1/messages"]
    sent = "\n".join(f"  {r.method} {r.path} model={(r.json or {}).get('model')!r}" for r in fake.requests)
    why = f"{report(run, lines)}\n--- requests the fake got ---\n{sent or '  (none)'}"
    assert run.returncode == 0, why
    assert FAKE_ANSWER in run.stdout, why
    assert upstream, why
    first = upstream[0]
    assert isinstance(first.json, dict) and str(first.json.get("model")).endswith("fake-text"), why
    headers = {k.lower(): v for k, v in first.headers.items()}
    assert KEY not in " ".join(headers.values()), f"the client's key went upstream: {headers}\n{why}"
    assert "provider-key" in (headers.get("x-api-key", ""), headers.get("authorization", "")), f"{headers}\n{why}"
    assert "claude-code-20250219" in headers.get("anthropic-beta", ""), f"{headers}\n{why}"
    answers = [line for line in lines if is_model_request(mode, str(line["path"]))]
    assert answers and answers[0]["provider"] == "claude" and answers[0]["status"] == 200, why


# ----------------------------------------------- Messages mode to a cloud target (issue 32, item 4)

CLOUD_TARGETS = ("bedrock", "converse", "mantle", "vertex", "foundry")
FIRST_PARTY_ONLY = ("context-management-", "per-turn-control-", "mid-conversation-tool-changes-", "advanced-tool-use-")


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The strict fakes of the clouds (they refuse what the real services refuse), served for the module."""
    from tests.fakes.bedrock import FakeBedrock
    from tests.fakes.foundry import FakeFoundry
    from tests.fakes.vertex import FakeVertex

    converse_dir = Path(__file__).resolve().parents[1] / "fixtures" / "converse"
    with FakeBedrock(converse_dir=converse_dir) as bedrock, FakeVertex() as vertex, FakeFoundry() as foundry:
        creds = vertex.make_service_account(tmp_path_factory.mktemp("gcp"))
        yield {"bedrock": bedrock, "vertex": vertex, "foundry": foundry, "creds": creds}


def cloud_config(target: str, clouds: dict[str, Any]) -> str:
    bedrock, vertex, foundry = clouds["bedrock"], clouds["vertex"], clouds["foundry"]
    aws = "access_key_id: AKIDFAKEBEDROCK, secret_access_key: fake-secret"
    provider, model = {
        "bedrock": (
            f'{{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", {aws}}}',
            "us.anthropic.fake-text-v1:0",
        ),
        "converse": (
            f'{{kind: bedrock, api: converse, region: us-east-1, base_url: "{bedrock.base_url}", {aws}}}',
            "anthropic.text",
        ),
        "mantle": (
            f'{{kind: bedrock_mantle, region: us-east-1, base_url: "{bedrock.base_url}/anthropic", {aws}}}',
            "fake-text",
        ),
        "vertex": (
            f'{{kind: vertex, region: us-east5, project: {vertex.project}, credentials_file: "{clouds["creds"]}", '
            f'base_url: "{vertex.base_url}"}}',
            "fake-text",
        ),
        "foundry": (f'{{kind: foundry, base_url: "{foundry.base_url}", api_key: foundry-key}}', "fake-text"),
    }[target]
    return f"""
auth: {{keys: [{{name: dev, key: sk-dev}}]}}
providers:
  cloud: {provider}
models:
  "*": {{targets: [{{provider: cloud, model: "{model}"}}]}}
"""


@pytest.mark.parametrize("output", ["text", "stream-json"])
@pytest.mark.parametrize("target", CLOUD_TARGETS)
def test_messages_mode_to_a_cloud_target_answers_and_names_what_was_dropped(
    target: str, output: str, claude_cli: Path, serve: Serve, tmp_path: Path, clouds: dict[str, Any]
) -> None:
    """Claude Code in Messages mode (first-party betas, ``context_management``, its tools) through the gateway to
    each cloud on its strict fake: ``claude -p`` answers; the access line names what the cloud was not sent (the
    first-party-only betas), and Foundry (the first-party API) was sent them all."""
    fake = clouds["foundry" if target == "foundry" else "vertex" if target == "vertex" else "bedrock"]
    before = len(fake.requests)
    served = start(serve, tmp_path, cloud_config(target, clouds))
    args = ("--model", "fake-text", *(STREAM_JSON if output == "stream-json" else ()))
    run = run_claude(claude_cli, PROMPT, env=mode_env("messages", served.url), args=args)
    lines = seen(served, "messages")
    sent = fake.requests[before:]
    why = f"{report(run, lines)}\n--- requests the fake got ---\n" + "\n".join(
        f"  {r.method} {r.path} {r.body[:200]!r}" for r in sent
    )
    assert run.returncode == 0, why
    if output == "text":
        assert "fake" in run.stdout.lower() or run.stdout.strip(), why
    else:
        result = [e for e in run.events() if e.get("type") == "result"]
        assert result and result[-1].get("is_error") is False, why
    answers = [line for line in lines if is_model_request("messages", str(line["path"]))]
    assert answers and all(line["status"] == 200 for line in answers), why
    dropped = [d for line in answers for d in line["dropped"]]
    if target == "foundry":
        assert dropped == [], why
        assert any("context-management-" in r.headers.get("anthropic-beta", "") for r in sent), why
    else:
        assert any(d.startswith("beta:context-management-") for d in dropped), why
        for r in sent:
            text = r.body.decode("utf-8", "replace") + r.headers.get("anthropic-beta", "")
            assert not any(name in text for name in FIRST_PARTY_ONLY), why
            assert '"context_management"' not in text, why
