# Every target sets up (or refreshes) the virtual environment first, so a fresh machine needs
# nothing but python3.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train demo test test-slow bench clean

$(STAMP): setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,hf]'
	touch $(STAMP)

install: $(STAMP)

# The main job: a short real training run on the built-in default task, on CPU.
train: $(STAMP)
	$(PY) -m launchers.train --config=configs/grpo_addition.py

# Sampler demo: a tiny model generating a batch of completions.
demo: $(STAMP)
	$(PY) -m launchers.sample

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) benchmarks/rollout.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
