# Every target creates/updates the local virtual environment on first use: nothing else to install. `make help`
# lists the targets. Through make a failing command exits 2 whatever its own code; `.venv/bin/python -m mlperf ...`
# keeps its 0 (pass), 1 (a verdict failed), 2 (bad input or a crash).
PYTHON ?= python3
TORCH ?= 2.13.0
# torch's CPU wheel unless nvidia-smi lists an NVIDIA GPU (then PyPI's CUDA build); TORCH_INDEX=URL picks another
# index, TORCH_INDEX= (empty) PyPI's default build anywhere
TORCH_INDEX ?= $(if $(shell nvidia-smi -L 2>/dev/null | grep '^GPU '),,https://download.pytorch.org/whl/cpu)
# whether an index answers within 5 s (a machine offline but for a mirror of its own takes the mirror's torch)
ANSWERS = import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/', timeout=5)
VENV := .venv
PY := $(VENV)/bin/python
# every setting left empty is the command line's default (scenarios/config.py: RunConfig), passed only when given
SUT ?=
SCENARIO ?=
MODE ?=
PROFILE ?=
GAMMA ?=
TARGET ?=
DRAFT ?=
HEAD ?=
TREE ?=
DRAFTER ?=
DEVICE ?=
QPS ?=
MAX_BATCH ?=
TOKEN_BUDGET ?=
REPLICAS ?=
RAY_ADDRESS ?=
ENDPOINT ?=
ENGINE ?=
ARGS ?=
GATE ?=
DEVICE_ARGS = $(if $(DEVICE),--device $(DEVICE))
RUN_ARGS = $(SUT_ARG) $(if $(SCENARIO),--scenario $(SCENARIO)) $(if $(PROFILE),--profile $(PROFILE)) $(if $(GAMMA),--gamma $(GAMMA)) $(DEVICE_ARGS) \
	$(if $(TARGET),--target "$(TARGET)") $(if $(DRAFT),--draft "$(DRAFT)") $(if $(HEAD),--head "$(HEAD)") $(if $(TREE),--tree $(TREE)) $(if $(DRAFTER),--drafter $(DRAFTER)) \
	$(if $(QPS),--qps $(QPS)) \
	$(if $(MAX_BATCH),--max-batch $(MAX_BATCH)) $(if $(TOKEN_BUDGET),--token-budget $(TOKEN_BUDGET)) $(REPLICA_ARGS) $(ARGS)
# with ENDPOINT (a server as the SUT) SUT only names the results (default results/http)
SUT_ARG = $(if $(SUT),--sut $(SUT)) $(if $(ENDPOINT),--endpoint $(ENDPOINT)) \
	$(if $(ENGINE),--engine $(ENGINE))
REPLICA_ARGS = $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS))

LAB ?= 1
CHECK ?=

PORT ?=
HOST ?=

.PHONY: help docs whatif smoke-avx2 serve engines soak lab grade submit grade-all class-bank run accuracy compliance submission check-submission peers test test-fast check-arm smoke report profile peaks bench sweep pareto scale qps-sweep models cards prompts clean-venv
comma := ,
.DEFAULT_GOAL := help

