"""Exceptions a caller of the prefix cache can cause."""

from __future__ import annotations


class PrefixCacheError(Exception):
    """Base class of every error the prefix cache raises on purpose."""


class CacheFull(PrefixCacheError):
    """Not enough free or evictable blocks for an allocation.

    Raised before anything changes: the pool, the tree and every counter are exactly as they were.
    """
