"""SUT plug-ins for the scenario tests: ones that misbehave, and one whose pace no CPU can change."""
import os
import signal
import time

import torch

from mlperf.chunk import Chunk
from suts.base import GREEDY
from suts.baseline import Baseline
from suts.speculative import Speculative


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


class AlarmsThenStalls(Baseline):
    """Inside LoadGen's test, raises SIGALRM in the main thread (a caller's time limit expiring) and hangs."""
    calls = 0

    def generate(self, *args, **kwargs):
        type(self).calls += 1
        if type(self).calls > 2:  # the warm-up, then one sample
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            time.sleep(3600)
        return super().generate(*args, **kwargs)


class WrongFirstToken(Baseline):
    """Reports a first token (TTFT) that is not the first token of its output: TEST06 must fail it."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        result = super().generate(prompt, max_new_tokens, params)
        if on_first_token is not None:
            on_first_token((result.tokens[0] + 1) % self.target.config.vocab_size)
        return result


class ChangesOneToken(Baseline):
    """Greedy, but the last token of every output is off by one: the accuracy gate must fail it."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        result = super().generate(prompt, max_new_tokens, params, on_first_token)
        result.tokens[-1] = (result.tokens[-1] + 1) % self.target.config.vocab_size
        return result


class HotSampler(Baseline):
    """Samples at three times the temperature it was asked for: the sampled accuracy gate must fail it."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        from dataclasses import replace
        return super().generate(prompt, max_new_tokens, replace(params, temperature=3 * params.temperature),
                                on_first_token)


class PacedSpec(Speculative):
    """spec with every cycle lasting at least 5 ms: a sample then outlasts the gaps between Server arrivals at
    40 QPS on any CPU, so that later arrivals join a running batch however fast the machine decodes."""

    def step(self, seqs):
        time.sleep(0.005)
        return super().step(seqs)


class AltersItsAnswers(Baseline):
    """Greedy, with each answer passed through `alter` (one plug-in per rule that a SUT's answer must keep)."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        return self.alter(super().generate(prompt, max_new_tokens, params, on_first_token))


class TooManyTokens(AltersItsAnswers):
    def alter(self, result):
        result.tokens *= 10
        return result


class ReturnsNone(AltersItsAnswers):
    def alter(self, result):
        return None


class FrontLoaded(Baseline):
    """Decodes its whole answer ten times over before it reports the first token, then none after it: the fastest
    decode LoadGen can time, ten times the baseline's work end to end. The smoke gate must fail it."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        for _ in range(10):
            result = super().generate(prompt, max_new_tokens, params)
        if on_first_token is not None:
            on_first_token(result.tokens[0])
        return result


class NeverStreams(Baseline):
    """Never reports its first token through on_first_token (LoadGen's time to first token)."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        return super().generate(prompt, max_new_tokens, params)


class StallsInCalibration(Baseline):
    def generate(self, *args, **kwargs):
        time.sleep(3600)


class FailsToBuild(Baseline):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("no accelerator here")


class FailsMidRun(Baseline):
    """A replica's fault, the same in every process: once this process has decoded $MLPERF_FAULT_TOKENS tokens it
    dies ($MLPERF_FAULT=kill: SIGKILL, as the out-of-memory killer would; raise; or stall). With $MLPERF_FAULT_ONCE,
    a path, only the process that creates that file first fails: one replica of several. (MLPERF_*: what a run
    hands its replicas on any cluster.)"""
    decoded = 0

    def step(self, seqs):
        type(self).decoded += len(seqs)
        if (type(self).decoded > int(os.environ["MLPERF_FAULT_TOKENS"])
                and first_to_claim(os.environ.get("MLPERF_FAULT_ONCE"))):
            fault = os.environ["MLPERF_FAULT"]
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "stall":
                time.sleep(3600)
            raise RuntimeError("simulated replica fault")
        return super().step(seqs)


def first_to_claim(path: str | None) -> bool:
    """Whether this process is the first to claim `path` (True when no path is given); a later call in the same
    process that claimed it is True again."""
    if path is None:
        return True
    try:
        with open(path, "x") as f:
            f.write(str(os.getpid()))
        return True
    except FileExistsError:
        return open(path).read() == str(os.getpid())


class StopsEarly(Baseline):
    """Greedy, but every answer ends at EOS halfway: half the baseline's tokens per sample (the accuracy gate's
    band must fail it, whatever else it finds)."""

    def generate(self, prompt, max_new_tokens, params=GREEDY, on_first_token=None):
        result = super().generate(prompt, max_new_tokens, params, on_first_token)
        result.tokens[max(2, len(result.tokens) // 2) - 1:] = [self.eos_id]
        return result


class DecodesInt32Ids(Baseline):
    """Feeds its target int32 token ids at every decode step, which the CPU's fused step does not take: each such
    step runs through the modules, and the run record counts it under the step's reason."""

    def step(self, seqs):
        cache = self.cache.rows(0, len(seqs))
        logits = self.target(torch.tensor([s.tokens[-1:] for s in seqs], dtype=torch.int32), Chunk(cache)).logits[:, -1]
        return [[int(t)] for t in logits.argmax(-1)]