help:  ## every target with what it does (the default goal)
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):[^#]*## /\1\t/' | \
		awk -F '\t' '{ printf "  make %-18s %s\n", $$1, $$2 }'

$(VENV)/.installed: setup.py Makefile  ## what a run needs: torch, LoadGen and the package (no test tools, no Ray)
	@echo "setting up $(VENV) (once): python venv, torch $(TORCH), LoadGen and this package ..."
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "  torch $(TORCH)$(if $(TORCH_INDEX), with $(TORCH_INDEX) where it answers (TORCH_INDEX=: PyPI's build)) ..."
	$(PY) -m pip install -q torch==$(TORCH) $(if $(TORCH_INDEX),$$($(PY) -c "$(ANSWERS)" "$(TORCH_INDEX)" 2>/dev/null && echo --extra-index-url $(TORCH_INDEX)))
	@echo "  mlcommons-loadgen, numpy, pandas, ... and this package ..."
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed  ## the tests' tools (pytest, ruff), transformers (bench's rows) and Ray
	@echo "  the test extras: pytest, ruff, transformers, ray ..."
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed  ## one LoadGen test: make run SUT=spec SCENARIO=SingleStream [MODE=performance|accuracy|compliance|find-peak PROFILE= QPS= MAX_BATCH= TOKEN_BUDGET= TARGET= DRAFT= GAMMA= TREE= DEVICE=cuda REPLICAS=N RAY_ADDRESS= ENDPOINT=URL ENGINE=llama-server ARGS=]
	$(PY) -m mlperf run $(RUN_ARGS) $(if $(MODE),--mode $(MODE))

accuracy: $(VENV)/.installed  ## accuracy mode (every sample once), then the gate against the baseline's outputs
	$(PY) -m mlperf run $(RUN_ARGS) --mode accuracy

compliance: $(VENV)/.installed  ## MLPerf's LLM compliance test TEST06: PASS or FAIL (non-zero exit)
	$(PY) -m mlperf run $(RUN_ARGS) --mode compliance

$(VENV)/.installed-submission: $(VENV)/.installed  ## PyYAML, which MLCommons' submission checker imports
	$(PY) -m pip install -q -e '.[submission]'
	touch $@

submission: $(VENV)/.installed  ## an MLPerf submission tree from the newest VALID/PASS runs: make submission ORG=name OUT=dir [ARGS="--sut S --scenario X --division open --mlc DIR"]
	$(PY) -m mlperf submission --org "$(ORG)" --out "$(OUT)" $(if $(TARGET),--target "$(TARGET)") $(if $(DRAFT),--draft "$(DRAFT)") $(ARGS)

check-submission: $(VENV)/.installed-submission  ## MLCommons' own checker over a tree: make check-submission OUT=dir [ARGS="--mlc DIR"]
	$(PY) -m mlperf check-submission "$(OUT)" $(ARGS)

TEST_JOBS ?= 2
test: $(VENV)/.installed-test  ## the test suite (TEST_JOBS processes, then the time-judged tests alone), then the smoke gate against the fp16 baseline, and again over AVX2 kernels on an AVX-512 CPU (what CI runs)
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "not alone" tests
	$(PY) -m pytest -q -m alone tests
	$(PY) -m mlperf smoke $(if $(GATE),--gate $(GATE))
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then $(MAKE) --no-print-directory smoke-avx2; \
	else echo "smoke-avx2: not run again (no AVX-512 in /proc/cpuinfo: the smoke above ran this CPU's own AVX2 kernels or none)"; fi

check-arm: $(VENV)/.installed-test  ## the C kernels cross-compiled for aarch64, its sums checked under qemu against this machine's (needs gcc-aarch64-linux-gnu qemu-user; ~15 s)
	@command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
		{ echo "check-arm needs aarch64-linux-gnu-gcc and qemu-aarch64: apt-get install gcc-aarch64-linux-gnu qemu-user"; exit 1; }
	$(PY) -m pytest -q --durations=1 tests/suts/fast/test_packed.py -k aarch64

test-fast: $(VENV)/.installed-test  ## the unit tests (model, SUTs, roofline) for the edit-test loop: a few minutes
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "not alone" tests/mlperf tests/suts tests/roofline tests/test_layers.py

smoke: $(VENV)/.installed  ## baseline vs spec vs spec-int8 through LoadGen: identical tokens, spec decodes at >= GATE x the fp16 baseline [ARGS="--sut pkg.mod:Class"]
	$(PY) -m mlperf smoke $(if $(GATE),--gate $(GATE)) $(ARGS)

smoke-avx2: $(VENV)/.installed  ## the smoke gate with kernels built for AVX2 (MLPERF_MARCH=x86-64-v3), where this CPU runs them (make test runs it on AVX-512 CPUs)
	@if grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw f16c /proc/cpuinfo; then \
		MLPERF_MARCH=x86-64-v3 $(PY) -m mlperf smoke $(if $(GATE),--gate $(GATE)) $(or $(ARGS),--sut spec); \
	else echo "smoke-avx2: skipped (no AVX2 and F16C in /proc/cpuinfo: not an x86-64-v3 Linux machine)"; fi

serve: $(VENV)/.installed  ## our engine over an OpenAI-compatible API: make serve SUT=spec [PORT=8000 HOST=127.0.0.1 MAX_BATCH= GAMMA= ARGS="--api-key K --weights fp32"]
	$(PY) -m mlperf serve $(if $(SUT),--sut $(SUT)) $(if $(GAMMA),--gamma $(GAMMA)) $(DEVICE_ARGS) $(if $(TARGET),--target "$(TARGET)") \
		$(if $(DRAFT),--draft "$(DRAFT)") $(if $(MAX_BATCH),--max-batch $(MAX_BATCH)) $(if $(TOKEN_BUDGET),--token-budget $(TOKEN_BUDGET)) \
		$(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(ARGS)

engines: $(VENV)/.installed  ## engines side by side under LoadGen (fp16): spec in process, our server, llama-server plain and spec [ARGS="--no-peak --samples 32"]
	$(PY) -m mlperf engines $(if $(MAX_BATCH),--max-batch $(MAX_BATCH)) $(ARGS)

soak: $(VENV)/.installed  ## our server under 1,000 requests in 10 minutes, 10% malformed or disconnecting: answers and memory checked [ARGS=]
	$(PY) -m mlperf soak $(ARGS)

report: $(VENV)/.installed  ## HTML + Markdown report over every latest run in results/ (or RUNS="dir ...")
	$(PY) -m mlperf report $(RUNS)

profile: $(VENV)/.installed  ## where each phase's time goes: operators by kind against the roof, a row's cost by batch, then the SUTs' loops
	$(PY) -m mlperf profile $(ARGS)

peaks: $(VENV)/.installed  ## re-measure this machine's matmul FLOP/s and memory bandwidth (DEVICE=cuda: a GPU's, with its launch costs)
	$(PY) -m mlperf peaks $(DEVICE_ARGS) $(if $(DEVICE),--dtype float16)

models: $(VENV)/.installed  ## trains the shipped default pair (about 8 hours on 2 cores; resumable)
	$(PY) -m training.train draft
	$(PY) -m training.train target --steps 1500
	$(PY) -m training.train target --steps 2000  # resumes the run above to 2000 steps; the next two continue from it
	$(PY) -m training.train target --init mlperf/assets/models/target --lr 4e-4 --steps 6000 --stop-at 1600 --workdir runs/train-target-v2 --out runs/target-v2-1600
	$(PY) -m training.train target --init mlperf/assets/models/target --lr 4e-4 --steps 2600 --workdir runs/train-target-v2 --out mlperf/assets/models/target
	$(PY) -m training.train draft --init mlperf/assets/models/draft --distill mlperf/assets/models/target --lr 5e-4 --steps 1000 --workdir runs/train-draft-distill --out mlperf/assets/models/draft
	$(PY) -m training.train draft --init mlperf/assets/models/draft --distill mlperf/assets/models/target --lr 5e-4 --steps 2000 --workdir runs/train-draft-distill2 --out mlperf/assets/models/draft

cards: $(VENV)/.installed  ## rewrites the evaluation section of both model cards: held-out loss on the same windows, continuations
	$(PY) -m training.evaluate

prompts: $(VENV)/.installed  ## regenerates the shipped prompt dataset from the held-out files
	$(PY) -m mlperf.data

docs: $(VENV)/.installed  ## writes docs/cli.md again from the command line's parsers (a test fails when they differ)
	$(PY) -m commands.reference

clean-venv:  ## removes .venv: the next target sets it up again
	rm -rf $(VENV)

peers: $(VENV)/.installed  ## builds llama.cpp once (pinned llama-cpp-python source, about 10 minutes on 2 cores) for bench's llama.cpp rows, checks each tool at F32, F16 and Q8_0, rebuilds once without native flags or AMX where one dies of a signal
	$(PY) -m mlperf peers

bench: $(VENV)/.installed-test  ## every SUT on the same prompts in one process: tokens/s, speedups, acceptance [DEVICE=cuda ARGS=]
	$(PY) -m mlperf bench $(DEVICE_ARGS) $(ARGS)

WHATIF ?= sweep
whatif: $(VENV)/.installed  ## where speculation pays here: spec at set synthetic acceptance vs the fp16 baseline per pair and gamma, through LoadGen, beside the roofline's prediction [WHATIF=sweep|seed TARGET= DRAFT= ARGS="--pair gpt2-large"]
	$(PY) -m mlperf whatif --preset $(WHATIF) $(if $(TARGET),--target "$(TARGET)") $(if $(DRAFT),--draft "$(DRAFT)") $(ARGS)

lab: $(VENV)/.installed  ## start lab LAB=N: copies its starter files into mylabs/ (never overwrites your work)
	$(PY) -m labs start $(LAB)

grade: $(VENV)/.installed  ## grade your lab LAB=N in mylabs/: a table of checks with points, mylabs/labN-grade.json, exit 0 on full marks [CHECK=name: one check]
	$(PY) -m labs grade $(LAB) $(if $(CHECK),--check "$(CHECK)") $(ARGS)

submit: $(VENV)/.installed  ## the zip to hand in for lab LAB=N: mylabs/labN-submission.zip (your code and answers)
	$(PY) -m labs submit $(LAB)

class-bank: $(VENV)/.installed  ## instructors: every lab's bank graded as a class alone, then busy: the same grades (~4 min)
	MLPERF_CLASS_BANK=1 $(PY) -m pytest -q -s tests/labs/test_class_bank.py $(ARGS)

grade-all: $(VENV)/.installed  ## instructors: grade a class, DIR with one folder (or .zip) per student [LAB=N JOBS=2 ARGS="--out DIR --regrade"]
	$(PY) -m labs grade-all $(LAB) "$(DIR)" --jobs $(or $(JOBS),1) $(ARGS)

qps-sweep: $(VENV)/.installed  ## baseline, spec and spec-auto through LoadGen Server at rising loads: p99 TTFT/TPOT, goodput [ARGS=]
	$(PY) -m mlperf qps-sweep $(ARGS)

sweep: $(VENV)/.installed  ## every SUT family through LoadGen Offline at batch 1..64: where each stops paying [DEVICE=cuda ARGS=]
	$(PY) -m mlperf sweep $(DEVICE_ARGS) $(REPLICA_ARGS) $(ARGS)

pareto: $(VENV)/.installed  ## Pareto curves: per-user against total tokens/s at 8 concurrencies through LoadGen, where speculation stops paying [SUT= ENDPOINT=URL ARGS=]
	$(PY) -m mlperf pareto $(DEVICE_ARGS) $(if $(SUT),--sut baseline --sut $(SUT)) $(if $(ENDPOINT),--endpoint $(ENDPOINT)) $(ARGS)

scale: $(VENV)/.installed  ## Offline tokens/s on 1,2,... Ray replicas beside one process on the same cores [SUT= REPLICAS=1,2,4 RAY_ADDRESS= ARGS=]
	$(PY) -m mlperf scale $(if $(SUT),--sut $(SUT)) --replica-counts $(or $(REPLICAS),1$(comma)2) $(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS)) $(DEVICE_ARGS) $(ARGS)
