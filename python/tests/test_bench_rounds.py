"""bench/rounds.py: the interleaved benchmarks' order is balanced for position and predecessor."""
import itertools
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from rounds import period, round_order, schedule  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_every_position_and_predecessor_equally_often(n):
    names = [f"c{i}" for i in range(n)]
    rows = [round_order(names, r) for r in range(period(n))]
    for row in rows:
        assert sorted(row) == names  # each round runs everyone once
    positions = {(row[p], p) for row in rows for p in range(n)}
    counts = {key: sum(row[key[1]] == key[0] for row in rows) for key in positions}
    assert len(counts) == n * n and len(set(counts.values())) == 1
    pairs = [(row[p - 1], row[p]) for row in rows for p in range(1, n)]
    if n >= 2:
        counts = {pair: pairs.count(pair) for pair in itertools.permutations(names, 2)}
        assert min(counts.values()) == max(counts.values()) >= 1
    assert [round_order(names, r + period(n)) for r in range(period(n))] == rows  # it repeats


def test_plain_rotation_is_not_balanced():
    # What rounds.py replaces: with three contenders `new` always follows `old` or runs first.
    names = ["cudnn", "old", "new"]
    rotation = [names[r % 3:] + names[:r % 3] for r in range(6)]
    pairs = [(row[p - 1], row[p]) for row in rotation for p in range(1, 3)]
    assert ("new", "old") not in pairs
    balanced = [round_order(names, r) for r in range(6)]
    assert ("new", "old") in [(row[p - 1], row[p]) for row in balanced for p in range(1, 3)]


def test_schedule_runs_rounds_in_order_and_one_period_by_default():
    names = ["cudnn", "old", "new"]
    assert list(schedule(names)) == [n for r in range(period(3)) for n in round_order(names, r)]
    assert list(schedule(names, 2)) == round_order(names, 0) + round_order(names, 1)
    assert list(schedule({"a": 1, "b": 2})) == ["a", "b", "b", "a"]  # a dict's keys, as the scripts pass
