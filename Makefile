# Thin wrapper: the two commands of the README, plus bench. CMake does the real work.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

# `make run` builds only the kiln program. Where `nvidia-smi -L` lists no GPU it builds the CPU backend alone,
# in its own directory (build-run), so that the CUDA kernels (minutes of nvcc) are not compiled for nothing;
# with a GPU it builds kiln in $(BUILD), CUDA included.
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo 1)
RUN_BUILD ?= $(if $(HAVE_GPU),$(BUILD),build-run)
RUN_CMAKE_FLAGS = $(if $(HAVE_GPU),,-DKILN_CUDA=OFF) $(CMAKE_FLAGS)
RUN_WHAT = $(if $(HAVE_GPU),kiln with the CUDA backend (several minutes of nvcc the first time),kiln for the CPU (no GPU found; under a minute on 2 cores the first time))

.PHONY: all deps configure build run test test-fast bench clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Train the default model (shakespeare-char) on the embedded Tiny Shakespeare from scratch (runs/default is
# the demo's own directory), then print a sample. The build's output goes to $(RUN_BUILD)/build.log, shown
# only when the build fails.
run: deps
	@echo "make run: building $(RUN_WHAT) in $(RUN_BUILD)/"
	@start=$$(date +%s); mkdir -p $(RUN_BUILD); \
	{ cmake -S . -B $(RUN_BUILD) -DCMAKE_BUILD_TYPE=Release $(RUN_CMAKE_FLAGS) && \
	  cmake --build $(RUN_BUILD) -j $(JOBS) --target kiln; } >$(RUN_BUILD)/build.log 2>&1 || \
	{ tail -n 30 $(RUN_BUILD)/build.log; echo "make run: the build failed; all its output is in $(RUN_BUILD)/build.log"; exit 1; }; \
	echo "make run: built $(RUN_BUILD)/kiln in $$(( $$(date +%s) - start )) s; training the demo (runs/default)"
	@rm -rf runs/default
	@$(RUN_BUILD)/kiln train --out=runs/default
	@$(RUN_BUILD)/kiln sample --run=runs/default --max-tokens=300

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE slow

bench: build
	@bash bench/run_gpu.sh

clean:
	rm -rf $(BUILD) build-run
