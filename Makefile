# The README's two commands are `make demo` and `make test`; both set up what they need first.
#
# Two tracks, each in its own environment:
#   current (the default): Python 3.12, TensorFlow 2.21 with tf_keras, in .venv
#   tff: Python 3.11, TensorFlow 2.14.1, tensorflow-federated 0.87, in .venv-tff
# `make test` runs the whole suite on the current track (tests marked `tff` aside), the tests
# marked `tff` on the tff track, then builds the documentation site with `mkdocs build --strict`.

VENV := .venv
VENV_TFF := .venv-tff
BIN := $(VENV)/bin
BIN_TFF := $(VENV_TFF)/bin
PIP_FLAGS := --disable-pip-version-check -q
PYTEST_ARGS ?=

# $(call find_python,3.12): a working pythonX.Y: a plain one on PATH, else pyenv's (whose shim runs
# only when pyenv is told the version), else nothing.
find_python = $(shell \
  if python$(1) -c "" >/dev/null 2>&1; then command -v python$(1); \
  elif command -v pyenv >/dev/null 2>&1 && p="$$(pyenv prefix $(1) 2>/dev/null)" && [ -x "$$p/bin/python$(1)" ]; then \
    echo "$$p/bin/python$(1)"; fi)
ifndef PYTHON_CURRENT
PYTHON_CURRENT := $(call find_python,3.12)
endif
ifndef PYTHON_TFF
PYTHON_TFF := $(call find_python,3.11)
endif

.PHONY: install install-tff demo test test-fast test-current test-tff docs docs-serve bench lint lock lock-tff wheel clean

install: $(VENV)/.tensorfleet-installed
install-tff: $(VENV_TFF)/.tensorfleet-installed

# $(call make_venv,DIR,PYTHON,X.Y,TRACK): DIR holds a venv of Python X.Y (an older one is replaced).
define make_venv
	@test -n "$(2)" || { echo "tensorfleet: no Python $(3) found for the $(4) track. Install python$(3) (or 'pyenv install $(3)'), or name one: make PYTHON_$(shell echo $(4) | tr a-z A-Z)=/path/to/python$(3)" >&2; exit 2; }
	@if [ -x $(1)/bin/python ] && ! $(1)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$(3)".split("."))))'; then \
	  echo "tensorfleet: $(1) is not Python $(3); making it anew"; rm -rf $(1); fi
	@test -x $(1)/bin/python || $(2) -m venv $(1)
endef

# Each re-runs only when its lock or the package metadata change.
$(VENV)/.tensorfleet-installed: requirements/current.txt setup.cfg pyproject.toml
	$(call make_venv,$(VENV),$(PYTHON_CURRENT),3.12,current)
	$(BIN)/python -m pip $(PIP_FLAGS) install -r requirements/current.txt
	$(BIN)/python -m pip $(PIP_FLAGS) install --no-deps --no-build-isolation -e .
	@touch $@
	@echo "tensorfleet: current track ready in $(VENV) ($$($(BIN)/python -c 'import sys, importlib.metadata as m; print("Python", sys.version.split()[0], "TensorFlow", m.version("tensorflow"))'))"

$(VENV_TFF)/.tensorfleet-installed: requirements/tff.txt requirements/tff-nodeps.txt setup.cfg pyproject.toml
	$(call make_venv,$(VENV_TFF),$(PYTHON_TFF),3.11,tff)
	$(BIN_TFF)/python -m pip $(PIP_FLAGS) install -r requirements/tff.txt
	$(BIN_TFF)/python -m pip $(PIP_FLAGS) install --no-deps -r requirements/tff-nodeps.txt
	$(BIN_TFF)/python -m pip $(PIP_FLAGS) install --no-deps --no-build-isolation -e .
	@touch $@
	@echo "tensorfleet: tff track ready in $(VENV_TFF)"

demo: install
	$(BIN)/python -m tensorfleet.demo

