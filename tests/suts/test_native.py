import pytest

from suts import native
from suts.native import rows_kernel


@pytest.mark.parametrize("env, line", [({"MLPERF_ROWS_KERNEL": "0"}, "MLPERF_ROWS_KERNEL=0"),
                                       ({"CC": "no-such-compiler"}, "no C compiler"),
                                       ({"CC": "false"}, "false could not compile kernels.c")])
def test_without_the_kernel_one_line_says_why(monkeypatch, capsys, tmp_path, env, line):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert rows_kernel.__wrapped__() is None
    err = capsys.readouterr().err
    assert line in err and "every forward runs through the modules" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built left behind


def test_the_kernel_is_compiled_once_per_source_compiler_cpu_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if rows_kernel.__wrapped__() is None:
        pytest.skip("the small-row kernel does not build here")
    built = list(tmp_path.rglob("rows-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert rows_kernel.__wrapped__() is not None and built[0].stat().st_mtime_ns == stamp
    monkeypatch.setattr(native, "FLAG_SETS", ([],))  # other flags: a library of their own, not the cached one
    assert rows_kernel.__wrapped__() is not None and len(list(tmp_path.rglob("rows-*.so"))) == 2
