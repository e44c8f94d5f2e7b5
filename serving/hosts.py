"""The SUT a run measures, wherever it runs: built in this process, Ray replicas of it, or a server at a URL."""
from contextlib import contextmanager

from mlperf.env import set_threads
from mlperf.model import GPTConfig
from scenarios.config import RunConfig
from scenarios.hosted import built_here
from serving.replicas import replicas


@contextmanager
def open_sut(cfg: RunConfig, eos_id: int | None, config: GPTConfig):
    """The server at `cfg.endpoint`, `cfg.replicas` Ray replicas of the SUT (the driver's torch threads then one
    replica's, at which the roofline's peaks are measured), or the SUT built in this process, for the block."""
    if cfg.endpoint:
        from serving.endpoint import endpoint  # imported here: a run in process never loads the HTTP client
        with endpoint(cfg, eos_id, config) as served:
            print(f"SUT {cfg.sut}: the {served.engine_name} server at {served.url}, model {served.model!r}",
                  flush=True)
            yield served
        return
    if not cfg.replicas:
        with built_here(cfg, eos_id, config) as sut:
            yield sut
        return
    with replicas(cfg, eos_id, config) as pool:
        set_threads(pool.threads)
        print(f"{len(pool.members)} replicas of {cfg.sut} on Ray ({pool.address}), {pool.threads} threads each: "
              + ", ".join(f"{m.info['host']} node {m.info['node'][:6]} {m.info['device']}" for m in pool.members),
              flush=True)
        yield pool