# Both tracks and the site's build run even when one fails; the target fails if any did. Each track
# lists its slowest tests, so that a run shows where the suite's time goes. The build
# comes last: the suite's run of the tutorials keeps the pictures the site shows, so it draws none.
#
# By default (CI's run too) the current track runs in two pytest-xdist workers (--dist loadfile keeps a module's
# tests, and so their fixtures, in one worker) and the tff track runs beside it, serially, its output printed after
# the current track's: alone it mostly waits on its TFF workers, and the current track runs under nice so those
# waits stay short. -n 2, not -n auto: the project's machines have 2 cores. On 2026-12-06 (2-core AMD EPYC):
# current 30:35 serially, 20:02 to 27:52 in two workers; tff 3:42 to 4:27 serially; the whole make test 23:28 to
# 28:09 this way (the last two runs, 24:42 and 28:09, as the default), about 35 minutes one track after the other. Under this load gRPC's epoll1 poller can abort a
# launched task ("epoll_wait error: Bad file descriptor"): a test that fails with that line, and only that, runs
# once more (setup.cfg's [tool:pytest]; the summary names it under "rerun test summary info").
# Serially, one track after the other: make test XDIST= TRACKS_AT_ONCE=0. XDIST_TFF="-n 2 --dist loadfile" runs
# the tff track in two workers.
XDIST ?= -n 2 --dist loadfile
XDIST_TFF ?=
TRACKS_AT_ONCE ?= 1
test: install install-tff
	@case "$(TRACKS_AT_ONCE)" in 0|1) ;; *) echo "tensorfleet: TRACKS_AT_ONCE must be 1 (the tracks at once)" \
	  "or 0 (one after the other). Received: TRACKS_AT_ONCE=$(TRACKS_AT_ONCE)" >&2; exit 2;; esac; \
	status=0; tff_log=$$(mktemp "$${TMPDIR:-/tmp}/tensorfleet-tff-track.XXXXXX"); \
	trap 'rm -f "$$tff_log" "$$tff_log.rc"' EXIT; \
	tff_track() { $(BIN_TFF)/python -m pytest -m tff $(XDIST_TFF) --durations=10 $(PYTEST_ARGS); }; \
	if [ "$(TRACKS_AT_ONCE)" = 1 ]; then \
	  echo "== tff track, started beside the current track (its output follows the current track's):" \
	       "$(BIN_TFF)/python -m pytest -m tff"; \
	  { tff_track > "$$tff_log" 2>&1; echo $$? > "$$tff_log.rc"; } & tff_pid=$$!; \
	fi; \
	echo "== current track: $(BIN)/python -m pytest -m 'not tff'"; \
	nice -n 5 $(BIN)/python -m pytest -m "not tff" $(XDIST) --durations=25 $(PYTEST_ARGS) || status=$$?; \
	echo "== tff track: $(BIN_TFF)/python -m pytest -m tff"; \
	if [ "$(TRACKS_AT_ONCE)" = 1 ]; then \
	  wait $$tff_pid; cat "$$tff_log"; tff_status=$$(cat "$$tff_log.rc" 2>/dev/null || echo 1); \
	  [ "$$tff_status" = 0 ] || status=$$tff_status; \
	else \
	  tff_track || status=$$?; \
	fi; \
	echo "== docs: $(BIN)/mkdocs build --strict"; \
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet || status=$$?; \
	exit $$status

# The documentation site (mkdocs.yml, docs/) into site/, every warning an error; the pages' pictures
# are drawn by their own code (docs/hooks/pictures.py), which takes minutes the first time.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The site served on 127.0.0.1:8000, rebuilt on every change.
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

test-current: install
	$(BIN)/python -m pytest -m "not tff" $(XDIST) $(PYTEST_ARGS)

# The unit tier, for a change: the current track's tests that start no process (no clusters, launched
# jobs, workers, servers, example scripts or TFLite Micro runs: those are marked slow); a test that
# starts one fails here, asking to be marked slow (tests/conftest.py). Its tests run in two pytest-xdist workers:
# -n 2, not -n auto, because the project's machines have 2 cores and a third worker would only add its own
# TensorFlow to the same cores (each worker splits its CPU into the suite's 4 logical devices, tests/conftest.py).
# --dist loadfile hands out whole modules: a module's fixtures are built once, in one worker, and the modules whose
# tests share one server in order keep it. `make test` runs its current track the same way (above).
test-fast: install
	TENSORFLEET_TEST_TIER=fast $(BIN)/python -m pytest -n 2 --dist loadfile -m "not tff and not slow" --durations=15 $(PYTEST_ARGS)

test-tff: install-tff
	$(BIN_TFF)/python -m pytest -m tff $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/strategy_overhead.py

# pyflakes' checks (unused or undefined names, syntax) over the package, tests, benchmarks, examples.
lint: install
	$(BIN)/ruff check tensorfleet tests bench examples docs/hooks
	$(BIN)/python -m mypy  # the files setup.cfg's [mypy] lists

# The wheel users install: dist/tensorfleet-*.whl (pip install 'dist/tensorfleet-VERSION-py3-none-any.whl[all]').
wheel: install
	rm -rf dist build
	$(BIN)/python -m build --wheel --no-isolation --outdir dist .

# Regenerate a track's lock from its .in file in a scratch venv.
lock:
	rm -rf .lock-venv && $(PYTHON_CURRENT) -m venv .lock-venv
	.lock-venv/bin/pip $(PIP_FLAGS) install -r requirements/current.in
	{ echo "# Exact resolved current track (Python 3.12), generated from requirements/current.in by 'make lock'. Do not edit by hand."; \
	  .lock-venv/bin/pip freeze --exclude-editable; } > requirements/current.txt
	rm -rf .lock-venv

lock-tff:
	rm -rf .lock-venv && $(PYTHON_TFF) -m venv .lock-venv
	.lock-venv/bin/pip $(PIP_FLAGS) install -r requirements/tff.in
	{ echo "# Exact resolved tff track (Python 3.11), generated from requirements/tff.in by 'make lock-tff'. Do not edit by hand."; \
	  .lock-venv/bin/pip freeze | grep -viE '^(tensorflow[_-]federated|tflite[_-]micro)=='; } > requirements/tff.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) $(VENV_TFF) build dist site *.egg-info
