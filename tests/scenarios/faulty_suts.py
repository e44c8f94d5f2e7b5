"""SUT plug-ins that misbehave, for the watchdog tests."""
import time

from suts.baseline import Baseline


class RaisesInTest(Baseline):
    calls = 0

    def generate(self, *args, **kwargs):
        type(self).calls += 1
        if type(self).calls > 5:  # calibration makes 4 calls; fail inside LoadGen's test
            raise RuntimeError("simulated SUT crash")
        return super().generate(*args, **kwargs)


class StallsInTest(Baseline):
    calls = 0

    def generate(self, *args, **kwargs):
        type(self).calls += 1
        if type(self).calls > 5:
            time.sleep(3600)
        return super().generate(*args, **kwargs)
