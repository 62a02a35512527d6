# LLM Camp. First command: `make lab` (set up, then open the course in JupyterLab).
# Second command: `make test` (the test suite; CI runs exactly this).
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel by default (small, and what CI uses). On a CUDA machine, e.g.:
#   make lab TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.camp-installed

.PHONY: lab setup test build check run grade-demo clean

lab: setup ## set everything up and open JupyterLab on the released labs
	$(BIN)/camp list
	$(BIN)/jupyter lab --ServerApp.root_dir=labs $(if $(filter 0,$(shell id -u)),--allow-root)

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

test: setup ## the whole suite: library parity, build/run/grade round trips
	$(BIN)/python -m pytest -q

build: setup ## regenerate labs/ from solutions/
	$(BIN)/camp build

check: setup ## is labs/ up to date and free of solutions?
	$(BIN)/camp build --check

run: setup ## execute every solution notebook with the ci profile
	$(BIN)/camp run

clean:
	rm -rf runs grading .pytest_cache
