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

# Install under $(DESTDIR)$(PREFIX), and remove exactly that again (cmake/install.cmake lists the files).
PREFIX    ?= /usr/local
.PHONY: install uninstall
install: all
	@DESTDIR=$(if $(DESTDIR),$(abspath $(DESTDIR))) cmake --install $(BUILD) --prefix $(abspath $(PREFIX))

uninstall: all
	@DESTDIR=$(if $(DESTDIR),$(abspath $(DESTDIR))) cmake -DQM_BUILD=$(abspath $(BUILD)) -DQM_PREFIX=$(abspath $(PREFIX)) -P cmake/uninstall.cmake

clean:
	rm -rf $(BUILD)

distclean: clean
	rm -rf $(VENV) bench/results

-include bench/bench.mk
