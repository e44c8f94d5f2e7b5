"""A SUT served from one thread: the in-process engine that LoadGen's adapter, every Ray replica and the server run.

Sequences are submitted from any thread and decode as they arrive. A batched SUT runs on one scheduler in every
scenario (SingleStream's holds one row), where sequences that arrive while others decode join the running batch
at the next iteration (continuous batching); a plug-in that only implements `generate` decodes one sequence at a
time. Each sequence reports through its own `on_first_token` and `on_done`; an exception from the SUT stops the
engine and goes to `on_error` once. The engine runs on a thread of its own, or, for a server, on the server's
event loop (`drive`): a batched SUT's iterations then take turns with the loop's sockets, and a token reaches the
handler that writes it without waiting for another thread to hand it over.
"""
import asyncio
import queue
import threading
import time
from typing import Callable, Protocol, runtime_checkable

from suts.engine.scheduler import Scheduler, Sequence


def first_token(seq: Sequence) -> Callable[[int], None]:
    """What a plug-in's `generate` reports its first token to: the sequence's callback, and its stream's (the rest
    of a plug-in's tokens come with its Result)."""
    def first(tok: int) -> None:
        if seq.on_first_token is not None:
            seq.on_first_token(tok)
        if seq.on_tokens is not None:
            seq.on_tokens([tok])
    return first


@runtime_checkable
class Engine(Protocol):
    """What LoadGen's adapter and the server ask of whatever decodes their sequences: this module's LocalEngine, a
    server's (serving/endpoint.py: HTTPEngine) or Ray replicas' (serving/replicas.py: RemoteEngine). Each sequence
    answers through its own callbacks; an engine that cannot go on calls the `on_error` it was made with."""
    batch: int  # at most this many sequences decode together
    busy_since: float | None  # when the call under way began, for a stall watchdog; None: nothing to watch

    def submit(self, seqs: list[Sequence]) -> None:
        """Decode `seqs`, from any thread."""

    def halt(self) -> None:
        """Decode nothing more (the run has failed)."""

    def close(self) -> None:
        """Stop, after what is running."""


ENGINE = ("batch", "busy_since", "submit", "halt", "close")  # what an Engine has (a refusal names the missing)


class LocalEngine:
    """The engine of a SUT in this process (an Engine)."""

    def __init__(self, sut, max_batch: int = 1, token_budget: int | None = None,
                 on_error: Callable[[str], None] = lambda message: None, thread: bool = True):
        self.sut, self.on_error = sut, on_error
        self.scheduler = Scheduler(sut, max_batch, token_budget) if getattr(sut, "batched", False) else None
        self.busy_since: float | None = None  # when the call to the SUT under way began (a watchdog reads it)
        self.halted = False
        self._queue: queue.Queue = queue.Queue()
        self._arrived: asyncio.Event | None = None  # drive's: set by submit
        self._thread = threading.Thread(target=self._work, name="sut-engine", daemon=True) if thread else None
        if self._thread:
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
        """From any thread; on a driven engine, from its loop's."""
        self._queue.put(seqs)
        if self._arrived is not None:
            self._arrived.set()

    def halt(self) -> None:
        """Decode nothing more (the run has failed): what is queued or running is dropped."""
        self.halted = True

    def _work(self):
        while True:
            busy = self.scheduler is not None and self.scheduler.busy
            arrived = [] if busy else [self._queue.get()]  # wait for sequences only when nothing is decoding
            if not self._run(arrived):
                return

    async def drive(self) -> None:
        """The engine on the running event loop (made with thread=False), until cancelled: a batched SUT one
        iteration at a time, yielding to the loop after each (the handlers its tokens woke write them first); a
        plug-in's `generate` on a worker thread, which would hold the loop for a whole sequence."""
        self._arrived = asyncio.Event()
        while True:
            if (self.scheduler is None or not self.scheduler.busy) and self._queue.empty():
                await self._arrived.wait()
            self._arrived.clear()
            if self.scheduler is None:
                await asyncio.to_thread(self._run, [])
            else:
                self._run([])
            await asyncio.sleep(0)

    def _run(self, arrived: list) -> bool:
        """What arrived and what waits in the queue submitted, then one scheduler iteration (a plug-in: each
        sequence generated in turn). False once close() has been called."""
        while not self._queue.empty():
            arrived.append(self._queue.get())
        if None in arrived:
            return False
        seqs = [seq for submitted in arrived for seq in submitted]
        try:
            if self.scheduler is None:
                for seq in seqs:
                    if self.halted:
                        break
                    self.busy_since = time.perf_counter()
                    seq.on_done(self.sut.generate(seq.prompt, seq.max_new_tokens, seq.params,
                                                  on_first_token=first_token(seq)))
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
        return True

    def close(self) -> None:
        """Stop the thread (a stalled one is a daemon thread and dies with the process); a driven engine stops
        when its task is cancelled."""
        if self._thread:
            self._queue.put(None)
            self._thread.join(timeout=5)
