# qmalloc front door: every target installs what it needs (tools/deps.sh), then drives CMake and mtbench.
BUILD     ?= build
JOBS      ?= $(shell nproc)
CMAKE_ARGS ?=
VENV      ?= .venv

.PHONY: all deps test bench asm fastpath clean distclean

all: deps
	@cmake -S . -B $(BUILD) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@tools/deps.sh build

# Every test: unit, API, stress (smoke size), preload, mtbench's own tests.
test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# Disassembly of the two fast paths (see docs/fastpath.md).
asm: all
	@tools/fastpath.sh asm $(BUILD)/libqmalloc.so

# Instructions per malloc+free pair under callgrind, qmalloc against the installed peers.
fastpath: all
	@tools/deps.sh fastpath
	@tools/fastpath.sh count $(BUILD)/libqmalloc.so

clean:
	rm -rf $(BUILD)

distclean: clean
	rm -rf $(VENV) bench/results

-include bench/bench.mk
