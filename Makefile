# Thin wrapper: the two commands of the README, plus bench. CMake does the real work.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test test-fast bench clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Train the default model (shakespeare-char) on the embedded Tiny Shakespeare from scratch (runs/default is
# the demo's own directory), then print a sample.
run: build
	@rm -rf runs/default
	@$(BUILD)/kiln train --out=runs/default
	@$(BUILD)/kiln sample --run=runs/default --max-tokens=300

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE slow

bench: build
	@bash bench/run_gpu.sh

clean:
	rm -rf $(BUILD)
