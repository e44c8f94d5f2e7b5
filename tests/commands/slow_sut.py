"""A plug-in SUT for the server's tests: the baseline at 5 ms a step at least, so that a long request outlasts
a client that leaves after its first chunk, on any machine."""
import time

from suts.baseline import Baseline


class Slow(Baseline):
    name = "slow"

    def step(self, seqs):
        time.sleep(0.005)
        return super().step(seqs)
