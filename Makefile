# The README's two commands are `make demo` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tensorfleet-installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

.PHONY: install demo test bench lint lock clean

install: $(STAMP)

# Re-runs only when the lock, the no-deps list or the package metadata change.
$(STAMP): requirements/lock.txt requirements/nodeps.txt setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements/lock.txt
	$(PIP) install --no-deps -r requirements/nodeps.txt
	$(PIP) install --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "tensorfleet: environment ready in $(VENV)"

demo: install
	$(BIN)/python -m tensorfleet.demo

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/strategy_overhead.py

# pyflakes' checks (unused or undefined names, syntax) over the package, tests, benchmarks, examples.
lint: install
	$(BIN)/ruff check tensorfleet tests bench examples

# Regenerates requirements/lock.txt from requirements/stack.in in a scratch venv.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q -r requirements/stack.in
	{ echo "# Exact resolved stack, generated from requirements/stack.in by 'make lock'. Do not edit by hand."; \
	  .lock-venv/bin/pip freeze | grep -viE '^(tensorflow[_-]federated|tflite[_-]micro)=='; } > requirements/lock.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) build *.egg-info
