"""The commonest event's partial decode, compiled (gateway/_views_c.c)."""

from typing import Any

def scan_views(
    array: bytes, cache: dict[bytes, Any], /
) -> tuple[list[Any], bytes | None, list[tuple[int, bytes | None]]] | None: ...
def split_sse(block: bytes, /) -> tuple[bytes, bytes, int] | None: ...
