# Every target sets up (or refreshes) the virtual environment first, so a fresh machine needs
# nothing but python3.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test test-slow bench clean

$(STAMP): setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,hf]'
	touch $(STAMP)

install: $(STAMP)

# The main job: a short real training run on the built-in default task, on CPU.
train: $(STAMP)
	$(PY) -m launchers.train --config=configs/grpo_addition.py

test: $(STAMP)
	$(VENV)/bin/ruff check rljax tests launchers configs benchmarks scripts
	$(PY) -m pytest -q -n 2

# What the default suite leaves out: long end-to-end runs, the heavier notebooks, real models.
test-slow: $(STAMP)
	$(PY) -m pytest -q -n 2 -m slow

bench: $(STAMP)
	$(PY) -m benchmarks.rollout
	$(PY) -m benchmarks.update
	$(PY) -m benchmarks.memory
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m benchmarks.reshard

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
