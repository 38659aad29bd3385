"""Usage: a pure fold over a stream's events.

``message_start.message.usage`` sets the starting counts; each field present in a ``message_delta`` usage
*overwrites* (the counts are cumulative totals, never increments). No state, no I/O: the tally
(``gateway.observability.usage``) and the Bedrock adapter's metrics check both fold with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.wire.events import EventView, Usage, UsageView

if TYPE_CHECKING:
    from gateway.settings import LongContextPrice, Price

__all__ = ["EMPTY", "cost_of", "fold_usage", "overwrite_present", "total_tokens", "usage_of"]

EMPTY = Usage()


def usage_of(view: UsageView) -> Usage:
    return Usage(
        input_tokens=view.input_tokens,
        output_tokens=view.output_tokens,
        cache_creation_input_tokens=view.cache_creation_input_tokens,
        cache_read_input_tokens=view.cache_read_input_tokens,
    )


def overwrite_present(usage: Usage, update: UsageView) -> Usage:
    """Each field reported in ``update`` replaces the one in ``usage``; absent fields survive."""
    return Usage(
        input_tokens=usage.input_tokens if update.input_tokens is None else update.input_tokens,
        output_tokens=usage.output_tokens if update.output_tokens is None else update.output_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens
        if update.cache_creation_input_tokens is None
        else update.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens
        if update.cache_read_input_tokens is None
        else update.cache_read_input_tokens,
    )


def fold_usage(usage: Usage, view: EventView) -> Usage:
    """The usage after one more event."""
    etype = view.type
    if etype == "message_start":
        message = view.message
        return usage_of(message.usage) if message is not None and message.usage is not None else usage
    if etype == "message_delta" and view.usage is not None:
        return overwrite_present(usage, view.usage)
    return usage


def total_tokens(usage: Usage) -> int:
    """Input, output and cache tokens together (what ``tokens_per_minute`` counts)."""
    return (
        (usage.input_tokens or 0)
        + (usage.output_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


def cost_of(usage: Usage, price: Price) -> float:
    """US dollars for ``usage`` at ``price`` (per million tokens of each type); every token at the price's
    long-context tier when the input (uncached, cache reads and writes together) is over the tier's threshold."""
    uncached = usage.input_tokens or 0
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    tier = price.long_context
    rates: Price | LongContextPrice = price
    if tier is not None and uncached + read + written > tier.above_input_tokens:
        rates = tier
    return (
        uncached * rates.input
        + (usage.output_tokens or 0) * rates.output
        + read * rates.cache_read
        + written * rates.cache_creation
    ) / 1_000_000
