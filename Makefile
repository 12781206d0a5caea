# Pliant build. `make deps && make` builds, `make test` runs the default suite.
# Programs land in build/bin/, unit tests in build/tests/ and, built again under
# AddressSanitizer + UndefinedBehaviorSanitizer, in build/asan/tests/.

CC      ?= cc
NVCC    ?= /usr/local/cuda/bin/nvcc
PYTHON  ?= python3
BUILD   := build

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
CSTD    := -std=c17 -D_GNU_SOURCE
INCS    := -Ishared $(shell pkg-config --cflags libcjson 2>/dev/null)
CFLAGS  ?= -O2 -g
ALL_CFLAGS := $(CSTD) $(WARN) $(INCS) $(CFLAGS) -MMD -MP
LDLIBS  := $(shell pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lm
SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

# The common library: everything in shared/.
SHARED_SRC := $(wildcard shared/*.c)
# The `pliant` command: its subcommands live in operator/ (pliant run shares the controller there).
PLIANT_SRC := $(wildcard operator/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
BENCH_SRC  := $(wildcard bench/*_bench.c)
CUDA_SRC   := $(wildcard kernels/cuda/*.cu)

SHARED_OBJ      := $(SHARED_SRC:%.c=$(BUILD)/obj/%.o)
SHARED_ASAN_OBJ := $(SHARED_SRC:%.c=$(BUILD)/asan/obj/%.o)
PLIANT_OBJ      := $(PLIANT_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN        := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
UNIT_ASAN_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/asan/tests/%)
BENCH_BIN       := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
CUDA_OBJ        := $(CUDA_SRC:%.cu=$(BUILD)/cuda/%.o)

DEBIAN_DEPS := build-essential pkg-config python3 libcjson-dev libcurl4-openssl-dev libyaml-dev \
               libwebsockets-dev libssl-dev libopenblas-dev

.PHONY: all deps test unit-tests bench bench-planner cuda clean
all: $(BUILD)/bin/pliant

deps:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(DEBIAN_DEPS)

$(BUILD)/lib/libpliant_shared.a: $(SHARED_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/asan/lib/libpliant_shared.a: $(SHARED_ASAN_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/asan/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -O1 $(SAN) -c $< -o $@

$(BUILD)/bin/pliant: $(PLIANT_OBJ) $(BUILD)/lib/libpliant_shared.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(BUILD)/lib/libpliant_shared.a
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Itests/unit $< $(BUILD)/lib/libpliant_shared.a -o $@ $(LDLIBS)

$(BUILD)/asan/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(BUILD)/asan/lib/libpliant_shared.a
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -O1 $(SAN) -Itests/unit $< $(BUILD)/asan/lib/libpliant_shared.a -o $@ $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/lib/libpliant_shared.a
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $< $(BUILD)/lib/libpliant_shared.a -o $@ $(LDLIBS)

unit-tests: $(UNIT_BIN) $(UNIT_ASAN_BIN)

# The whole default suite: unit tests (plain and sanitized) and command-line tests.
test: all unit-tests
	@$(PYTHON) tests/run_tests.py --build $(BUILD)

bench: bench-planner
bench-planner: $(BUILD)/bench/planner_bench
	$(BUILD)/bench/planner_bench

# CUDA parts build only where nvcc exists; the default build never needs it.
cuda: $(CUDA_OBJ)
	@if [ ! -x "$(NVCC)" ]; then echo "make cuda: $(NVCC) not found" >&2; exit 1; fi
	@echo "cuda: built $(words $(CUDA_OBJ)) object(s)"

$(BUILD)/cuda/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O3 -Ishared -Ikernels -gencode arch=compute_90,code=[sm_90,compute_90] -c $< -o $@

clean:
	rm -rf $(BUILD)

-include $(SHARED_OBJ:.o=.d) $(SHARED_ASAN_OBJ:.o=.d) $(PLIANT_OBJ:.o=.d)
