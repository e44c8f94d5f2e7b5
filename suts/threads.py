"""How many threads a fused call runs on, picked by timing the calls themselves.

kernels.c splits a call's outputs between threads, never a sum, so its results do not depend on the count, and the
best count depends on the machine and the call's size: on a 16-core Xeon VM, under LoadGen, the shipped draft's
step took 0.37 ms on 15 threads and 0.06 on 4, the target's decode step 1.30 and 0.67 ms (a step is some thirty
parallel regions, each ending when its last thread does), while a verify pass or a batch of 64 rows has work for
more. So each size of call (its tokens, rounded up to a power of
two, and its greedy steps) tries every count in turn, and keeps the one with the lowest median time for REPICK
calls before trying them all again: what a count gets changes within a run (LoadGen's own threads start only after
the warm-up, and on a machine with threads to spare they take cores from torch's).
"""
import statistics

ROUNDS = 3  # timings of each count before a size keeps its fastest
REPICK = 1000  # calls on a size's kept count before every count is timed again (trials: about 2% of calls)


def candidates(most: int) -> list[int]:
    """The counts tried: the powers of two below `most`, and `most`."""
    return sorted({1 << i for i in range(most.bit_length()) if 1 << i < most} | {most})


class ThreadPicker:
    """One model's thread counts by call size: tried round-robin, ROUNDS timings each, then the fastest kept for
    REPICK calls."""

    def __init__(self):
        self.times: dict[tuple, dict[int, list[float]]] = {}  # by (size, most): each count's timings
        self.best: dict[tuple, int] = {}  # by (size, most): the count kept
        self.uses: dict[tuple, int] = {}  # by (size, most): calls on the kept count

    @staticmethod
    def size(tokens: int, steps: int) -> tuple[int, int]:
        return 1 << (tokens - 1).bit_length(), steps

    def pick(self, size: tuple[int, int], most: int) -> int:
        """The count for this call: the kept one, or the count timed least so far."""
        if most <= 1:
            return 1
        key = (size, most)
        if (kept := self.best.get(key)) is not None:
            self.uses[key] += 1
            if self.uses[key] <= REPICK:
                return kept
            del self.best[key]
        times = self.timed(key)
        return min(times, key=lambda n: len(times[n]))

    def record(self, size: tuple[int, int], most: int, threads: int, seconds: float) -> None:
        """A call's time on `threads`; once every count has ROUNDS, the fastest by median is kept."""
        key = (size, most)
        if most <= 1 or key in self.best:
            return
        times = self.timed(key)
        times[threads].append(seconds)
        if all(len(t) >= ROUNDS for t in times.values()):
            self.best[key], self.uses[key] = min(times, key=lambda n: statistics.median(times[n])), 0
            del self.times[key]

    def timed(self, key: tuple) -> dict[int, list[float]]:
        return self.times.setdefault(key, {n: [] for n in candidates(key[1])})
