"""Random damage for property tests: a few single-byte inserts, deletions and replacements."""

from __future__ import annotations

from hypothesis import strategies as st


def byte_edits(alphabet: bytes, *, reach: int, most: int = 3) -> st.SearchStrategy[list[tuple[int, str, int]]]:
    """Up to ``most`` edits, each (position, how, byte); positions up to ``reach`` wrap around the data."""
    return st.lists(
        st.tuples(st.integers(0, reach), st.sampled_from(["insert", "delete", "replace"]), st.sampled_from(alphabet)),
        max_size=most,
    )


def apply_edits(data: bytes, edits: list[tuple[int, str, int]]) -> bytes:
    out = bytearray(data)
    for at, how, byte in edits:
        at %= len(out) + 1
        if how == "insert":
            out[at:at] = bytes([byte])
        elif at < len(out):
            out[at : at + 1] = b"" if how == "delete" else bytes([byte])
    return bytes(out)
