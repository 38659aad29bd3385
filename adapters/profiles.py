"""What each provider accepts of a Messages request (issue 32): its betas, where they go, which map onto another,
which top-level body fields and tool-definition fields it takes. A client in Messages mode (Claude Code with
``ANTHROPIC_BASE_URL``, the commonest set-up) sends betas and fields only the first party accepts; routed to Bedrock
or Vertex they were answered 400 ("invalid beta flag", "extraneous key … is not permitted"). So an adapter asks its
profile, once per request, what to keep, and drops (or maps) the rest; every drop is named, counted
(``gateway_dropped_features_total``) and put on the access line (``dropped``).

Sources (``docs/wire-formats.md`` §"What each provider accepts" holds the table):

- what Claude Code 2.1.332 sends each provider in its own mode (captured on loopback): to Bedrock ``claude-code``,
  ``effort``, ``thinking-token-count`` (header), ``interleaved-thinking``, ``tool-search-tool`` (body); to Vertex
  ``claude-code``, ``interleaved-thinking``, ``web-search``, ``tool-search-tool``, ``effort``,
  ``thinking-token-count``; neither gets ``context-management`` (nor the ``context_management`` field),
  ``per-turn-control``, ``mid-conversation-tool-changes`` or ``advanced-tool-use`` (the clouds get
  ``tool-search-tool`` instead);
- AWS, "Anthropic Claude Messages API — Request and Response" (the body's fields and ``anthropic_beta``, e.g.
  ``computer-use``, ``token-efficient-tools``, ``output-128k``, ``context-1m``), and Google's Claude on Vertex AI
  pages (betas in the header);
- Claude Code's gateway contract: pass unknown body fields and betas through to the first party; Bedrock, Mantle
  and Vertex reject the top-level ``tags`` field and its beta ``request-tags-*``; auto mode's ``safeguards`` field.

Betas are matched by family — the name without its date suffix — so ``effort-2025-11-24`` and a later
``effort-2026-…`` are the same feature. The first party (the Claude API, Claude Platform on AWS) and Foundry pass
everything unchanged. An operator overrides a profile per provider (``betas: {allow, drop}``, ``drop_fields``) for
the day a provider ships a beta before the gateway knows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from gateway.wire.errors import InvalidRequest
from gateway.wire.request import ProxyRequest

__all__ = [
    "FIRST_PARTY",
    "PROFILES",
    "Filtered",
    "Profile",
    "beta_family",
    "filter_request",
    "metric_feature",
    "profile_for",
]

_DATE = re.compile(r"-\d{4}-?\d{2}-?\d{2}$")  # 2025-11-24, or 20250219 (claude-code-20250219)


def beta_family(name: str) -> str:
    """A beta's feature: its name without a trailing ``-YYYY-MM-DD`` (or ``-YYYYMMDD``)."""
    return _DATE.sub("", name)


_CACHE_MAX = 256  # distinct beta headers remembered per profile (a client sends the same one request after request)

