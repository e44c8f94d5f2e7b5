"""A SUT served from one thread: the in-process engine that LoadGen's adapter and every Ray replica run.

Sequences are submitted from any thread and decode as they arrive. A batched SUT runs on one scheduler in every
scenario (SingleStream's holds one row), where sequences that arrive while others decode join the running batch
at the next iteration (continuous batching); a plug-in that only implements `generate` decodes one sequence at a
time. Each sequence reports through its own `on_first_token` and `on_done`; an exception from the SUT stops the
engine and goes to `on_error` once.
"""
import queue
import threading
import time
from typing import Callable

from suts.scheduler import Scheduler, Sequence


class Engine:
    def __init__(self, sut, max_batch: int = 1, token_budget: int | None = None,
                 on_error: Callable[[str], None] = lambda message: None):
        self.sut, self.on_error = sut, on_error
        self.scheduler = Scheduler(sut, max_batch, token_budget) if getattr(sut, "batched", False) else None
        self.busy_since: float | None = None  # when the call to the SUT under way began (a watchdog reads it)
        self.halted = False
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="sut-engine", daemon=True)
        self._thread.start()

    @property
    def batch(self) -> int:
        """At most this many sequences decode together."""
        return self.scheduler.max_batch if self.scheduler else 1

    @property
    def load(self) -> tuple[int, int]:
        """(sequences holding a row, sequences waiting for one), as a server's metrics report them."""
        rows = self.scheduler.rows if self.scheduler else int(self.busy_since is not None)
        waiting = len(self.scheduler.waiting) if self.scheduler else 0
        return rows, waiting + self._queue.qsize()

    def submit(self, seqs: list[Sequence]) -> None:
        self._queue.put(seqs)

    def halt(self) -> None:
        """Decode nothing more (the run has failed): what is queued or running is dropped."""
        self.halted = True

    def _work(self):
        while True:
            busy = self.scheduler is not None and self.scheduler.busy
            arrived = [] if busy else [self._queue.get()]  # wait for sequences only when nothing is decoding
            while not self._queue.empty():
                arrived.append(self._queue.get())
            if None in arrived:
                return
            seqs = [seq for submitted in arrived for seq in submitted]
            try:
                if self.scheduler is None:
                    for seq in seqs:
                        if self.halted:
                            break
                        self.busy_since = time.perf_counter()
                        seq.on_done(self.sut.generate(seq.prompt, seq.max_new_tokens, seq.params,
                                                      on_first_token=seq.on_first_token))
                else:
                    for seq in seqs:
                        self.scheduler.submit(seq)
                    if not self.halted:
                        self.busy_since = time.perf_counter()
                        self.scheduler.iterate()
            except Exception as e:
                self.halted = True
                self.on_error(f"SUT {self.sut.name} raised {type(e).__name__}: {e}")
            self.busy_since = None
            if self.halted and self.scheduler is not None:
                self.scheduler.drop()

    def close(self) -> None:
        """Stop the thread (a stalled one is a daemon thread and dies with the process)."""
        self._queue.put(None)
        self._thread.join(timeout=5)
