"""The Batcher's batch-size policy: how many queued requests of one option set run as the next
batch, from the measured time of each padded size (see :mod:`libreyolo.serve.batcher`)."""
from __future__ import annotations

import collections
import statistics

TIMED = 15   # recent batch times kept per padded size (their median is the size's cost)
RETIME = 32  # a padded size not timed for this many batches is run once more when it can be filled (re-timed)


class SizePolicy:
    """The padded sizes, their recent batch times and the choice they make. Not locked: the
    Batcher calls it under its own lock."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.sizes = sizes
        self._seconds = {size: collections.deque(maxlen=TIMED) for size in sizes}  # recent batch times
        self.cost: dict[int, float] = {}  # padded size -> median of those seconds
        self._timed_at: dict[int, int] = {}  # padded size -> the batch count when it was last timed

    def padded(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def take(self, queued: int, max_batch: int, batches: int) -> int:
        """How many of ``queued`` requests to run now, ``batches`` having run so far: all of them (at
        most ``max_batch``), or fewer where a smaller padded size filled exactly runs more images per
        second by the measured batch times; all of them until every size is timed. A size not timed
        for ``RETIME`` batches that the queue can fill is taken, to time it again (its cost may be a
        warm-up's or a busy moment's)."""
        n = min(queued, max_batch)
        cost = self.cost
        if len(cost) < len(self.sizes):
            return n
        stale = [s for s in self.sizes if s <= n and batches - self._timed_at.get(s, 0) > RETIME]
        if stale:
            return min(stale, key=lambda s: self._timed_at.get(s, 0))
        return max([n, *(s for s in self.sizes if s < n)], key=lambda k: k / cost[self.padded(k)])

    def timed(self, size: int, seconds: float, batches: int) -> None:
        times = self._seconds[size]
        times.append(seconds)
        self.cost[size] = statistics.median(times)
        self._timed_at[size] = batches
