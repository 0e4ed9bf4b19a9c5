"""The order of the contenders in each round of an interleaved benchmark.

A contender's time can depend on the one that ran just before it (the GPU's clocks and temperature
after that one's power draw, what it left in L2). A plain rotation (round r starts at contender r)
puts every contender in every position equally often but always after the same neighbour: with
contenders (cudnn, old, new), `new` always runs right after `old` or first, so a carry-over from
the previous run biases one side of an A/B the same way every round. `round_order` follows a
Williams design (E. J. Williams, "Experimental designs balanced for the estimation of residual
effects of treatments", Australian Journal of Scientific Research, 1949): over one period of rounds
-- n for an even number n of contenders, 2n for an odd one -- every contender runs in every
position equally often and, within the rounds, directly after every other contender equally often
(the first run of a round follows the last of the one before, which the design does not balance).
For three contenders the first three rounds are the plain rotation: balance needs a multiple of
`period(n)` rounds (ab_variants.py and ab_decode.py run one period per row by default).
"""


def period(n):
    """Rounds after which round_order's design repeats (n contenders)."""
    return n if n % 2 == 0 else 2 * n


def round_order(names, r):
    """Names in the order they run in round r (0-based), see the module docstring."""
    n = len(names)
    if n < 2:
        return list(names)
    base, lo, hi = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...: consecutive differences all distinct mod n
    while len(base) < n:
        if len(base) % 2 == 1:
            base.append(lo)
            lo += 1
        else:
            base.append(hi)
            hi -= 1
    k = r % period(n)
    row = [(b + k) % n for b in base]
    if k >= n:  # odd n: the second half of the period runs the first half's rows backwards
        row.reverse()
    return [names[i] for i in row]


def schedule(names, rounds=None):
    """Every name once per round, round after round in round_order's order: `rounds` rounds, or one
    period (period(len(names))) where rounds is None or 0."""
    names = list(names)
    for r in range(rounds or period(len(names))):
        yield from round_order(names, r)
