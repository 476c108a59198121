# corral — the two commands of the README, and a few conveniences.
#
#   make run     install missing Debian packages, build, run corrald with config/corral.yaml
#   make test    install missing Debian packages, build, run every test (Release build, then the
#                ASan+UBSan build)
#   make fuzz    build the libFuzzer targets (clang) and run each for FUZZ_SECONDS (default 60);
#                fails if any finds a crash, hang, leak or out-of-memory input (scripts/fuzz)
#
# The CMake build trees are build/ (Release), build-asan/ (sanitizers) and build-fuzz/ (clang,
# libFuzzer, ASan+UBSan). Each is configured once and then only rebuilt incrementally, so a second
# `make test` compiles nothing.

MAKEFLAGS  += --no-print-directory

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc)
PYTHON     := /usr/bin/python3
CONFIG     ?= config/corral.yaml

.PHONY: all bootstrap build build-asan build-fuzz run test test-release test-asan fuzz clean

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

run: build
	exec $(BUILD)/daemon/corrald -c $(CONFIG)

test: test-release test-asan

test-release: build
	@scripts/run-tests $(BUILD) --python

test-asan: build-asan
	@scripts/run-tests $(ASAN_BUILD)

fuzz: build-fuzz
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz $(FUZZ_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
