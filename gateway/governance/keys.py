"""Client keys and what each may use: the keys a config declares (and their teams' limits), authentication of a
request's key header, the admin check, and authorisation of a key for a route's model."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from gateway.settings import ApiKey, LimitSettings, TeamSettings
from gateway.wire.errors import AuthenticationError, InvalidRequest, PermissionDenied

if TYPE_CHECKING:
    from gateway.routing.table import Route

__all__ = [
    "ClientKey",
    "authenticate",
    "authorize",
    "build_keys",
    "digest_of",
    "in_policy",
    "is_admin",
    "key_candidates",
    "key_headers",
    "may_use",
]

_CLIENT_KEY_HEADERS = ("x-api-key", "authorization")


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


@dataclass(frozen=True, slots=True)
class ClientKey:
    """An inbound API key: its name (a label, safe to log), the key itself or only its SHA-256 digest (never
    logged, never in a repr), the alias patterns it may use (``None``: every alias), and the team and user its
    requests are attributed to. ``id``: what it is known by — its limits' scope, its ledger rows, the reports'
    ``api_key_id``; an issued key's ``apikey_…`` (``gateway.governance.identity``), else (a config key, a JWT's
    principal) its name."""

    name: str
    key: bytes = field(default=b"", repr=False)
    models: tuple[str, ...] | None = None
    team: str = ""
    user: str = ""
    digest: bytes = field(default=b"", repr=False, compare=False)
    limits: LimitSettings | None = field(default=None, compare=False)
    expires: float | None = field(default=None, compare=False)  # epoch seconds (a key issued with an expiry)
    id: str = ""  # "": the name
    # a signed-in principal (Claude Code's /login, gateway.governance.signin): its session's id and the IdP's
    # groups; "" and () for every key
    session: str = ""
    groups: tuple[str, ...] = field(default=(), compare=False)
    email: str = ""
    # a managed policy's `availableModels` (Claude Code's names: a model id, a glob, or a family: opus, sonnet,
    # haiku); None: no such list. A model outside it is a 400 naming it.
    policy_models: tuple[str, ...] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", _digest(self.key))
        if not self.id:
            object.__setattr__(self, "id", self.name)

    def allows(self, alias: str, model: str | None = None) -> bool:
        """Whether a pattern (``fnmatch`` glob, case-sensitive) matches ``alias`` or, when given, ``model``."""
        if self.models is None:
            return True
        return any(fnmatchcase(alias, p) or (model is not None and fnmatchcase(model, p)) for p in self.models)


def build_keys(entries: Iterable[str | ApiKey], teams: Mapping[str, TeamSettings] | None = None) -> list[ClientKey]:
    """The configured ``auth.keys``: a plain string is a key for every alias, named ``key-<position>`` (1-based,
    counting every entry); empty strings (an unset ``${VAR:-}``) are skipped. When two entries hold the same
    key, the first one is the one that matches."""
    keys: list[ClientKey] = []
    for position, entry in enumerate(entries, start=1):
        if isinstance(entry, str):
            if entry:
                keys.append(ClientKey(name=f"key-{position}", key=entry.encode()))
        else:
            team, user = entry.team or "", entry.user or ""
            allowed = entry.models
            if allowed is None and teams and team in teams:
                allowed = teams[team].models  # the team's aliases, unless the key names its own
            models = None if allowed is None else tuple(allowed)
            limits = entry.limits
            if entry.key_sha256 is not None:
                digest = bytes.fromhex(entry.key_sha256)
                key_entry = ClientKey(
                    name=entry.name, models=models, team=team, user=user, digest=digest, limits=limits
                )
                keys.append(key_entry)
            else:
                key = (entry.key or "").encode()
                keys.append(ClientKey(name=entry.name, key=key, models=models, team=team, user=user, limits=limits))
    return keys


def key_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The key headers the client sent (forwarded upstream only where a provider asks for that)."""
    return {name: headers[name] for name in _CLIENT_KEY_HEADERS if name in headers}


