# edgesched: the two commands a newcomer needs are `make sim` (the main job) and `make test`.
# Both set up everything from nothing: a virtual environment in .venv with the project and
# its dev tools installed from pyproject.toml.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup sim test lint typecheck unit bench clean

$(STAMP): pyproject.toml $(shell find core edge sync central policies fieldtest edgesched -name '*.py' -newer pyproject.toml 2>/dev/null)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# strict editable mode: a link tree that maps core/ -> edgesched.core etc., which mypy follows
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

setup: $(STAMP)

## The main job: simulate the campus day with every strategy, print the table, write a plot.
sim: setup
	$(BIN)/edgesched sim --scenario campus --plot out/campus-day.png --output out/campus-day.json

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy core edge sync central policies fieldtest edgesched tests bench

unit: setup
	$(BIN)/pytest

## Everything CI checks.
test: lint typecheck unit

bench: setup
	$(BIN)/python bench/bench_placement.py
	$(BIN)/python bench/bench_simulator.py

clean:
	rm -rf $(VENV) build out .pytest_cache .mypy_cache .ruff_cache .hypothesis
