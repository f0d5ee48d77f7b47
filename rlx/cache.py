"""`rlx.cache`: the AOT cache's public face (see `rlx.toolchain.cache` for the design).

>>> import rlx.cache
>>> "hits" in rlx.cache.stats()
True
"""

from rlx.toolchain.cache import (
    AotCache,
    CacheEntry,
    CacheWarning,
    EntryInfo,
    Explanation,
    cache_key,
    explain,
    stats,
)

__all__ = ["AotCache", "CacheEntry", "CacheWarning", "EntryInfo", "Explanation", "cache_key", "explain", "stats"]
