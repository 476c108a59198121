# corral — the two commands of the README, and a few conveniences.
#
#   make run     install missing Debian packages, build corrald and the corral command, run corrald
#                with config/corral.yaml in the foreground (Ctrl-C stops it; exit status 0)
#   make test    install missing Debian packages, build, run every test (Release build, then the
#                ASan+UBSan build)
#   make install install the Release build: `cmake --install build`, under PREFIX when given
#                (make install PREFIX=~/.local); DESTDIR is honoured
#   make fuzz    build the libFuzzer targets (clang) and run each for FUZZ_SECONDS (default 60);
#                fails if any finds a crash, hang, leak or out-of-memory input (scripts/fuzz)
#   make test-arm64  cross-build the engine suites, corrald and the CLI for aarch64 and run them
#                under qemu-aarch64-static on each ARM kernel path (scripts/test-arm64; installs
#                the cross tools first with scripts/bootstrap --arm64)
#
# The CMake build trees are build/ (Release), build-asan/ (sanitizers), build-fuzz/ (clang,
# libFuzzer, ASan+UBSan) and build-arm64/ (aarch64 cross build, Release). Each is configured once
# and then only rebuilt incrementally, so a second `make test` compiles nothing.

MAKEFLAGS  += --no-print-directory

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
ARM64_BUILD ?= build-arm64
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc)
PYTHON     := /usr/bin/python3
CONFIG     ?= config/corral.yaml

.PHONY: all bootstrap build build-asan build-fuzz run install test test-release test-asan test-arm64 \
        fuzz clean

all: build

bootstrap:
	@scripts/bootstrap

$(BUILD)/CMakeCache.txt: | bootstrap
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

$(ASAN_BUILD)/CMakeCache.txt: | bootstrap
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORRAL_SANITIZE=ON

$(FUZZ_BUILD)/CMakeCache.txt: | bootstrap
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORRAL_FUZZ=ON

build: bootstrap $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: bootstrap $(ASAN_BUILD)/CMakeCache.txt
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

build-fuzz: bootstrap $(FUZZ_BUILD)/CMakeCache.txt
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target corral_fuzzers

# Only what it runs is built. scripts/run-corrald gives corrald the terminal's Ctrl-C (make would
# otherwise die of the SIGINT, exit 130) and prints what to try once corrald answers.
run: bootstrap $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS) --target corrald corral
	@$(PYTHON) scripts/run-corrald $(BUILD)/daemon/corrald $(BUILD)/clients/cli/corral $(CONFIG)

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

test: test-release test-asan

test-release: build
	@scripts/run-tests $(BUILD) --python

test-asan: build-asan
	@scripts/run-tests $(ASAN_BUILD)

test-arm64:
	@scripts/bootstrap --arm64
	@JOBS=$(JOBS) scripts/test-arm64 $(ARM64_BUILD)

fuzz: build-fuzz
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz $(FUZZ_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(ARM64_BUILD)