def key_candidates(headers: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The key headers the client sent and the keys in them: ``x-api-key``, then ``Authorization: Bearer``;
    ``AuthenticationError`` when there is none."""
    sent = key_headers(headers)
    candidates = [sent.get("x-api-key", "")]
    auth = sent.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        candidates.append(auth[7:].strip())
    candidates = [c for c in candidates if c]
    if not candidates:
        raise AuthenticationError("missing API key: send it as x-api-key or Authorization: Bearer")
    return sent, candidates


def digest_of(candidate: str) -> bytes:
    return _digest(candidate.encode())


def authenticate(keys: Sequence[ClientKey], headers: Mapping[str, str]) -> tuple[dict[str, str], ClientKey | None]:
    """Check the client's key (``x-api-key`` or ``Authorization: Bearer``) against ``keys`` (none: open): the
    operator's keys (``admin.keys``), few. (Client keys go through ``gateway.governance.identity``, by digest.)

    Returns the key headers the client sent and the matching key (``None`` when there are no keys). Every
    candidate is compared with every key, each in constant time over SHA-256 digests (so neither the position of
    a match nor a key's length shows in the timing). Error messages never contain what the client sent."""
    if not keys:
        return key_headers(headers), None
    sent, candidates = key_candidates(headers)
    matched: ClientKey | None = None
    for candidate in map(digest_of, candidates):
        for key in keys:  # no early exit: every comparison runs
            if hmac.compare_digest(key.digest, candidate) and matched is None:
                matched = key
    if matched is None:
        raise AuthenticationError("invalid API key")
    return sent, matched


def is_admin(admin_keys: Sequence[ClientKey], headers: Mapping[str, str]) -> bool:
    """Whether the request carries one of ``admin_keys`` (compared like client keys, in constant time)."""
    if not admin_keys:
        return False
    try:
        authenticate(admin_keys, headers)
    except AuthenticationError:
        return False
    return True


def _client_model(route: Route, model: str) -> str | None:
    """The client's model name when every target forwards it unchanged (a glob route without ``model``)."""
    return model if all(target.model is None for target in route.targets) else None


def in_policy(key: ClientKey, route: Route, model: str) -> bool:
    """Whether a managed policy's ``availableModels`` admits ``model`` (the client's name) or the route's alias:
    an entry equal to it or a glob matching it, or a family name (``opus``, ``sonnet``, ``haiku``, as Claude Code's
    model picker names them) that the name contains as a word (``claude-sonnet-4-6``)."""
    allowed = key.policy_models
    if allowed is None:
        return True
    for name in (model, route.alias):
        words = name.lower().replace("@", "-").replace(".", "-").split("-")
        for entry in allowed:
            if fnmatchcase(name, entry) or entry.lower() in words:
                return True
    return False


def may_use(key: ClientKey | None, route: Route, model: str) -> bool:
    """Whether ``key`` may use ``route``, which ``model`` (the client's name) resolved to.

    A pattern of the key's ``models`` must match the route's alias (its config name; for a glob route, the
    glob itself, e.g. ``claude-*``) or the name the client sent, the latter only when that name is what the
    provider receives (every target of the route has no ``model`` of its own). So ``claude-haiku-*`` admits
    ``claude-haiku-4-5`` through a forwarding ``claude-*`` route, but a route that always sends one fixed
    model is granted by its alias alone."""
    if key is None:
        return True
    return key.allows(route.alias, _client_model(route, model)) and (
        key.policy_models is None or in_policy(key, route, model)
    )


def authorize(key: ClientKey | None, route: Route, model: str) -> None:
    """``PermissionDenied`` (403 ``permission_error``) unless the key's models admit the route; for a signed-in
    user outside the managed policy's ``availableModels``, ``InvalidRequest`` (400, naming the model: Claude
    Code shows it and the user picks another)."""
    if key is None:
        return
    if not key.allows(route.alias, _client_model(route, model)):
        raise PermissionDenied(f"API key {key.name!r} may not use model {model!r}")
    if key.policy_models is not None and not in_policy(key, route, model):
        raise InvalidRequest(
            f"model {model!r} is not available to you: your organization allows {', '.join(key.policy_models)}"
        )
