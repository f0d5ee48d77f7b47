"""`rlx.cache`: the AOT cache's public face (see `rlx.build.cache` for the design).

>>> import rlx.cache
>>> "hits" in rlx.cache.stats()
True
"""

from rlx.build.cache import (
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
