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


def test_the_structs_ctypes_passes_are_read_from_their_one_c_definition():
    """A field added to `struct call` in a copy of kernels.c changes its ctypes declaration with nothing else
    touched; a field of a type ctypes is not told about is an error, not a guess."""
    import ctypes
    source = native.SOURCE.read_text()
    assert [name for name, _ in native.CALL._fields_][:4] == ["m", "tokens", "feats", "starts"]
    assert dict(native.CALL._fields_)["B"] is ctypes.c_int and dict(native.CALL._fields_)["limit"] is ctypes.c_long
    grown = source.replace("    int nodes;", "    int nodes;\n    long extra; /* a new argument */", 1)
    fields = native.c_struct("call", grown)._fields_
    assert [f for f in fields if f[0] != "extra"] == native.CALL._fields_
    assert fields[[name for name, _ in fields].index("nodes") + 1] == ("extra", ctypes.c_long)
    assert dict(native.MODEL._fields_)["layers"] is ctypes.c_void_p and len(native.LAYER._fields_) == 16
    with pytest.raises(TypeError, match="struct call: no ctypes type for double scale"):
        native.c_struct("call", source.replace("    int nodes;", "    int nodes;\n    double scale;", 1))
