"""The commonest event's partial decode, compiled (gateway/wire/_views_c.c)."""

from typing import Any, Final, final

from _typeshed import structseq

@final
class ScannedViews(structseq[Any], tuple[list[Any], bytes | None, list[tuple[int, bytes | None]]]):
    """What ``scan_views`` answers: a tuple with named fields."""

    __match_args__: Final = ("views", "rest", "misses")
    @property
    def views(self) -> list[Any]: ...
    @property
    def rest(self) -> bytes | None: ...
    @property
    def misses(self) -> list[tuple[int, bytes | None]]: ...

@final
class SplitSse(structseq[Any], tuple[bytes, bytes, int]):
    """What ``split_sse`` answers: a tuple with named fields (``gateway.wire.sse.SplitSse`` in Python)."""

    __match_args__: Final = ("events", "array", "frame_count")
    @property
    def events(self) -> bytes: ...
    @property
    def array(self) -> bytes: ...
    @property
    def frame_count(self) -> int: ...

def scan_views(array: bytes, cache: dict[bytes, Any], /) -> ScannedViews | None: ...
def split_sse(block: bytes, /) -> SplitSse | None: ...
def top_level_duplicate(body: bytes, names: tuple[bytes, ...], /) -> bytes | None: ...
def names_match(events: bytes, views: list[Any], /) -> bool: ...
