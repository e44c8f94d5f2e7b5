# Every target creates/updates the local virtual environment on first use: nothing else to install.
PYTHON ?= python3
TORCH ?= 2.13.0
VENV := .venv
PY := $(VENV)/bin/python
SUT ?= spec
SCENARIO ?= SingleStream
MODE ?= performance
PROFILE ?= quick
GAMMA ?= 4
TARGET ?=
DRAFT ?=
ARGS ?=
RUN_ARGS = --sut $(SUT) --scenario $(SCENARIO) --profile $(PROFILE) --gamma $(GAMMA) \
	$(if $(TARGET),--target $(TARGET)) $(if $(DRAFT),--draft $(DRAFT)) $(ARGS)

.PHONY: run accuracy test bench models prompts clean-venv

$(VENV)/.installed: setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed  ## one LoadGen test: make run SUT=spec SCENARIO=SingleStream [MODE= PROFILE= TARGET= DRAFT= GAMMA= ARGS=]
	$(PY) -m mlperf run $(RUN_ARGS) --mode $(MODE)

accuracy: $(VENV)/.installed  ## accuracy mode (every sample once), then the checker
	$(PY) -m mlperf run $(RUN_ARGS) --mode accuracy

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

models: $(VENV)/.installed  ## trains the shipped default pair (hours on 2 cores; resumable)
	$(PY) -m mlperf.train draft
	$(PY) -m mlperf.train target

prompts: $(VENV)/.installed  ## regenerates the shipped prompt dataset from the held-out files
	$(PY) -m mlperf.data

clean-venv:
	rm -rf $(VENV)

bench: $(VENV)/.installed  ## every SUT on the same prompts in one process: tokens/s, speedups, acceptance
	$(PY) -m mlperf bench
