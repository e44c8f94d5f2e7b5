"""`make engines` without llama.cpp or LoadGen: a peer engine that fails is one row, and the others are measured."""
from contextlib import contextmanager

import pytest

from commands import engines, peers
from scenarios.config import RunConfig


def test_a_failing_peer_engine_is_one_row_and_the_others_are_measured(tmp_path, monkeypatch):
    @contextmanager
    def started(name, cfg):
        if name.startswith("llama"):
            raise peers.PeerFailed("SIGILL in llama-server before it answered", "SIGILL")
        yield cfg
    monkeypatch.setattr(engines, "available", lambda: True)
    monkeypatch.setattr(engines, "started", started)
    monkeypatch.setattr(engines, "measure", lambda cfg, work, peak: {"SingleStream tokens/s": 100.0,
                                                                      "Offline tokens/s": 200.0})
    out = engines.engines(RunConfig(results=str(tmp_path)), ("in process", "llama-server"), peak=False)
    table = (out / "engines.csv").read_text()
    assert "SIGILL in llama-server" in table and "100.0" in table and (out / "engines.png").is_file()

    def ours_fail(name, cfg):
        raise peers.PeerFailed("not a peer's")
    monkeypatch.setattr(engines, "started", ours_fail)
    with pytest.raises(peers.PeerFailed):  # our own engine's failure fails the comparison
        engines.engines(RunConfig(results=str(tmp_path)), ("in process",), peak=False)
