"""The prices a request's cost is counted with: the config's ``pricing`` first, then the Claude list prices shipped
here (``builtin_pricing``, on by default), so a budget never counts a Claude model as free because the operator's
table missed its name (issue 33: Claude Code sent ``claude-opus-5-5`` through a ``claude-*`` glob, and the budget
never moved).

The shipped table is keyed by the model's **base name** (``claude-opus-4-6``), which ``base_name`` finds in each
provider's spelling of it: the Claude API's and Foundry's ids and their dated snapshots
(``claude-sonnet-4-5-20250929``), Bedrock's (``anthropic.claude-sonnet-4-5-20250929-v1:0``, with a ``global.``,
``us.``, ``eu.``… inference-profile prefix, or an inference profile's ARN) and Vertex's
(``claude-sonnet-4-5@20250929``). A base name is matched exactly, never as a prefix, so ``claude-fable-5-1`` is
never priced as ``claude-fable-5``; a name it does not know has no price (a budgeted request for it is refused,
``gateway.governance.limits.check_priced``).

Sources (US dollars per million tokens, read 2026-12-02): platform.claude.com's pricing page and each model's
overview (input, 5-minute cache write = 1.25 times input, cache read, output; Haiku 5.5's and Sonnet 4.5's and 4's
long-context tiers); AWS's "global cross-Region inference" page and the same pricing page for Bedrock: from Sonnet
4.5 and Haiku 4.5 on, a geographic or in-Region endpoint costs 10 % more than a ``global.`` profile. Vertex's regional
endpoints carry the same premium, but the region is in the URL, not the model id: price them with a ``pricing``
entry if you use one. 1-hour cache writes (2 times input) are not told apart from 5-minute ones by the usage the API
reports in ``cache_creation_input_tokens``; they are counted at the 5-minute rate.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

import msgspec

from gateway.settings import LongContextPrice, Price

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["BUILTIN_PRICES", "REGIONAL_PREMIUM", "Prices", "base_name", "builtin_price"]

REGIONAL_PREMIUM = 1.10  # Bedrock geographic and in-Region endpoints over global ones, for the models marked below


def _p(
    input_: float, write: float, read: float, output: float, long: tuple[int, float, float, float, float] | None = None
) -> Price:
    tier = None
    if long is not None:
        above, l_in, l_write, l_read, l_out = long
        tier = LongContextPrice(
            above_input_tokens=above, input=l_in, cache_creation=l_write, cache_read=l_read, output=l_out
        )
    return Price(input=input_, cache_creation=write, cache_read=read, output=output, long_context=tier)


# base name -> (price, whether Bedrock's regional premium applies)
BUILTIN_PRICES: dict[str, tuple[Price, bool]] = {
    # Fable and Mythos share their versions' specifications and prices
    **{f"claude-{family}-5-2": (_p(8, 10, 0.20, 40), True) for family in ("fable", "mythos")},
    **{f"claude-{family}-5-1": (_p(10, 12.50, 0.25, 50), True) for family in ("fable", "mythos")},
    **{f"claude-{family}-5": (_p(10, 12.50, 1.00, 50), True) for family in ("fable", "mythos")},
    "claude-opus-5-5": (_p(4, 5, 0.20, 20), True),
    "claude-opus-5": (_p(5, 6.25, 0.50, 25), True),
    **{f"claude-opus-4-{minor}": (_p(5, 6.25, 0.50, 25), True) for minor in (8, 7, 6, 5)},
    "claude-opus-4-1": (_p(15, 18.75, 1.50, 75), False),
    "claude-opus-4": (_p(15, 18.75, 1.50, 75), False),
    "claude-3-opus": (_p(15, 18.75, 1.50, 75), False),
    "claude-sonnet-5-5": (_p(2, 2.50, 0.10, 10), True),
    "claude-sonnet-5": (_p(2, 2.50, 0.20, 10), True),
    "claude-sonnet-4-6": (_p(3, 3.75, 0.30, 15), True),
    "claude-sonnet-4-5": (_p(3, 3.75, 0.30, 15, (200_000, 6, 7.50, 0.60, 22.50)), True),
    "claude-sonnet-4": (_p(3, 3.75, 0.30, 15, (200_000, 6, 7.50, 0.60, 22.50)), False),
    "claude-3-7-sonnet": (_p(3, 3.75, 0.30, 15), False),
    "claude-haiku-5-5": (_p(0.10, 0.125, 0.01, 0.50, (100_000, 0.50, 0.625, 0.05, 2.50)), True),
    "claude-haiku-4-5": (_p(1, 1.25, 0.10, 5), True),
    "claude-3-5-haiku": (_p(0.80, 1, 0.08, 4), False),
    "claude-3-haiku": (_p(0.25, 0.30, 0.03, 1.25), False),
}

# Bedrock: an inference profile's geography ("global", "us", "eu", "apac", "jp", "au", "ca", "us-gov"…) then the
# provider; the model version suffix (-v1:0, -v1). Vertex: @date (or @latest). The Claude API: a dated snapshot.
_BEDROCK = re.compile(r"^(?:(?P<geo>[a-z]{2,6}(?:-[a-z]{2,4})?)\.)?anthropic\.(?P<rest>.+?)(?:-v\d+(?::\d+)?)?$")
_DATED = re.compile(r"(?:@(?:\d{8}|latest)|-\d{8}|-latest)$")
_ALIASES = {"claude-opus-4-0": "claude-opus-4", "claude-sonnet-4-0": "claude-sonnet-4"}


def base_name(model: str) -> tuple[str, bool]:
    """The model's base name in the shipped table's spelling, and whether it was asked of a Bedrock endpoint that is
    not global (a geographic profile, or the model id of one Region)."""
    name = model.rsplit("/", 1)[-1] if model.startswith("arn:") else model  # an inference profile's ARN
    regional = False
    bedrock = _BEDROCK.match(name)
    if bedrock is not None:
        name = bedrock.group("rest")
        regional = bedrock.group("geo") != "global"
    name = _DATED.sub("", name)
    return _ALIASES.get(name, name), regional


def builtin_price(model: str) -> Price | None:
    """The shipped list price of ``model`` (in any provider's spelling), or None for a name it does not know."""
    name, regional = base_name(model)
    entry = BUILTIN_PRICES.get(name)
    if entry is None:
        return None
    price, premium = entry
    return _scaled(price, REGIONAL_PREMIUM) if regional and premium else price


_RATES = ("input", "output", "cache_read", "cache_creation")


def _scaled(price: Price, factor: float) -> Price:
    tier = price.long_context
    if tier is not None:
        tier = msgspec.structs.replace(tier, **{rate: getattr(tier, rate) * factor for rate in _RATES})
    return msgspec.structs.replace(price, long_context=tier, **{rate: getattr(price, rate) * factor for rate in _RATES})


class Prices:
    """The price of an upstream model id: the first of the config's ``pricing`` globs (in file order) it matches, else
    the shipped table's (unless ``builtin_pricing: false``), else None. Answers are remembered per model name (at most
    ``MEMO`` names: a client can send any name through a glob route)."""

    MEMO = 4096

    def __init__(self, pricing: Mapping[str, Price] | None = None, *, builtin: bool = True) -> None:
        self.table = list((pricing or {}).items())
        self.builtin = builtin
        self._memo: dict[str, Price | None] = {}

    def __bool__(self) -> bool:
        """Whether any model has a price (else the tally skips the look-up)."""
        return bool(self.table) or self.builtin

    def price_of(self, model: str) -> Price | None:
        try:
            return self._memo[model]
        except KeyError:
            pass
        price = next((p for pattern, p in self.table if fnmatchcase(model, pattern)), None)
        if price is None and self.builtin:
            price = builtin_price(model)
        if len(self._memo) < self.MEMO:
            self._memo[model] = price
        return price

    def covers(self, pattern: str) -> bool:
        """Whether every name ``pattern`` (a model glob, or a plain name) can stand for has a price: a plain name
        priced, or a config glob at least as wide (the shipped table prices named models only, so a glob that is not
        itself the config's is not covered)."""
        if not any(ch in pattern for ch in "*?["):
            return self.price_of(pattern) is not None
        return any(fnmatchcase(pattern, glob) for glob, _ in self.table)
