"""The paired in-process measurement (bench/paired.py): its rule and its table (docs/benchmarks.md renders the kept run)."""

from __future__ import annotations


from bench.paired import DEVICES, LibraryLimit, render, verdict


def test_a_device_earns_its_place_when_its_median_cost_passes_5_percent_and_no_round_reads_it_cheaper_off() -> None:
    assert verdict([1.15, 1.20, 1.01, 1.18]) == "earns its place"
    assert verdict([1.15, 1.20, 0.99, 1.18]) == "removable"  # one round cheaper off: the sign is not shown
    assert verdict([1.04, 1.03, 1.06, 1.02]) == "removable"  # shown, but under 5 %
    assert verdict([1.5, 1.5, 1.5]) == "removable"  # too few rounds to say


def test_the_table_gives_each_device_its_cpu_on_and_off_and_its_ratios() -> None:
    side = {"python": 1.5, "postgres": 0.5}
    result = {"rounds": 4, "accepts_per_block": 1000, "devices": [
        {"device": "second validator", "setting": "SEND_PLAIN_VALIDATOR=0", "unit": "accept", "on": [side] * 4,
         "off": [{"python": 1.9, "postgres": 0.5}] * 4, "ratios": [1.1, 1.2, 1.2, 1.3], "median_ratio": 1.2,
         "verdict": "earns its place"}]}

    row = render(result).splitlines()[-1]

    assert row == ("| second validator | `SEND_PLAIN_VALIDATOR=0` | 2.000 → 2.400 ms per accept | 1.200× (1.100–1.300) "
                   "| +20.0 % (+10.0 to +30.0) of B1's CPU per accept | **earns its place** |")


def test_the_devices_measured_in_pairs_are_switches_the_product_reads_or_limits_of_its_libraries() -> None:
    import importlib

    from django.conf import settings

    from bench.ablation_table import GONE_WITH_DEVICE, REMOVED

    assert [d.setting for d in DEVICES] == ["METRICS_FLUSH_SECONDS", "psycopg._queries.MAX_CACHED_STATEMENT_PARAMS",
                                            "messaging.inserts._statements"]
    for device in DEVICES:
        if isinstance(device, LibraryLimit):
            module, _, name = device.setting.rpartition(".")
            assert hasattr(importlib.import_module(module), name)
        else:
            assert hasattr(settings, device.setting)
            assert device.setting not in REMOVED and device.setting not in GONE_WITH_DEVICE


def test_a_library_limit_is_off_inside_its_switch_only() -> None:
    from psycopg import _queries

    [limit] = [d for d in DEVICES if d.key == "parse-cache"]
    before = _queries.MAX_CACHED_STATEMENT_PARAMS
    with limit.switched_off():
        assert _queries.MAX_CACHED_STATEMENT_PARAMS == -1
    assert _queries.MAX_CACHED_STATEMENT_PARAMS == before


def test_the_insert_text_cache_forgets_inside_its_switch_only() -> None:
    from messaging import inserts

    [cache] = [d for d in DEVICES if d.key == "insert-text"]
    kept = inserts._statements
    with cache.switched_off():
        inserts._statements["shape"] = "INSERT …"
        assert inserts._statements.get("shape") is None
    assert inserts._statements is kept
