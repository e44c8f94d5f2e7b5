"""LoadGen's SUT callbacks in front of one of our SUTs.

LoadGen's `issue_queries` only hands the samples to the engine of the SUT's host (scenarios/hosted.py): in this
process, suts/engine/engine.py's (one thread decoding on the scheduler); a server's or a pool of Ray replicas'
(serving/).
It reports each sample's first token (`FirstTokenComplete`) the moment the SUT streams it and completes the sample
with its int32 token ids and `n_tokens`; every LoadGen call is made here, in the process that runs LoadGen.

No exception escapes a LoadGen callback: a SUT that raises, stalls past `stall_timeout_s`, or answers a sample
with anything but a valid result (suts.base.result_problem, and a first token equal to the one it streamed)
fails the run, and every outstanding or later sample is answered at once so that `StartTest` returns instead
of hanging.
"""
import signal
import threading
import time

import mlperf_loadgen as lg
import numpy as np
from tqdm import tqdm

from scenarios.hosted import host_of
from scenarios.records import SampleRecord
from suts.base import SUT, result_problem
from suts.engine.engine import ENGINE, Engine
from suts.engine.sampling import SamplingParams
from suts.engine.scheduler import Result, Sequence


def signal_name(signum: int) -> str:
    """How a run's messages name the signal that ended it."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


FAILED_RESPONSE = np.zeros(2, dtype=np.int32)  # what a failed run answers (2 tokens: LoadGen rejects fewer)


class SUTAdapter:
    def __init__(self, sut: SUT, prompts: list[list[int]], max_new_tokens: int, params: SamplingParams,
                 max_batch: int = 1, stall_timeout_s: float = 120.0, progress: str | None = None,
                 token_budget: int | None = None):
        self.sut, self.prompts, self.max_new_tokens, self.params = sut, prompts, max_new_tokens, params
        self.stall_timeout_s = stall_timeout_s
        self.records: list[SampleRecord] = []
        self.outputs: dict[int, list[int]] = {}  # QSL index -> the tokens last generated for it
        self.error: str | None = None
        self.interrupted = 0  # the signal that ended the run early (SIGINT for Ctrl-C, SIGTERM), 0 if none
        self._pending: dict[int, float] = {}  # response id -> issue time, for samples not yet answered
        self._streamed: dict[int, int] = {}  # response id -> the first token the SUT streamed for it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar = tqdm(desc=progress, unit=" samples", mininterval=1.0, disable=progress is None, dynamic_ncols=True)
        self.host = host_of(sut)  # where the SUT runs: its engine, and what the run record says of it
        self.engine = self.host.engine(max_batch, token_budget, self._fail)
        if not isinstance(self.engine, Engine):
            raise TypeError(f"{type(self.engine).__name__} is no Engine (suts/engine/engine.py): it lacks "
                            + ", ".join(n for n in ENGINE if not hasattr(self.engine, n)))
        self.handle = lg.ConstructSUT(self._issue_queries, lambda: None)
        self._watchdog = threading.Thread(target=self._watch, name="sut-watchdog", daemon=True)
        self._watchdog.start()

    @property
    def batch(self) -> int:
        """At most this many samples decode together."""
        return self.engine.batch

    # LoadGen's thread: hand the samples to the engine and return at once.
    def _issue_queries(self, samples):
        try:
            now = time.perf_counter()
            batch = [(s.id, s.index) for s in samples]
            with self._lock:
                self._pending.update((sid, now) for sid, _ in batch)
            if self.error:
                self._answer_pending()
            else:
                self.engine.submit([self._sequence(sid, index) for sid, index in batch])
        except BaseException as e:  # never let an exception reach LoadGen
            self._fail(f"issue_queries failed: {type(e).__name__}: {e}")

    def _sequence(self, sid: int, index: int) -> Sequence:
        return Sequence(self.prompts[index], self.max_new_tokens, self.params.for_sample(index),
                        on_first_token=lambda tok: self._first_token(sid, tok),
                        on_done=lambda result: self._complete(sid, index, result))

    def _first_token(self, sid: int, token: int):
        self._streamed[sid] = token
        data = np.array([token], dtype=np.int32)
        with self._lock:
            if sid in self._pending:  # not if the watchdog already answered it
                lg.FirstTokenComplete([lg.QuerySampleResponse(sid, data.ctypes.data, data.nbytes)])

    def _problem(self, sid: int, result: Result) -> str | None:
        problem = result_problem(result, self.max_new_tokens, self.sut.vocab_size, self.sut.eos_id)
        streamed = self._streamed.pop(sid, None)
        if problem is None and streamed is None:
            return "no first token streamed (a SUT calls on_first_token as soon as its first token exists)"
        if problem is None and streamed != result.tokens[0]:
            return f"a first token streamed ({streamed}) that is not the output's first ({result.tokens[0]})"
        return problem

    def _complete(self, sid: int, index: int, result: Result):
        problem = self._problem(sid, result)
        if problem:
            self._fail(f"SUT {self.sut.name} answered sample {index} with {problem}")
            return
        data = np.array(result.tokens, dtype=np.int32)
        with self._lock:
            issued = self._pending.pop(sid, None)
            if issued is None:  # already answered by the watchdog
                return
            lg.QuerySamplesComplete([lg.QuerySampleResponse(sid, data.ctypes.data, data.nbytes, len(data))])
        s, now = result.stats, time.perf_counter()
        self.outputs[index] = result.tokens
        self.records.append(SampleRecord(index, len(self.prompts[index]), ttft_s=now - issued - (s.total_s - s.ttft_s),
                                         latency_s=now - issued, stats=s))
        self._bar.update(1)

    def interrupt(self, signum: int):
        """Ctrl-C or SIGTERM: answer every outstanding and later sample at once, so that LoadGen can wind the test
        down."""
        self.interrupted = signum
        self._fail(f"interrupted ({signal_name(signum)})")

    def _fail(self, message: str):
        if self.error is None:
            self.error = message
        self.engine.halt()
        self._answer_pending()

    def _answer_pending(self):
        with self._lock:
            ids, self._pending = list(self._pending), {}
            for sid in ids:
                lg.FirstTokenComplete([lg.QuerySampleResponse(sid, FAILED_RESPONSE.ctypes.data, 4)])
                lg.QuerySamplesComplete([lg.QuerySampleResponse(
                    sid, FAILED_RESPONSE.ctypes.data, FAILED_RESPONSE.nbytes, len(FAILED_RESPONSE))])

    def _watch(self):
        while not self._stop.wait(0.5):
            busy = self.engine.busy_since
            if busy is not None and time.perf_counter() - busy > self.stall_timeout_s:
                self._fail(f"SUT {self.sut.name} stalled: no progress within {self.stall_timeout_s:.0f} s")

    def close(self, destroy: bool = True):
        """Stop the threads; `destroy=False` leaves LoadGen's SUT alone when a test may still be running."""
        self._stop.set()
        self.engine.close()
        self._bar.close()
        if destroy:
            lg.DestroySUT(self.handle)
