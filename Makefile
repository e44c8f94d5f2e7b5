# Every target creates/updates the local virtual environment on first use: nothing else to install.
PYTHON ?= python3
TORCH ?= 2.13.0
VENV := .venv
PY := $(VENV)/bin/python
SUT ?= spec
SCENARIO ?= SingleStream

.PHONY: run test bench models prompts clean-venv

$(VENV)/.installed: setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(PY) -m mlperf generate  # until the SUTs and the LoadGen harness land: a greedy continuation

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
