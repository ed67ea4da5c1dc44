# mtbench's make targets, included by the top-level Makefile:
#   make bench [ARGS="--preset paper --allocators system,jemalloc"]   build, run, print the summary
#   make venv                                                          the virtualenv mtbench plots with
# `make test` depends on the virtualenv too, because the driver's tests draw plots.
MTBENCH_REQUIREMENTS := bench/requirements.txt
MTBENCH_VENV_STAMP   := $(VENV)/.mtbench-requirements
ARGS ?=

.PHONY: venv bench

venv: $(MTBENCH_VENV_STAMP)

# Recreated when the pinned requirements change. Debian's python3 has the venv module but not
# ensurepip until python3-venv is installed, so that is what is checked (deps.sh only checks venv).
$(MTBENCH_VENV_STAMP): $(MTBENCH_REQUIREMENTS)
	@tools/deps.sh bench
	@python3 -c 'import ensurepip' 2>/dev/null || { echo "mtbench: installing python3-venv (python3 lacks ensurepip)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@echo "mtbench: installing $$(grep -v '^#' $(MTBENCH_REQUIREMENTS) | tr '\n' ' ')into $(VENV)"
	@$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r $(MTBENCH_REQUIREMENTS)
	@touch $@

test: venv

# The real family's programs are installed here rather than for `make test` (its smoke test
# needs python3 alone); one that cannot be installed is skipped, with the reason, by the family.
bench: all venv
	@tools/deps.sh bench
	@tools/deps.sh real || echo "mtbench: some programs of the real family could not be installed; they will be skipped"
	PYTHONPATH=bench $(VENV)/bin/python -m mtbench run $(ARGS)
