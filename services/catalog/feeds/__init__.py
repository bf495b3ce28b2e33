"""Live price feeds: one module per provider with a public offers API.

Each module has a pure ``parse_*`` function (the provider's JSON in, price-list rows out, tested on
recorded and generated responses) and a ``fetch`` function that calls the provider. ``refresh`` stores
what a fetch returned, or records why it failed and keeps the last good prices.
"""

from __future__ import annotations

from services.core.settings import FEED_PROVIDERS as PROVIDERS

__all__ = ["PROVIDERS"]
