"""The report's row of hit tokens by KV tier: shown for engines with tiers, '-' per missing."""

from __future__ import annotations

from prefixcache.integrations.bench.report_table import tier_hits


def test_the_tiers_an_engine_has_are_shown_in_order() -> None:
    assert tier_hits({"hit_tokens": 5}) is None
    assert tier_hits({"host_tier_hit_tokens": 1234}) == "1,234 / - / -"
    stats = {"host_tier_hit_tokens": 0, "disk_tier_hit_tokens": 64, "remote_tier_hit_tokens": 16}
    assert tier_hits(stats) == "0 / 64 / 16"
