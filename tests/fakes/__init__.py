"""Fakes of upstream services for end-to-end tests.

``from tests.fakes import FakeClaudeAPI`` works; the import is lazy so that
``python -m tests.fakes.claude_api`` does not import the module twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .claude_api import FakeClaudeAPI, RecordedRequest

__all__ = ["FakeClaudeAPI", "RecordedRequest"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import claude_api

        return getattr(claude_api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
