# corral — the two commands of the README, and a few conveniences.
#
#   make run     install missing Debian packages, build, run corrald with config/corral.yaml
#   make test    install missing Debian packages, build, run every test (Release build, then the
#                ASan+UBSan build)
#
# The CMake build trees are build/ (Release) and build-asan/ (sanitizers). Both are configured once
# and then only rebuilt incrementally, so a second `make test` compiles nothing.

MAKEFLAGS  += --no-print-directory

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
PYTHON     := /usr/bin/python3
CONFIG     ?= config/corral.yaml

.PHONY: all bootstrap build build-asan run test test-release test-asan clean

all: build

bootstrap:
	@scripts/bootstrap

$(BUILD)/CMakeCache.txt: | bootstrap
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

$(ASAN_BUILD)/CMakeCache.txt: | bootstrap
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORRAL_SANITIZE=ON

build: bootstrap $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: bootstrap $(ASAN_BUILD)/CMakeCache.txt
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

run: build
	exec $(BUILD)/daemon/corrald -c $(CONFIG)

test: test-release test-asan

test-release: build
	@scripts/run-tests $(BUILD) --python

test-asan: build-asan
	@scripts/run-tests $(ASAN_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
