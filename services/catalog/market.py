"""A price list held for planning: the offers, and columns over them worked out once per price list.

Every plan over a catalog reads the same things of each offer (its node shape, its prices, its provider), and a
served catalog is cached per version (services.catalog.service.catalog_offers) and planned over many times. A
:class:`Market` is that cached tuple of offers; the columns a plan reads of all of them are kept with it on first
use, so a plan over thousands of offers reads them as arrays instead of walking the offers again; so are tables a
caller works out of the offers alone (``Market.derived``: the planner's grouping of them by card and node shape).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import numpy as np

from services.catalog.offers import Offer

T = TypeVar("T")
# Tables kept per price list by ``Market.derived`` (a caller keeps one or two: the planner its offer grouping per
# GPU spec table); beyond this many keys the oldest is dropped.
DERIVED_KEYS = 4
# (per offer, the position of its values among the distinct ones; the distinct values in order of first offer)
Codes = tuple[np.ndarray, tuple[tuple[object, ...], ...]]


class Market(tuple[Offer, ...]):
    """The offers of a price list (a tuple: indexed, iterated and compared as one) with their columns, each read
    on first use and kept (immutable offers: a column never goes stale). Threads may race to read a column
    first; both read the same values, and either result is kept."""

    def __init__(self, offers: Iterable[Offer] = ()) -> None:
        super().__init__()
        self._codes: dict[tuple[str, ...], Codes] = {}
        self._floats: dict[str, np.ndarray] = {}
        self._derived: dict[Hashable, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # The columns travel with a pickled Market; what callers derived is worked out again where it lands.
        return {**self.__dict__, "_derived": {}}

    def codes(self, fields: tuple[str, ...]) -> Codes:
        """Per offer, which distinct combination of ``fields`` it has (its position in the list returned beside,
        where combinations come in order of their first offer)."""
        found = self._codes.get(fields)
        if found is None:
            distinct: dict[tuple[object, ...], int] = {}
            values = map(_getter(fields), self)
            ids = np.fromiter((distinct.setdefault(v, len(distinct)) for v in values), dtype=np.int64, count=len(self))
            found = self._codes[fields] = (ids, tuple(distinct))  # kept and shared: immutable
        return found

    def floats(self, names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The named numeric fields of every offer as float arrays (None is NaN)."""
        missing = tuple(name for name in names if name not in self._floats)
        if missing:
            dtype = np.dtype([(name, float) for name in missing])
            table = np.fromiter(map(_getter(missing), self), dtype=dtype, count=len(self))
            for name in missing:
                self._floats[name] = table[name]
        return {name: self._floats[name] for name in names}

    def derived(self, key: Hashable, compute: Callable[[], T]) -> T:
        """What a caller works out of these offers alone, no request in it (``key``: what else it reads), computed
        on first use and kept like the columns; the caller keeps it immutable."""
        found = self._derived.get(key)
        if found is None:
            found = compute()
            kept = list(self._derived)  # one read: other threads may drop or add keys meanwhile
            for stale in kept[: max(0, len(kept) - DERIVED_KEYS + 1)]:  # the oldest first
                self._derived.pop(stale, None)
            self._derived[key] = found
        return found


def _getter(fields: tuple[str, ...]) -> Callable[[Offer], tuple[Any, ...]]:
    """The named fields of an offer as a tuple (``attrgetter`` gives one field bare)."""
    if len(fields) == 1:
        name = fields[0]
        return lambda offer: (getattr(offer, name),)
    return operator.attrgetter(*fields)


def as_market(offers: Iterable[Offer]) -> Market:
    """``offers`` as a Market (itself where it is one already, keeping the columns read so far)."""
    return offers if isinstance(offers, Market) else Market(offers)
