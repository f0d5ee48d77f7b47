"""`rlx.cache`: the AOT cache's public face (see `rlx.toolchain.cache` for the design).

>>> import rlx.cache
>>> "hits" in rlx.cache.stats()
True
"""

from rlx.toolchain.cache import AotCache, CacheEntry, CacheWarning, cache_key, explain, stats
from rlx.toolchain.cache_report import EntryInfo, Explanation

__all__ = ["AotCache", "CacheEntry", "CacheWarning", "EntryInfo", "Explanation", "cache_key", "explain", "stats"]