# The clouds' own vocabulary: every top-level field AWS documents for InvokeModel, and what Claude Code sends the
# clouds in their modes (output_config); plus ``model``/``stream``, which each adapter adds or removes itself.
_CLOUD_FIELDS = frozenset(
    {
        "anthropic_version",
        "anthropic_beta",
        "model",
        "stream",
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
_CLOUD_TOOL_DROPS = frozenset({"eager_input_streaming"})  # fine-grained tool streaming's flag (claude-code #33229)
_COMMON_CLOUD_BETAS = frozenset(
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
        "fine-grained-tool-streaming",
    }
)
_CLOUD_MAP = {"advanced-tool-use": "tool-search-tool-2025-10-19"}  # what the CLI sends the clouds instead


class Profile:
    """One upstream kind's acceptance. ``keep_unknown`` (the first party): every beta goes but those of
    ``drop_betas``. Otherwise the ``betas`` families are kept, ``mapped`` families become the named beta and any
    other is dropped. ``fields`` (all when None) are the top-level body fields kept, less ``drop_fields``;
    ``tool_drops`` are removed from tool definitions. ``passthrough``: nothing to look at."""

    __slots__ = (
        "_cache",
        "betas",
        "drop_betas",
        "drop_fields",
        "fields",
        "keep_unknown",
        "mapped",
        "name",
        "passthrough",
        "tool_drops",
    )

    def __init__(
        self,
        name: str,
        *,
        keep_unknown: bool = False,
        betas: Iterable[str] = (),
        mapped: Mapping[str, str] | None = None,
        fields: Iterable[str] | None = None,
        tool_drops: Iterable[str] = (),
        drop_betas: Iterable[str] = (),
        drop_fields: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.keep_unknown = keep_unknown
        self.betas = frozenset(betas)
        self.mapped = dict(mapped or {})
        self.fields = None if fields is None else frozenset(fields)
        self.tool_drops = frozenset(tool_drops)
        self.drop_betas = frozenset(beta_family(b) for b in drop_betas)
        self.drop_fields = frozenset(drop_fields)
        self.passthrough = (
            keep_unknown
            and not self.drop_betas
            and self.fields is None
            and not self.drop_fields
            and not self.tool_drops
        )
        self._cache: dict[str, tuple[list[str], tuple[str, ...]]] = {}

    def overridden(
        self, *, allow: Sequence[str] = (), drop: Sequence[str] = (), drop_fields: Sequence[str] = ()
    ) -> Profile:
        """This profile with an operator's changes: ``allow`` (beta names or families) kept, ``drop`` dropped
        (on the first party too), ``drop_fields`` removed from the body."""
        if not (allow or drop or drop_fields):
            return self
        allowed = {beta_family(b) for b in allow}
        dropped = {beta_family(b) for b in drop}
        return Profile(
            self.name,
            keep_unknown=self.keep_unknown,
            betas=(self.betas | allowed) - dropped,
            mapped={k: v for k, v in self.mapped.items() if k not in allowed},
            fields=self.fields,
            tool_drops=self.tool_drops,
            drop_betas=self.drop_betas | dropped,
            drop_fields=self.drop_fields | set(drop_fields),
        )

    def apply_betas(self, header: str | None) -> tuple[list[str], tuple[str, ...]]:
        """The betas of an ``anthropic-beta`` header this provider is sent (mapped ones renamed, each once), and the
        ``beta:<name>`` of those it is not; one dict lookup for a header seen before."""
        if not header:
            return [], ()
        cached = self._cache.get(header)
        if cached is not None:
            return cached
        kept: list[str] = []
        dropped: list[str] = []
        for name in (b.strip() for b in header.split(",")):
            if not name:
                continue
            family = beta_family(name)
            if family in self.drop_betas:
                dropped.append(f"beta:{name}")
                continue
            if family in self.betas or self.keep_unknown:
                out = name
            elif family in self.mapped:
                out = self.mapped[family]
            else:
                dropped.append(f"beta:{name}")
                continue
            if out not in kept:
                kept.append(out)
        result = (kept, tuple(dropped))
        if len(self._cache) < _CACHE_MAX:
            self._cache[header] = result
        return result

    def field_drops(self, names: Iterable[str]) -> list[str]:
        """The top-level fields of a body (its keys) this provider does not take."""
        if self.fields is None:
            return [n for n in names if n in self.drop_fields] if self.drop_fields else []
        return [n for n in names if n not in self.fields or n in self.drop_fields]

    def tools_without(self, tools: Any) -> tuple[Any, list[str]]:
        """``tools`` (the decoded list) with the fields this provider refuses removed from each definition, and the
        names removed (each once)."""
        if not self.tool_drops or not isinstance(tools, list):
            return tools, []
        removed: list[str] = []
        out = []
        for tool in tools:
            if isinstance(tool, dict) and self.tool_drops.intersection(tool):
                for name in sorted(self.tool_drops.intersection(tool)):
                    if name not in removed:
                        removed.append(name)
                tool = {k: v for k, v in tool.items() if k not in self.tool_drops}
            out.append(tool)
        return out, removed


def _cloud(name: str, *extra_betas: str, tool_drops: Iterable[str] = ()) -> Profile:
    return Profile(
        name,
        betas=_COMMON_CLOUD_BETAS | set(extra_betas),
        mapped=_CLOUD_MAP,
        fields=_CLOUD_FIELDS,
        tool_drops=_CLOUD_TOOL_DROPS | set(tool_drops),
    )


FIRST_PARTY = Profile("anthropic", keep_unknown=True)
PROFILES: dict[str, Profile] = {
    "anthropic": FIRST_PARTY,
    "claude_aws": Profile("claude_aws", keep_unknown=True),  # the Claude API, hosted on AWS
    "foundry": Profile("foundry", keep_unknown=True),  # the first-party API on Azure, as the protocol asks
    "bedrock": _cloud("bedrock", "dev-full-thinking", "tool-examples"),
    # Converse's toolSpec has no place for defer_loading (tool search's flag): the tool is sent without it
    "bedrock_converse": _cloud("bedrock_converse", "dev-full-thinking", "tool-examples", tool_drops={"defer_loading"}),
    "bedrock_mantle": _cloud("bedrock_mantle", "dev-full-thinking", "tool-examples"),
    "vertex": _cloud("vertex", "web-search"),
}


def profile_for(
    kind: str, *, allow: Sequence[str] = (), drop: Sequence[str] = (), drop_fields: Sequence[str] = ()
) -> Profile:
    """The profile of a provider ``kind`` (its config's), with the operator's overrides."""
    base = PROFILES.get(kind, FIRST_PARTY)
    return base.overridden(allow=allow, drop=drop, drop_fields=drop_fields)


class Filtered(NamedTuple):
    """One request as a provider is to be sent it: the ``anthropic-beta`` header (None: none) and its names, the
    body fields to set and to drop, and what was left out (the access line's ``dropped``)."""

    header: str | None
    betas: list[str]
    set: dict[str, Any]
    drop: list[str]
    dropped: tuple[str, ...]


_SAFEGUARDS = "safeguards"


def filter_request(profile: Profile, request: ProxyRequest) -> Filtered:
    """What ``profile`` keeps of ``request`` (also stored on ``request.dropped``). ``safeguards`` (auto mode) is
    never dropped silently: a provider that does not take it is a 400 naming it, and Claude Code retries without."""
    if profile.passthrough:
        request.dropped = ()
        return Filtered(request.anthropic_beta, request.betas(), {}, [], ())
    betas, dropped = profile.apply_betas(request.anthropic_beta)
    fields = request.fields()
    drop = profile.field_drops(fields)
    if _SAFEGUARDS in drop:
        raise InvalidRequest(
            f"safeguards: not supported by this provider ({profile.name}); send the request without safeguards"
        )
    changes: dict[str, Any] = {}
    tool_dropped: list[str] = []
    tools = fields.get("tools")
    if profile.tool_drops and tools is not None and _mentions(tools, profile.tool_drops):
        cleaned, tool_dropped = profile.tools_without(msgspec.json.decode(tools))
        if tool_dropped:
            changes["tools"] = cleaned
    merged: tuple[str, ...] = ()
    messages = fields.get("messages")
    # a system turn comes with the first party's own betas (Claude Code in Messages mode sends both): only then are
    # the turns' roles read (a C decode that skips their content), so a cloud's own client pays nothing for it
    if profile.fields is not None and messages is not None and dropped and _has_system_turn(messages):
        changes["messages"] = _without_system_turns(msgspec.json.decode(messages))
        merged = ("message:system_role",)
    out = (
        *dropped,
        *(f"field:{name}" for name in drop),
        *(f"tool_field:{name}" for name in tool_dropped),
        *merged,
    )
    request.dropped = out
    return Filtered(",".join(betas) if betas else None, betas, changes, drop, out)


def _mentions(raw: msgspec.Raw, names: frozenset[str]) -> bool:
    """Whether the raw JSON of ``tools`` holds one of ``names`` (a substring search of the tools alone, before any
    decode of them)."""
    text = bytes(raw)
    return any(name.encode() in text for name in names)


class _Turn(msgspec.Struct):
    role: str = ""


_TURNS = msgspec.json.Decoder(list[_Turn])


def _has_system_turn(messages: msgspec.Raw) -> bool:
    """Whether a turn of ``messages`` has ``role: system`` (its content skipped, not decoded)."""
    try:
        return any(turn.role == "system" for turn in _TURNS.decode(messages))
    except msgspec.DecodeError:
        return False


def _reminder(content: Any) -> list[Any]:
    """A system turn's content as user text blocks, each wrapped as Claude Code wraps the system context it puts
    into user turns (``<system-reminder>``); other blocks (cache_control included) kept as they are."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    out = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text":
            block = {**block, "text": f"<system-reminder>\n{block.get('text', '')}\n</system-reminder>"}
        out.append(block)
    return out


def _user_blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def _without_system_turns(messages: Any) -> Any:
    """``messages`` with each ``role: system`` turn (the first party's mid-conversation system messages, which the
    clouds refuse) folded into the next user turn — or the previous one when none follows — as reminder blocks."""
    if not isinstance(messages, list):
        return messages
    out: list[Any] = []
    pending: list[Any] = []  # reminders waiting for the next user turn
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "system":
            pending.extend(_reminder(message.get("content")))
            continue
        if pending and isinstance(message, dict) and message.get("role") == "user":
            message = {**message, "content": [*pending, *_user_blocks(message.get("content"))]}
            pending = []
        out.append(message)
    if pending:
        last = next((i for i in range(len(out) - 1, -1, -1) if out[i].get("role") == "user"), None)
        if last is None or last != len(out) - 1:
            out.append({"role": "user", "content": pending})
        else:
            out[last] = {**out[last], "content": [*_user_blocks(out[last].get("content")), *pending]}
    return out


_KNOWN_FAMILIES = frozenset(
    {
        *_COMMON_CLOUD_BETAS,
        *_CLOUD_MAP,
        "web-search",
        "dev-full-thinking",
        "tool-examples",
        "context-management",
        "per-turn-control",
        "mid-conversation-tool-changes",
        "request-tags",
        "prompt-caching-scope",
        "prompt-caching",
        "files-api",
        "code-execution",
        "mcp-client",
        "skills",
        "compact",
    }
)
_KNOWN_FIELDS = frozenset({*_CLOUD_FIELDS, "context_management", "tags", "container", "mcp_servers", "service_tier"})


def metric_feature(feature: str) -> str:
    """A dropped feature as a metric label: a beta by its family, a field by its name, when the gateway knows them;
    ``beta:other`` / ``field:other`` for a client's own names (a label must not take whatever a client sends)."""
    kind, _, name = feature.partition(":")
    if kind == "beta":
        family = beta_family(name)
        return f"beta:{family}" if family in _KNOWN_FAMILIES else "beta:other"
    if feature == "message:system_role":
        return feature
    if kind in ("field", "tool_field"):
        return feature if name in _KNOWN_FIELDS or name in _CLOUD_TOOL_DROPS else f"{kind}:other"
    return "other"
