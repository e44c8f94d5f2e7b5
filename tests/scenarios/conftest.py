import pytest

from tests.helpers import run_cli


@pytest.fixture
def mlperf_run(tiny_pair, tmp_path):
    def call(*args, samples=16, tokens=8):
        return run_cli(tiny_pair, tmp_path / "results", *args, samples=samples, tokens=tokens, cwd=tmp_path)
    call.results = tmp_path / "results"
    return call
