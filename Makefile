# kvstash: the two commands of the README, and a few conveniences.
#   make run    install deps if missing, build, start kvstashd, run the client against it
#   make test   install deps if missing, build, build again with sanitizers, run every test
#               (and the store stress test once more under ThreadSanitizer)
# Both are idempotent. CMake does the real work; this file only sequences it.

MAKEFLAGS  += --no-print-directory
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=

.PHONY: all deps build build-asan build-tsan run serve test test-fast clean

all: build

deps:
	@bash deploy/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Unit and integration tests once more under AddressSanitizer + UBSan (no CUDA, no benchmarks).
build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=ON -DKVS_CUDA=OFF \
	    -DKVS_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# ThreadSanitizer: only the tests labelled tsan (the store's threaded tests, the UCX data
# plane's test_xfer and test_xproc_chaos), to keep CI short.
build-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=thread -DKVS_CUDA=OFF \
	    -DKVS_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target kvs_tsan_tests

run: build
	@bash deploy/run-demo.sh $(BUILD)

# kvstashd in the foreground with its embedded defaults (Ctrl-C stops it).
serve: build
	@$(BUILD)/service/kvstashd

test: build build-asan build-tsan
	@bash tests/run-all.sh $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

# Only the normal build's tests.
test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
