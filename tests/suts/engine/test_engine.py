"""One contract for whatever decodes a run's sequences: the in-process engine, a server's and Ray replicas' all are
Engines, and LoadGen's adapter refuses anything else in one line."""
from types import SimpleNamespace

import pytest

from serving.endpoint import HTTPEngine
from serving.replicas import RemoteEngine
from suts.engine.engine import Engine, LocalEngine


def test_the_three_engines_meet_the_contract():
    local = LocalEngine(object(), thread=False)  # a plug-in without `step`: no scheduler
    http = HTTPEngine(SimpleNamespace(), 4, print)
    idle = SimpleNamespace(stall_timeout_s=1.0, live=lambda: [], get=lambda refs: refs)  # replicas with none live
    remote = RemoteEngine(idle, 4, None, print)
    try:
        assert all(isinstance(engine, Engine) for engine in (local, http, remote))
        assert (local.batch, http.batch, remote.batch) == (1, 4, 4)
    finally:
        remote.close()
    assert not isinstance(SimpleNamespace(batch=1, submit=print, halt=print), Engine)  # no busy_since, no close


def test_the_adapter_refuses_a_host_whose_engine_is_no_engine(monkeypatch):
    from scenarios import adapter

    class Host:
        def engine(self, max_batch, token_budget, on_error):
            return SimpleNamespace(batch=1, busy_since=None, submit=print)
    monkeypatch.setattr(adapter, "host_of", lambda sut: Host())
    with pytest.raises(TypeError, match="^SimpleNamespace is no Engine .*: it lacks halt, close$"):
        adapter.SUTAdapter(object(), [], 8, None)
