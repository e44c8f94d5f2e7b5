"""How many threads a fused call runs on, picked by timing the calls themselves.

The C kernels split a call's outputs between threads, never a sum, so its results do not depend on the count, and the
best count depends on the machine and the call's size: a small step is some thirty parallel regions, each ending
when its last thread does, so it runs fastest on a few threads, while a verify pass or a batch of 64 rows has work
for more (docs/measurements.md has the figures). So each size of call (its tokens, rounded up to a power of two,
and whether it is a greedy chain, timed per step) tries every count in turn, and keeps the one with the lowest
median time for REPICK calls before trying them all again: what a count gets changes within a run (LoadGen's own
threads start only after the warm-up, and take cores from torch's). A count is tried on a streak of its size's
calls, the first left untimed: a call on more threads than the last one wakes threads that had gone idle, which
steady running never pays.
"""
import statistics

ROUNDS = 3  # timings of each count before a size keeps its fastest (after one untimed call on it)
REPICK = 1000  # calls on a size's kept count before every count is timed again (trials: about 2% of calls)


def candidates(most: int) -> list[int]:
    """The counts tried: the powers of two below `most`, and `most`."""
    return sorted({1 << i for i in range(most.bit_length()) if 1 << i < most} | {most})


class ThreadPicker:
    """One model's thread counts by call size: each tried on a streak of 1 + ROUNDS calls, the first untimed, then
    the fastest kept for REPICK calls."""

    def __init__(self):
        self.times: dict[tuple, dict[int, list[float]]] = {}  # by (size, most): each count's timings
        self.best: dict[tuple, int] = {}  # by (size, most): the count kept
        self.uses: dict[tuple, int] = {}  # by (size, most): calls on the kept count

    @staticmethod
    def size(tokens: int, steps: int) -> tuple[int, bool]:
        """A call's size as the picker tells sizes apart: its tokens rounded up to a power of two, and whether it is
        a greedy chain (whose every length shares one size: its time is recorded per step)."""
        return 1 << (tokens - 1).bit_length(), steps > 1

    def pick(self, size: tuple[int, bool], most: int) -> int:
        """The count for this call: the kept one, or the first count whose streak is not yet done."""
        if most <= 1:
            return 1
        key = (size, most)
        if (kept := self.best.get(key)) is not None:
            self.uses[key] += 1
            if self.uses[key] <= REPICK:
                return kept
            del self.best[key]
        times = self.timed(key)
        return next(n for n, t in times.items() if len(t) <= ROUNDS)

    def record(self, size: tuple[int, bool], most: int, threads: int, seconds: float) -> None:
        """A call's time on `threads`; once every count's streak is done, the fastest by the median of its timed
        calls (all but the first) is kept."""
        key = (size, most)
        if most <= 1 or key in self.best:
            return
        times = self.timed(key)
        times[threads].append(seconds)
        if all(len(t) > ROUNDS for t in times.values()):
            self.best[key], self.uses[key] = min(times, key=lambda n: statistics.median(times[n][1:])), 0
            del self.times[key]

    def timed(self, key: tuple) -> dict[int, list[float]]:
        """Each count's timings so far at this (size, most), none to begin with."""
        return self.times.setdefault(key, {n: [] for n in candidates(key[1])})

    def kept(self) -> dict[str, int]:
        """Each size's kept count, by size: '1 token', '8 tokens', '2-token chains' (greedy chains)."""
        return {f"{tokens}-token chains" if chain else f"{tokens} token{'s' * (tokens > 1)}": n
                for ((tokens, chain), _), n in sorted(self.best.items())}


def kept_threads(models: dict) -> dict[str, int]:
    """The counts kept by these models' fused steps (role -> runner, None where there is none) for a run's record:
    '<role> <size>' -> threads. Nothing where one thread was all there was to pick, or off the CPU fast path."""
    steps = {role: getattr(m, "fast_step", None) for role, m in models.items()}  # None: no runner, or no fast step
    pickers = {role: step.threads for role, step in steps.items() if step is not None}
    return {f"{role} {size}": n for role, p in pickers.items() if isinstance(p, ThreadPicker)
            for size, n in p.kept().items()}


def describe(kept: dict[str, int]) -> str:
    """kept_threads' counts on one line, each role's sizes grouped by count: 'target: 1 thread for 1 token, 8 tokens;
    2 for 64 tokens | draft: 1 thread for all 12 sizes'."""
    roles: dict[str, dict[int, list[str]]] = {}
    for key, n in kept.items():
        role, size = key.split(" ", 1)
        roles.setdefault(role, {}).setdefault(n, []).append(size)
    lines = []
    for role, counts in roles.items():
        groups = []
        for n, sizes in sorted(counts.items()):
            unit = (" thread" + "s" * (n > 1)) if not groups else ""  # named once, at the first count
            every = len(counts) == 1 and len(sizes) > 1
            groups.append(f"{n}{unit} for " + (f"all {len(sizes)} sizes" if every else ", ".join(sizes)))
        lines.append(f"{role}: " + "; ".join(groups))
    return " | ".join(lines)
