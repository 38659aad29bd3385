"""The route table: a client's ``model`` → its alias → the ordered provider targets that serve it."""

from __future__ import annotations

import random
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from gateway.routing.balance import Balancer, TargetHealth
from gateway.settings import BreakerSettings, ModelRoute
from gateway.wire.errors import NotFound

if TYPE_CHECKING:
    from adapters.base import Adapter

__all__ = ["Route", "RouteTable", "Target", "is_glob"]


def is_glob(alias: str) -> bool:
    return any(c in alias for c in "*?[")


class Target:
    __slots__ = ("adapter", "health", "model")

    def __init__(self, adapter: Adapter, model: str | None, health: TargetHealth | None = None) -> None:
        self.adapter = adapter
        self.model = model  # None: the client's model name, unchanged
        self.health = health or TargetHealth()

    @property
    def provider(self) -> str:
        return self.adapter.name

    def upstream_model(self, client_model: str) -> str:
        return self.model or client_model


class Route:
    """An alias: its targets, the balancer that orders them per request, and its per-alias limits."""

    __slots__ = (
        "alias",
        "balancer",
        "description",
        "display_name",
        "max_tokens",
        "max_tokens_policy",
        "ping_interval_s",
        "strategy",
        "targets",
    )

    def __init__(
        self,
        alias: str,
        targets: tuple[Target, ...],
        display_name: str | None = None,
        *,
        strategy: str = "fallback",
        weights: tuple[float, ...] | None = None,
        ping_interval_s: float | None = None,
        max_tokens: int | None = None,
        max_tokens_policy: str = "reject",
        rng: random.Random | None = None,
        description: str | None = None,
    ) -> None:
        self.alias = alias
        self.targets = targets
        self.display_name = display_name or alias
        self.description = description
        self.strategy = strategy
        self.balancer = Balancer(strategy, [t.health for t in targets], weights, rng=rng)
        self.ping_interval_s = ping_interval_s
        self.max_tokens = max_tokens
        self.max_tokens_policy = max_tokens_policy

    def plan(self, now: float) -> list[Target]:
        """The targets to try for one request, in order (empty: none is available; see ``panic_order``)."""
        return [self.targets[i] for i in self.balancer.plan(now)]

    def panic_order(self, now: float) -> list[Target]:
        """Every target, the one available again soonest first: the order when ``plan`` is empty."""
        return [self.targets[i] for i in self.balancer.panic_order(now)]


class RouteTable:
    def __init__(
        self,
        models: Mapping[str, ModelRoute],
        adapters: Mapping[str, Adapter],
        breaker: BreakerSettings | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        breaker = breaker or BreakerSettings()
        self._exact: dict[str, Route] = {}
        self._globs: list[Route] = []
        self._cloud_ids: dict[tuple[str, str], Route] = {}  # ("bedrock" | "vertex", id) -> route
        for alias, spec in models.items():
            targets = tuple(
                Target(
                    adapters[t.provider],
                    t.model,
                    TargetHealth(breaker.failure_threshold, breaker.window_s, breaker.cooldown_s),
                )
                for t in spec.targets
            )
            route = Route(
                alias,
                targets,
                spec.display_name,
                strategy=spec.strategy,
                weights=tuple(t.weight for t in spec.targets),
                ping_interval_s=spec.ping_interval_s,
                max_tokens=spec.max_tokens,
                max_tokens_policy=spec.max_tokens_policy,
                rng=rng,
                description=spec.description,
            )
            for kind, ids in (("bedrock", spec.bedrock_ids), ("vertex", spec.vertex_ids)):
                for cloud_id in ids:
                    self._cloud_ids.setdefault((kind, cloud_id), route)
            if is_glob(alias):
                self._globs.append(route)
            else:
                self._exact[alias] = route

    def resolve(self, model: str) -> Route:
        route = self._exact.get(model)
        if route is not None:
            return route
        for route in self._globs:
            if fnmatchcase(model, route.alias):
                return route
        raise NotFound(f"model {model!r} is not served by this gateway (see GET /v1/models)")

    def by_cloud_id(self, kind: str, cloud_id: str) -> Route | None:
        """The route whose ``bedrock_ids`` (``kind`` "bedrock") or ``vertex_ids`` list ``cloud_id``."""
        return self._cloud_ids.get((kind, cloud_id))

    def aliases(self) -> list[Route]:
        """The routes with a concrete name, in config order (glob routes cannot be listed)."""
        return list(self._exact.values())

    def all_routes(self) -> list[Route]:
        """Every route, globs included (for the status endpoint and metrics)."""
        return [*self._exact.values(), *self._globs]
