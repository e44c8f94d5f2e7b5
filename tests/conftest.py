import os

import pytest
import torch

from mlperf.checkpoint import save_checkpoint
from mlperf.hf import write_tokenizer
from mlperf.model import GPT, GPTConfig
from tests.helpers import ANY_LOAD_CONF, FAST_CONF, SMALL, peaky_model, perturbed

if not torch.cuda.is_available():  # the Triton kernels' tests then run them on the CPU, under Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(1)  # tiny models run fastest on one thread, and a busy machine can't oversubscribe it
# the fused step untimed, in this process and the commands it starts: which path a test takes must not hang on the
# machine's speed (tests/suts/fast/test_fused.py times the choice)
os.environ.setdefault("MLPERF_ROWS_KERNEL", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: a verdict that rests on time (a speed check, a busy-machine check): "
                                       "`make test` runs these after the rest, with the machine to themselves")


@pytest.fixture(scope="session", autouse=True)
def shared_peaks(tmp_path_factory):
    """One peaks cache for every run the tests start (roofline.peaks.cache_in): the machine's peaks measured once in
    RECENT_S, as a sweep's runs share them, not 2-3 s over again in each run's fresh results folder."""
    os.environ.setdefault("MLPERF_PEAKS_CACHE", str(tmp_path_factory.getbasetemp() / "peaks.json"))


@pytest.fixture(scope="session")
def ray_cluster():
    """The address of a Ray cluster of two simulated nodes sharing this machine's cores, started once per test
    process and joined by the runs whose tests are not about Ray's own start and stop (a run's own local instance
    costs ~5 s to start and stop)."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cores = max(1, (os.cpu_count() or 2) // 2)
    cluster = cluster_utils.Cluster(initialize_head=True,
                                    head_node_args={"num_cpus": cores, "include_dashboard": False})
    cluster.add_node(num_cpus=cores)
    yield cluster.address
    cluster.shutdown()


TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=61, block_size=64)


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return GPT(TINY).eval()


@pytest.fixture(scope="session")
def pair():
    """A small target and a draft that accepts about 60% of its proposals."""
    target = peaky_model(SMALL, 0)
    return target, perturbed(target, 1, 0.06)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A byte-vocabulary target, a draft that agrees with it most of the time and a random EAGLE head for it,
    saved as checkpoints; LoadGen user confs for quick runs."""
    from dataclasses import replace
    from mlperf.model import EagleHead
    root = tmp_path_factory.mktemp("pair")
    target = peaky_model(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=256, block_size=512), 0)
    save_checkpoint(target, root / "target", dtype=torch.float32)
    write_tokenizer(root / "target", target.config.block_size)  # Hugging Face's files, as the shipped target has
    save_checkpoint(perturbed(target, 1, 0.03), root / "draft", dtype=torch.float32)
    torch.manual_seed(0)
    save_checkpoint(EagleHead(replace(target.config, n_layer=1)), root / "head", dtype=torch.float32)
    (root / "fast.conf").write_text(FAST_CONF)
    (root / "any-load.conf").write_text(ANY_LOAD_CONF)
    return root


@pytest.fixture(scope="session")
def eagle(pair, tmp_path_factory):
    """The small target, its saved checkpoint and an EAGLE head trained on its own sampled text for a few
    seconds (`python -m training.train head`'s code path): good enough to accept some drafts, far from all."""
    from dataclasses import replace
    from mlperf.checkpoint import load_head
    from suts.baseline import Baseline
    from suts.engine.sampling import SamplingParams
    from training.data import Data
    from training.train import DEFAULTS, train_head
    import numpy as np
    target, _ = pair
    root = tmp_path_factory.mktemp("eagle")
    save_checkpoint(target, root / "target", dtype=torch.float32)
    text = Baseline(target).generate_batch([[i] for i in range(32)], 120,
                                           [SamplingParams(1.0, seed=i) for i in range(32)])
    ids = np.array([t for r in text for t in r.tokens], dtype=np.int64)
    data = Data(ids[:3200], ids[3200:], str, None, "token", "the small target's own samples")
    cfg = replace(DEFAULTS["head"], steps=150, batch=8, seq=64, warmup=10, eval_every=75, eval_windows=8)
    train_head(cfg, root / "work", root / "head", root / "target", data, "test")
    return target, load_head(root / "head", target), root
