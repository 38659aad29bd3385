"""The route table: a client's ``model`` → its alias → the ordered provider targets that serve it."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from gateway.errors import NotFound
from gateway.settings import ModelRoute

if TYPE_CHECKING:
    from adapters.base import Adapter

__all__ = ["Route", "RouteTable", "Target", "is_glob"]


def is_glob(alias: str) -> bool:
    return any(c in alias for c in "*?[")


class Target:
    __slots__ = ("adapter", "model")

    def __init__(self, adapter: Adapter, model: str | None) -> None:
        self.adapter = adapter
        self.model = model  # None: the client's model name, unchanged

    @property
    def provider(self) -> str:
        return self.adapter.name

    def upstream_model(self, client_model: str) -> str:
        return self.model or client_model


class Route:
    __slots__ = ("alias", "display_name", "targets")

    def __init__(self, alias: str, targets: tuple[Target, ...], display_name: str | None = None) -> None:
        self.alias = alias
        self.targets = targets
        self.display_name = display_name or alias


class RouteTable:
    def __init__(self, models: Mapping[str, ModelRoute], adapters: Mapping[str, Adapter]) -> None:
        self._exact: dict[str, Route] = {}
        self._globs: list[Route] = []
        for alias, spec in models.items():
            route = Route(
                alias,
                tuple(Target(adapters[t.provider], t.model) for t in spec.targets),
                spec.display_name,
            )
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

    def aliases(self) -> list[Route]:
        """The routes with a concrete name, in config order (glob routes cannot be listed)."""
        return list(self._exact.values())
