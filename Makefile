# The two commands the README promises: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SPEC ?= examples/cluster.yaml
# Run as root, the servers run as an unprivileged user, which cannot enter a checkout under /root (0700):
# root's demo keeps its state in /var/lib/opsctl/demo instead of examples/.opsctl.
DEMO_STATE := $(if $(filter 0,$(shell id -u)),--state-dir /var/lib/opsctl/demo,)
export ORDERS_REDIS_PASSWORD ?= demo-only-$(shell whoami)-change-me-0123456789

.PHONY: venv dev demo demo-down test test-fast test-py310 partitions lint typecheck bench clean system-deps

$(BIN)/opsctl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip uninstall -q -y opsctl 2>/dev/null || true  # this checkout's old distribution name (now opsctl-redis)
	$(BIN)/pip install -q -e .
	touch $@

# The tests drive provider: ansible too, so they install its extra (ansible-runner, ansible-core, paramiko).
$(VENV)/.dev: $(BIN)/opsctl
	$(BIN)/pip install -q -e '.[dev,ansible]'
	touch $@

venv: $(BIN)/opsctl

dev: $(VENV)/.dev

demo: venv
	$(BIN)/opsctl apply -f $(SPEC) --auto-approve $(DEMO_STATE)
	$(BIN)/opsctl status -f $(SPEC) $(DEMO_STATE)

demo-down: venv
	$(BIN)/opsctl destroy -f $(SPEC) --auto-approve --purge $(DEMO_STATE)

system-deps:
	./scripts/system-deps.sh

# Runs everything, then fails if any part failed, so one lint slip does not hide the test results.
# Four workers on two cores: the live tests mostly wait on their servers (load 0.7-3 with two workers, 29 min);
# each file stays on one worker (loadfile).
TEST_WORKERS ?= 4
test: dev system-deps
	@rc=0; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --durations=40 -m "not soak and not second_flavor" tests || rc=1; \
	$(BIN)/ruff check opsctl tests bench || rc=1; \
	$(BIN)/mypy opsctl || rc=1; \
	exit $$rc

# The unit tests only (no server started, no socket to one: tests/conftest.py fails a test that does so unmarked).
test-fast: dev
	$(BIN)/pytest -n 2 --dist loadfile -m "not integration and not remote and not soak" tests

# The long and timing-sensitive fault runs (network partitions): bench/partitions.py measures more of them. Also the
# second flavor of heavy live tests whose flavor is not what they test (marker second_flavor, left out of make test).
partitions: dev system-deps
	$(BIN)/pytest -v -m "soak or second_flavor" tests

# The unit tests on the lowest Python that requires-python claims (3.10), in their own venv: PY310=/path/to/python
# picks the interpreter, else the first python3.10 on PATH or under pyenv that runs. None found: skipped, except
# in CI (CI=true), where it fails.
VENV310 := $(VENV)/py310
test-py310:
	@py="$(PY310)"; \
	if [ -z "$$py" ]; then for candidate in python3.10 $(HOME)/.pyenv/versions/3.10*/bin/python; do \
	  if "$$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then \
	    py="$$candidate"; break; fi; done; fi; \
	if [ -z "$$py" ]; then echo "test-py310: no Python 3.10 found (set PY310=/path/to/python3.10)" >&2; \
	  [ "$${CI:-}" = true ] && exit 1; exit 0; fi; \
	if [ ! -x $(VENV310)/bin/python ] || [ pyproject.toml -nt $(VENV310)/.installed ]; then \
	  "$$py" -m venv --clear $(VENV310) && $(VENV310)/bin/pip install -q --upgrade pip && \
	  $(VENV310)/bin/pip install -q -e '.[ansible,s3]' 'pytest>=8' 'pytest-xdist>=3.5' 'jsonschema>=4' && \
	  touch $(VENV310)/.installed || exit 1; fi; \
	$(VENV310)/bin/python -m pytest -q -n 2 --dist loadfile -m "not integration and not remote" tests \
	  --deselect tests/test_remote_units.py::test_playbooks_pass_syntax_check_and_lint  # linting: make test's job

lint: dev
	$(BIN)/ruff check opsctl tests bench
	$(BIN)/mypy opsctl

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
