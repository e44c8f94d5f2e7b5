"""`make peers`' check and its one rebuild, on a stand-in build: tools that die of SIGILL at one precision (as
llama.cpp's native build does where a VM refuses AMX tiles), hang or print nothing."""
import sys
from pathlib import Path

import pytest

from commands import peer_build, peers

TOOL = """#!/bin/sh
dir=$(dirname "$0"); model=""
while [ $# -gt 0 ]; do [ "$1" = "-m" ] && model="$2"; shift; done
fails=$(cat "$dir/fails")
if [ -n "$fails" ] && case "$model" in *"$fails"*) true;; *) false;; esac; then
  case $(cat "$dir/how") in ill) kill -ILL $$;; hang) exec sleep 30;; silent) exit 0;; esac
fi
printf 'abcd'
printf '%s' '{log}' >&2
"""
PLAIN_LOG = "prompt eval time = 1.00 ms / 5 tokens\n       eval time = 2.00 ms / 3 runs\n"
SPEC_LOG = "encoded 5 tokens in 0.001 seconds\ndecoded 4 tokens in 0.002 seconds\nn_drafted = 3\nn_accept = 2\n"
SERVER = f"""#!{sys.executable}
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
args = sys.argv[1:]
here = Path(sys.argv[0]).parent
fails, how = (here / "fails").read_text(), (here / "how").read_text()
if fails and fails in args[args.index("-m") + 1]:
    if how == "ill":
        os.kill(os.getpid(), signal.SIGILL)
    if how == "hang":
        time.sleep(30)  # until llama_server stops it
    sys.exit(0)

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.reply({{"status": "ok"}})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply({{"content": "abcd"}})

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """peers' paths under tmp_path and a stand-in compile: stand_in(native=..., portable=...) says which precision
    each build's tools fail at ("" for none) and how ("ill", "hang", "silent"); the builds' flags are listed."""
    build = tmp_path / "build"
    monkeypatch.setattr(peers, "HOME", tmp_path)
    monkeypatch.setattr(peers, "BUILD", build)
    for name, path in (("PLAIN", "llama-completion"), ("SPECULATIVE", "llama-speculative-simple"),
                       ("SERVER", "llama-server")):
        monkeypatch.setattr(peers, name, build / "bin" / path)
    monkeypatch.setattr(peers, "RUN_TIMEOUT_S", 2.0)
    monkeypatch.setattr(peers, "SERVER_START_S", 2.0)
    monkeypatch.setattr(peers, "convert", lambda checkpoint, precision: tmp_path / f"{Path(checkpoint).name}-"
                                                                                   f"{precision}.gguf")
    monkeypatch.setattr(peer_build, "fetch", lambda: None)
    builds, fails = [], {}

    def compile_tools(flags):
        builds.append(flags)
        (build / "bin").mkdir(parents=True, exist_ok=True)
        for path, text in ((peers.PLAIN, TOOL.replace("{log}", PLAIN_LOG)),
                           (peers.SPECULATIVE, TOOL.replace("{log}", SPEC_LOG)), (peers.SERVER, SERVER)):
            path.write_text(text)
            path.chmod(0o755)
        precision, how = fails["native" if flags == peer_build.NATIVE else "portable"]
        (build / "bin" / "fails").write_text(precision)
        (build / "bin" / "how").write_text(how)

    def configure(native=("", "ill"), portable=("", "ill")):
        fails.update(native=native, portable=portable)
        return builds
    monkeypatch.setattr(peer_build, "compile_tools", compile_tools)
    return configure


def test_a_tool_that_dies_of_sigill_has_the_build_made_again_once_without_native_flags(stand_in, tiny_pair, capsys):
    builds = stand_in(native=("Q8_0", "ill"))
    record = peer_build.build(str(tiny_pair / "target"), str(tiny_pair / "draft"))
    assert len(builds) == 2 and builds[0] == peer_build.NATIVE
    assert "-DGGML_NATIVE=OFF" in builds[1] and "-DGGML_AMX_INT8=OFF" in builds[1]
    assert record["rebuilt"] == "SIGILL in llama-completion (Q8_0)" and record["failed"] == {}
    assert "SIGILL in llama-completion (Q8_0) with the native build; rebuilding once" in capsys.readouterr().out
    assert "GGML_NATIVE=OFF" in peer_build.describe() and "rebuilt: SIGILL" in peer_build.describe()
    assert peer_build.build(str(tiny_pair / "target"), str(tiny_pair / "draft")) == record and len(builds) == 2


def test_what_still_fails_after_the_rebuild_is_recorded_and_said(stand_in, tiny_pair, monkeypatch):
    builds = stand_in(native=("F16", "ill"), portable=("F16", "ill"))
    monkeypatch.setattr(peers.RunConfig, "target", str(tiny_pair / "target"))  # main's: the shipped pair
    monkeypatch.setattr(peers.RunConfig, "draft", str(tiny_pair / "draft"))
    with pytest.raises(ValueError, match=r"cannot run llama-completion F16, llama-speculative-simple F16, "
                                         r"llama-server F16 on this machine"):
        peer_build.main()
    assert len(builds) == 2  # rebuilt once, not again
    failed = peer_build.read_record()["failed"]
    assert failed["llama-completion F16"] == "SIGILL in llama-completion"
    assert failed["llama-server F16"].startswith("SIGILL in llama-server before it answered")


@pytest.mark.parametrize("how, said", [("hang", "hung (no answer in 2 s)"), ("silent", "exit 0")])
def test_a_tool_that_hangs_or_prints_nothing_is_recorded_without_a_rebuild(stand_in, tiny_pair, how, said):
    builds = stand_in(native=("F32", how))
    record = peer_build.build(str(tiny_pair / "target"), str(tiny_pair / "draft"))
    assert len(builds) == 1 and record["rebuilt"] is None and record["native"]
    assert said in record["failed"]["llama-completion F32"] and "llama-completion F16" not in record["failed"]
