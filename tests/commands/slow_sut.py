"""A plug-in SUT for the server's tests: the baseline at 5 ms a step at least, so that a long request outlasts
a client that leaves after its first chunk, on any machine."""
import time

from suts.base import GREEDY
from suts.baseline import Baseline


class Slow(Baseline):
    name = "slow"

    def step(self, seqs):
        time.sleep(0.005)
        return super().step(seqs)


class SlowWhole(Slow):
    """The same, as a plug-in that implements only `generate` (not batched): decoded whole, on a thread of its own."""
    name = "slow-whole"

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        return super().generate(prompt, max_new_tokens, params, on_first_token)
