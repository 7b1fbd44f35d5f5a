"""engine/deferred_cost.py: the expected seconds of taking a drafting step's held deltas."""

from mtpserve.engine.deferred_cost import DeferredCost


def test_nothing_is_expected_before_a_take():
    assert DeferredCost().expect(64) == 0.0


def test_the_median_per_delta_of_the_bucket_times_the_count():
    c = DeferredCost(window=4)
    for seconds in (0.64, 0.32, 0.96):       # 64 deltas: 10, 5, 15 ms each
        c.observe(64, seconds)
    assert c.expect(64) == 64 * 0.010
    assert c.expect(40) == 40 * 0.010        # 33-64: the same bucket


def test_one_slow_take_does_not_move_the_expectation():
    """A take 50 times the others (a garbage collection, the GIL held elsewhere) leaves the
    median where it was; an average weighted 0.2 moved ~10x and pushed the next steps'
    seconds below zero (a review, session 39)."""
    c = DeferredCost()
    for _ in range(5):
        c.observe(2, 0.002)
    c.observe(2, 0.100)
    assert c.expect(2) == 0.002


def test_a_count_without_samples_takes_the_nearest_bucket():
    c = DeferredCost()
    c.observe(1, 0.004)                      # one delta alone: 4 ms
    c.observe(64, 0.064)                     # 64 at once: 1 ms each
    assert c.expect(1) == 0.004
    assert c.expect(48) == 48 * 0.001        # its own bucket, 33-64
    assert c.expect(128) == 128 * 0.001      # 65-128: nearest is 33-64
    assert c.expect(2) == 2 * 0.004          # 2: nearest is 1 (tie to the smaller bucket)
    assert c.expect(0) == 0.0


def test_the_window_forgets_old_takes():
    c = DeferredCost(window=3)
    for s in (0.009, 0.009, 0.009, 0.001, 0.001, 0.001):
        c.observe(1, s)
    assert c.expect(1) == 0.001
