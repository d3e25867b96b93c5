"""The alpha-beta model: unit parsing, per-step sizes, hierarchical all-reduce, the fit."""

from __future__ import annotations

import pytest

from tensorfleet import validation
from tensorfleet.planner import cost_model as cm, traffic


def test_units_parse_to_bytes_and_bytes_per_second():
    assert validation.parse_bytes("16GB") == 16e9
    assert validation.parse_bytes("512MiB") == 512 * 2**20
    assert validation.parse_bytes(1024) == 1024.0
    assert validation.parse_bandwidth("100Gbps") == 12.5e9
    assert validation.parse_bandwidth("10GB/s") == 10e9
    assert validation.parse_bandwidth("800Mbit/s") == 100e6
    assert validation.parse_duration("5us") == pytest.approx(5e-6)
    assert validation.parse_duration("2ms") == pytest.approx(2e-3)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: validation.parse_bytes("16GQ"), "Unknown memory unit 'GQ' in '16GQ'"),
        (lambda: validation.parse_bytes("-3GB"), "must not be negative. Received: '-3GB'"),
        (lambda: validation.parse_bytes("lots"), "number with a unit such as '16GB'. Received: 'lots'"),
        (lambda: validation.parse_bandwidth("100Gbs"), "Unknown bandwidth unit 'Gbs'"),
        (lambda: validation.parse_bandwidth("0Gbps"), "must be positive. Received: '0Gbps'"),
        (lambda: validation.parse_duration("3 fortnights"), "Unknown time unit 'fortnights'"),
        (lambda: cm.Link(alpha=-1.0, beta=0.0), "alpha must be a finite number >= 0. Received: alpha=-1.0"),
        (lambda: cm.predict("ring", 0, 10.0, cm.Link(0, 1)), "positive integer. Received: n=0"),
    ],
)
def test_bad_values_raise_value_error_naming_the_input(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_parse_rejects_non_strings_with_type_error():
    with pytest.raises(TypeError, match=r"string such as '16GB' or a number. Received: \[1\]"):
        validation.parse_bytes([1])


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("algorithm", ["ps", "naive", "ring", "tree", "butterfly", "halving_doubling"])
def test_step_bytes_equal_the_executed_step_counts(algorithm, n):
    assert cm.step_bytes(algorithm, n, 48.0 * n) == [float(v) for v in traffic.exact_step_values(algorithm, n, 48 * n)]


def test_predict_sums_alpha_plus_beta_per_step():
    link = cm.Link(alpha=1e-5, beta=1e-9)
    s = 4e6
    assert cm.predict("ring", 8, s, link) == pytest.approx(14 * 1e-5 + 14 * (s / 8) * 1e-9)
    assert cm.predict("ps", 8, s, link) == pytest.approx(2 * 1e-5 + 2 * 8 * s * 1e-9)
    assert cm.predict("tree", 8, s, link) == pytest.approx(6 * (1e-5 + s * 1e-9))
    assert cm.predict("butterfly", 8, s, link) == pytest.approx(3 * (1e-5 + s * 1e-9))
    assert cm.predict("ring", 1, s, link) == 0.0


def test_hierarchical_formula_and_its_advantage_over_a_flat_ring_on_the_slow_network():
    fast = cm.Link.from_strings(latency="1us", bandwidth="300GB/s")
    slow = cm.Link.from_strings(latency="10us", bandwidth="10Gbps")
    s = 1e8
    k, g = 4, 8
    expected = 2 * (g - 1) * (1e-6 + (s / g) / 300e9) + 2 * (k - 1) * (1e-5 + (s / (g * k)) / 1.25e9)
    assert cm.predict_hierarchical(k, g, s, intra=fast, inter=slow) == pytest.approx(expected)
    assert cm.predict_hierarchical(k, g, s, intra=fast, inter=slow) < cm.predict("ring", k * g, s, slow)
    # One machine: only the fast links; one device per machine: a plain ring on the slow links.
    assert cm.predict_hierarchical(1, g, s, intra=fast, inter=slow) == pytest.approx(cm.predict("ring", g, s, fast))
    assert cm.predict_hierarchical(k, 1, s, intra=fast, inter=slow) == pytest.approx(cm.predict("ring", k, s, slow))


def test_fit_recovers_alpha_and_beta_from_exact_times():
    alpha, beta = 3e-5, 2e-10
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    steps = [1, 2, 2, 6, 6]
    times = [k * alpha + s * beta for s, k in zip(sizes, steps)]
    link = cm.fit_alpha_beta(sizes, times, steps=steps)
    assert link.alpha == pytest.approx(alpha, rel=1e-9)
    assert link.beta == pytest.approx(beta, rel=1e-9)
    with pytest.raises(ValueError, match="at least 2 measurements of matching lengths. Received: 2 sizes, 1 times"):
        cm.fit_alpha_beta([1, 2], [1.0])


def test_cache_aware_link_charges_every_byte_at_the_uncached_rate_once_the_buffer_leaves_the_cache():
    link = cm.Link(alpha=1e-4, beta=1e-10, cache_bytes=2**25, beta_uncached=4e-10)
    inside, outside = 2.0**25, 2.0**25 + 4
    assert (link.beyond_cache(inside), link.beyond_cache(outside), link.beyond_cache(None)) == (False, True, False)
    assert cm.predict("ps", 4, inside, link) == pytest.approx(2 * (1e-4 + 4 * inside * 1e-10))
    assert cm.predict("ps", 4, outside, link) == pytest.approx(2 * (1e-4 + 4 * outside * 4e-10))
    assert cm.predict("ring", 2, outside, link) == pytest.approx(2 * (1e-4 + outside / 2 * 4e-10))
    # An explicit working set decides instead of the buffer size; a link without a cache never misses.
    assert cm.predict("ps", 4, inside, link, working_set=4 * inside) == pytest.approx(2 * (1e-4 + 4 * inside * 4e-10))
    assert cm.predict("ps", 4, outside, cm.Link(1e-4, 1e-10)) == pytest.approx(2 * (1e-4 + 4 * outside * 1e-10))


def test_fit_link_recovers_the_three_parameters_and_refuses_a_fit_it_cannot_make():
    true = cm.Link(alpha=2e-4, beta=8e-11, cache_bytes=2**25, beta_uncached=1.6e-10)
    sizes = [2.0**k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB: 64 MiB and 256 MiB leave the cache
    for algorithm, n in (("ps", 4), ("ring", 2)):
        times = [cm.predict(algorithm, n, s, true) for s in sizes]
        link = cm.fit_link(algorithm, n, sizes, times, cache_bytes=2**25)
        assert (link.alpha, link.beta, link.beta_uncached) == pytest.approx((2e-4, 8e-11, 1.6e-10), rel=1e-9)
        plain = cm.fit_link(algorithm, n, sizes[:5], times[:5])
        assert (plain.alpha, plain.beta) == pytest.approx((2e-4, 8e-11), rel=1e-9) and plain.cache_bytes is None
    with pytest.raises(ValueError, match="No measurement's working set exceeds the cache.*largest working set 1024 B, "
                                         "cache_bytes=33554432; measure a larger size"):
        cm.fit_link("ps", 4, [1024.0, 1024.0, 1024.0], [1e-4, 1e-4, 1e-4], cache_bytes=2**25)
    with pytest.raises(ValueError, match="needs at least 3 measurements for 3 parameters. Received: 2"):
        cm.fit_link("ps", 4, [1e3, 1e8], [1e-4, 1e-1], cache_bytes=2**25)
    with pytest.raises(ValueError, match=r"Received: 2 sizes, 1 times, 2 working sets"):
        cm.fit_link("ps", 4, [1e3, 1e8], [1e-4])
    with pytest.raises(ValueError, match="needs both cache_bytes and beta_uncached"):
        cm.Link(alpha=0.0, beta=1e-9, cache_bytes=2**25)


def test_last_level_cache_is_the_highest_data_or_unified_level_in_sysfs(tmp_path):
    caches = [("1", "Data", "32K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K"),
              ("3", "Unified", "32768K"), ("4", "Instruction", "64M"), ("4", "Unified", "garbage")]
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(level + "\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert cm.last_level_cache_bytes(str(tmp_path)) == 32 * 2**20
    assert cm.last_level_cache_bytes(str(tmp_path / "missing")) is None
