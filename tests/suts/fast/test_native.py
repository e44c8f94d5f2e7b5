import platform
from pathlib import Path

import pytest

from suts.fast import native
from suts.fast.native import rows_kernel


@pytest.mark.parametrize("env, line", [({"MLPERF_ROWS_KERNEL": "0"}, "MLPERF_ROWS_KERNEL=0"),
                                       ({"CC": "no-such-compiler"}, "no C compiler"),
                                       ({"CC": "false"}, "false could not compile kernels/")])
def test_without_the_kernel_one_line_says_why(monkeypatch, capsys, tmp_path, env, line):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert rows_kernel.__wrapped__() is None
    err = capsys.readouterr().err
    assert line in err and "every forward runs through the modules" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built left behind


def stand_in(tmp_path, refuses: str = "") -> tuple[str, object]:
    """A compiler that copies the loaded library instead of compiling (refusing any flag in `refuses`, as Apple's
    clang refuses -fopenmp), and the file its builds are counted in."""
    log, cc = tmp_path / "builds", tmp_path / "cc"
    cc.write_text(f"""#!/bin/sh
[ "$1" = --version ] && echo "stand-in cc 1.0" && exit 0
for a; do case " {refuses} " in *" $a "*) echo "unsupported option '$a'" >&2; exit 1;; esac; done
echo build >> {log}
for a; do [ "$prev" = -o ] && cp {rows_kernel()._name} "$a"; prev=$a; done
""")
    cc.chmod(0o755)
    return str(cc), lambda: len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.skipif(rows_kernel() is None, reason="the small-row kernel does not build here")
def test_the_kernel_is_compiled_once_per_source_compiler_cpu_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cc, builds = stand_in(tmp_path)
    monkeypatch.setenv("CC", cc)
    lib = rows_kernel.__wrapped__()
    assert lib is not None and builds() == 1 and lib.built == f"stand-in cc 1.0, {' '.join(native.FLAG_SETS[0])}"
    assert rows_kernel.__wrapped__() is not None and builds() == 1  # from the cache
    monkeypatch.setattr(native, "FLAG_SETS", ([],))  # other flags: a library of their own, not the cached one
    assert rows_kernel.__wrapped__() is not None and builds() == 2
    assert len(list((tmp_path / "cache").rglob(f"rows-*{native.SUFFIX}"))) == 2


@pytest.mark.skipif(rows_kernel() is None, reason="the small-row kernel does not build here")
def test_a_compiler_that_refuses_openmp_builds_without_it_and_one_line_says_so(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cc, builds = stand_in(tmp_path, refuses="-fopenmp")
    monkeypatch.setenv("CC", cc)
    monkeypatch.setattr(native, "FLAG_SETS", native.flag_sets("x86_64", "Linux"))
    lib = rows_kernel.__wrapped__()
    assert lib is not None and builds() == 1 and lib.built == "stand-in cc 1.0, -march=native"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fast path: {cc} refused -fopenmp; the kernels built with -march=native"]
    assert rows_kernel.__wrapped__().built == lib.built and builds() == 1  # the cache remembers which flags


def test_each_platform_tries_the_flags_its_compilers_take():
    assert native.flag_sets("x86_64", "Linux") == (["-march=native", "-fopenmp"], ["-march=native"], [])
    assert native.flag_sets("aarch64", "Linux") == (["-mcpu=native", "-fopenmp"], ["-mcpu=native"], [])
    assert native.flag_sets("arm64", "Darwin") == (["-mcpu=native"], [])  # no second OpenMP runtime beside torch's
    v3 = "-march=x86-64-v3"  # MLPERF_MARCH: a named level's kernels (AVX2's on an AVX-512 machine), the rest as before
    assert native.flag_sets("x86_64", "Linux", "x86-64-v3") == ([v3, "-fopenmp"], [v3], [])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64-v3 is an x86-64 level")
def test_a_named_instruction_level_builds_kernels_of_its_own():
    """MLPERF_MARCH=x86-64-v3 builds AVX2 kernels beside the native ones (a cache file of their own, kept in the
    kernels' cache as `make smoke-avx2`'s), and the process says which build it runs."""
    import os
    import subprocess
    import sys
    code = "from suts.fast.native import kernels_build, rows_kernel; print(kernels_build()); print(rows_kernel()._name)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MLPERF_MARCH": "x86-64-v3"},
                         capture_output=True, text=True, timeout=300)
    if "kernels off" in out.stdout:
        pytest.skip("no C compiler here")
    build, path = out.stdout.splitlines()[-2:]
    assert "-march=x86-64-v3" in build and "-march=native" not in build, out.stdout + out.stderr
    loaded = rows_kernel()
    assert Path(path).parent == native.cache_dir() and (loaded is None or Path(loaded._name) != Path(path))


def test_the_structs_ctypes_passes_are_read_from_their_one_c_definition():
    """A field added to `struct call` in a copy of kernels.h changes its ctypes declaration with nothing else
    touched; a field of a type ctypes is not told about is an error, not a guess."""
    import ctypes
    source = native.HEADER.read_text()
    assert [name for name, _ in native.CALL._fields_][:4] == ["m", "tokens", "feats", "starts"]
    assert dict(native.CALL._fields_)["B"] is ctypes.c_int and dict(native.CALL._fields_)["limit"] is ctypes.c_long
    grown = source.replace("    int nodes;", "    int nodes;\n    long extra; /* a new argument */", 1)
    fields = native.c_struct("call", grown)._fields_
    assert [f for f in fields if f[0] != "extra"] == native.CALL._fields_
    assert fields[[name for name, _ in fields].index("nodes") + 1] == ("extra", ctypes.c_long)
    assert dict(native.MODEL._fields_)["layers"] is ctypes.c_void_p and len(native.LAYER._fields_) == 16
    with pytest.raises(TypeError, match="struct call: no ctypes type for double scale"):
        native.c_struct("call", source.replace("    int nodes;", "    int nodes;\n    double scale;", 1))
