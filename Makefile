# Pliant build. `make deps && make` builds, `make test` runs the default suite.
# Programs land in build/bin/, unit tests in build/tests/ and, built again under
# AddressSanitizer + UndefinedBehaviorSanitizer, in build/asan/tests/.

CC      ?= cc
NVCC    ?= /usr/local/cuda/bin/nvcc
PYTHON  ?= python3
BUILD   := build

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
CSTD    := -std=c17 -D_GNU_SOURCE
# One include path per folder, bottom layer first; tools/check_layers.py refuses an
# include that goes up a layer (docs/architecture.md).
INCS    := -Ishared -Ikernels -Iworker/engine -Iworker/comm -Iworker/agent -Ioperator/runtime \
           -Ioperator/k8s -Ioperator/cli $(shell pkg-config --cflags libcjson 2>/dev/null) \
           $(shell pkg-config --cflags libwebsockets openssl libcurl 2>/dev/null)
CFLAGS  ?= -O2 -g
ALL_CFLAGS := $(CSTD) $(WARN) $(INCS) $(CFLAGS) -MMD -MP
LDLIBS  := $(shell pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lyaml -lm \
           $(shell pkg-config --libs libwebsockets 2>/dev/null || echo -lwebsockets) -lssl -lcrypto \
           $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)
SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

# The common library: everything in shared/.
SHARED_SRC := $(wildcard shared/*.c)
# operator/runtime/: the coordinator runtime shared by `pliant run` and the operator;
# operator/k8s/: pliant-operator (main: operator_main.c) and its Kubernetes client;
# operator/cli/: the `pliant` command (main: pliant.c) and its subcommands. Each folder
# but its main is a library the tests link too.
PLIANT_SRC := operator/cli/pliant.c
OPERATOR_MAIN_SRC := operator/k8s/operator_main.c
RUNTIME_SRC := $(wildcard operator/runtime/*.c)
K8S_SRC := $(filter-out $(OPERATOR_MAIN_SRC),$(wildcard operator/k8s/*.c))
CLI_SRC := $(filter-out $(PLIANT_SRC),$(wildcard operator/cli/*.c))
UNIT_SRC   := $(filter-out tests/unit/test_kernels_cuda.c tests/unit/test_nccl.c,$(wildcard tests/unit/test_*.c))
BENCH_SRC  := $(wildcard bench/*_bench.c)
CUDA_SRC   := $(wildcard kernels/cuda/*.cu)

SHARED_OBJ      := $(SHARED_SRC:%.c=$(BUILD)/obj/%.o)
SHARED_ASAN_OBJ := $(SHARED_SRC:%.c=$(BUILD)/asan/obj/%.o)
PLIANT_OBJ      := $(PLIANT_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_BIN        := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
UNIT_ASAN_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/asan/tests/%)
BENCH_BIN       := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
CUDA_OBJ        := $(CUDA_SRC:%.cu=$(BUILD)/cuda/%.o)

# Compute kernels: the backend dispatch (kernels/kernels.c) and the CPU kernels
# (kernels/cpu/: OpenMP + OpenBLAS), one library (and its sanitized twin)
# linked into every program, unit test and benchmark.
KERNEL_SRC      := kernels/kernels.c $(wildcard kernels/cpu/*.c)
KERNEL_OBJ      := $(KERNEL_SRC:%.c=$(BUILD)/obj/%.o)
KERNEL_ASAN_OBJ := $(KERNEL_SRC:%.c=$(BUILD)/asan/obj/%.o)
KERNEL_LIB      := $(BUILD)/lib/libpliant_kernels.a
KERNEL_ASAN_LIB := $(BUILD)/asan/lib/libpliant_kernels.a
LDLIBS          += -lopenblas -fopenmp

# The GPT engine (worker/engine/): layer-range forward/backward, optimizer,
# checkpoints, the single-process trainer; linked into `pliant` and the tests.
# worker/comm/: the worker-to-worker TCP transport and collectives (OpenSSL libcrypto).
# worker/agent/: the worker's control-channel client (libwebsockets over TLS).
ENGINE_SRC      := $(filter-out worker/comm/nccl_comm.c worker/comm/nccl_xport.c,$(wildcard worker/engine/*.c worker/comm/*.c worker/agent/*.c))
ENGINE_LIB      := $(BUILD)/lib/libpliant_engine.a
ENGINE_ASAN_LIB := $(BUILD)/asan/lib/libpliant_engine.a
RUNTIME_LIB     := $(BUILD)/lib/libpliant_runtime.a
K8S_LIB         := $(BUILD)/lib/libpliant_k8s.a
CLI_LIB         := $(BUILD)/lib/libpliant_cli.a
# below the runtime: what every program links
BASE_LIBS       := $(ENGINE_LIB) $(KERNEL_LIB) $(BUILD)/lib/libpliant_shared.a
LIBS            := $(CLI_LIB) $(K8S_LIB) $(RUNTIME_LIB) $(BASE_LIBS)
ASAN_LIBS       := $(LIBS:$(BUILD)/lib/%=$(BUILD)/asan/lib/%)

DEBIAN_DEPS := build-essential pkg-config python3 libcjson-dev libcurl4-openssl-dev libyaml-dev \
               libwebsockets-dev libssl-dev libopenblas-dev clang libclang-rt-14-dev

.PHONY: test-e2e test-faults all deps deps-test test unit-tests bench bench-planner bench-kernels bench-train bench-comm bench-copy bench-recv bench-trace bench-papers bench-recovery bench-simulate cuda clean
all: $(BUILD)/bin/pliant $(BUILD)/bin/pliant-operator

# Only the dashboard's browser test needs it (tests/cli/test_dashboard.py skips without).
DEBIAN_TEST_DEPS := chromium

deps-test: deps
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(DEBIAN_TEST_DEPS)

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

$(KERNEL_OBJ) $(KERNEL_ASAN_OBJ) $(BUILD)/bench/kernels_bench: ALL_CFLAGS += -fopenmp

# The dashboard's page (operator/runtime/dashboard/: HTML, CSS, JavaScript) as a C string,
# its stylesheet and script inlined (tools/embed_page.py), in the runtime library.
DASH_PAGE_SRC   := $(wildcard operator/runtime/dashboard/page.*)
DASH_PAGE_C     := $(BUILD)/gen/dashboard_page.c
DASH_PAGE_OBJ   := $(BUILD)/gen/obj/dashboard_page.o
$(DASH_PAGE_C): tools/embed_page.py $(DASH_PAGE_SRC)
	@mkdir -p $(@D)
	$(PYTHON) tools/embed_page.py operator/runtime/dashboard $@
$(DASH_PAGE_OBJ) $(BUILD)/asan/gen/obj/dashboard_page.o: $(DASH_PAGE_C)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(RUNTIME_LIB): $(RUNTIME_SRC:%.c=$(BUILD)/obj/%.o) $(DASH_PAGE_OBJ)
$(K8S_LIB): $(K8S_SRC:%.c=$(BUILD)/obj/%.o)
$(CLI_LIB): $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
$(RUNTIME_LIB:$(BUILD)/%=$(BUILD)/asan/%): $(RUNTIME_SRC:%.c=$(BUILD)/asan/obj/%.o) \
                                          $(BUILD)/asan/gen/obj/dashboard_page.o
$(K8S_LIB:$(BUILD)/%=$(BUILD)/asan/%): $(K8S_SRC:%.c=$(BUILD)/asan/obj/%.o)
$(CLI_LIB:$(BUILD)/%=$(BUILD)/asan/%): $(CLI_SRC:%.c=$(BUILD)/asan/obj/%.o)
$(RUNTIME_LIB) $(K8S_LIB) $(CLI_LIB) $(patsubst $(BUILD)/%,$(BUILD)/asan/%,$(RUNTIME_LIB) $(K8S_LIB) $(CLI_LIB)):
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(ENGINE_LIB): $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(ENGINE_ASAN_LIB): $(ENGINE_SRC:%.c=$(BUILD)/asan/obj/%.o)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(KERNEL_LIB): $(KERNEL_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(KERNEL_ASAN_LIB): $(KERNEL_ASAN_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

# Every include checked against the layers before anything compiles.
LAYER_CHECK := $(BUILD)/layers.ok
$(LAYER_CHECK): tools/check_layers.py $(wildcard shared/*.[ch] kernels/*.[ch] kernels/*/*.[ch] \
                kernels/cuda/*.cu kernels/cuda/*.cuh worker/*/*.[ch] operator/*/*.[ch])
	@$(PYTHON) tools/check_layers.py
	@mkdir -p $(@D) && touch $@

$(BUILD)/obj/%.o: %.c | $(LAYER_CHECK)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/asan/obj/%.o: %.c | $(LAYER_CHECK)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -O1 $(SAN) -c $< -o $@

$(BUILD)/bin/pliant: $(PLIANT_OBJ) $(CLI_LIB) $(RUNTIME_LIB) $(BASE_LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bin/pliant-operator: $(BUILD)/obj/$(OPERATOR_MAIN_SRC:.c=.o) $(K8S_LIB) $(RUNTIME_LIB) $(BASE_LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Itests/unit $< $(LIBS) -o $@ $(LDLIBS)

$(BUILD)/asan/tests/%: tests/unit/%.c $(wildcard tests/unit/*.h) $(ASAN_LIBS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -O1 $(SAN) -Itests/unit $< $(ASAN_LIBS) -o $@ $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(LIBS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $< $(LIBS) -o $@ $(LDLIBS)

unit-tests: $(UNIT_BIN) $(UNIT_ASAN_BIN) $(BUILD)/tests/test_attention_emu \
            $(BUILD)/tests/test_layernorm_emu

# CUDA kernel code compiled by the host C++ compiler against a CPU emulation of
# threads, barriers and shuffles (tests/gpu_emu/gpu_emu.h), checked without a GPU:
# the bf16 attention kernels (kernels/cuda/attention_bf16.cuh, their mma.sync and
# ldmatrix fragment mapping) and the LayerNorm kernels (layernorm_kernels.cuh).
# C++20 for designated braces and lambdas in the emulation; no nvcc needed.
CXX ?= g++
EMU_CXXFLAGS := -std=c++20 -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter \
                -Wno-unknown-pragmas -fno-strict-aliasing -Ikernels
$(BUILD)/tests/test_attention_emu: tests/gpu_emu/attention_emu.cpp tests/gpu_emu/gpu_emu.h \
                                   kernels/cuda/attention_bf16.cuh
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) $< -o $@

$(BUILD)/tests/test_layernorm_emu: tests/gpu_emu/layernorm_emu.cpp tests/gpu_emu/gpu_emu.h \
                                   kernels/cuda/layernorm_kernels.cuh
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) $< -o $@

# Fuzzing (tests/fuzz/README.md): every tests/fuzz/fuzz_<parser>.c is built twice, as a
# libFuzzer target with clang (build/fuzz/bin/, coverage-guided; where clang's libFuzzer
# runtime exists) and, with the default compiler under ASan + UBSan, as a replayer of its
# corpus (build/fuzz/replay/, main in tests/fuzz/replay.c). `make test` runs each for a few
# seconds (FUZZ_TEST_SECONDS), `make fuzz` for FUZZ_SECONDS each, keeping what it finds in
# build/fuzz/corpus/.
CLANG             ?= clang
FUZZ_SECONDS      ?= 120
FUZZ_TEST_SECONDS ?= 4
FUZZ_SRC          := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN          := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/bin/%)
FUZZ_REPLAY_BIN   := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/replay/%)
# the parsers' code, instrumented for coverage: shared/ and the few files above it that read
# outside input (checkpoint.json, kubeconfig, the peer handshake and frame header)
FUZZ_LIB_SRC      := $(SHARED_SRC) worker/engine/gpt.c worker/engine/checkpoint_info.c \
                     operator/k8s/kube_config.c \
                     worker/comm/tcp.c worker/comm/handshake.c worker/comm/aead.c
FUZZ_LIB          := $(BUILD)/fuzz/lib/libpliant_fuzz.a
FUZZ_SAN          := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS       := $(CSTD) $(WARN) $(INCS) -O1 -g -DFUZZ_REPO='"$(CURDIR)"'
FUZZ_LDLIBS       := $(filter-out -lopenblas -fopenmp,$(LDLIBS))
# libFuzzer's runtime (Debian: libclang-rt-14-dev); without it only the replayers are built
LIBFUZZER         := $(wildcard $(shell $(CLANG) -print-runtime-dir 2>/dev/null)/libclang_rt.fuzzer-*.a)

.PHONY: fuzz-targets fuzz
fuzz-targets: $(FUZZ_REPLAY_BIN) $(if $(LIBFUZZER),$(FUZZ_BIN))

fuzz: fuzz-targets
	@$(PYTHON) tests/fuzz/run_fuzz.py --build $(BUILD) --long --seconds $(FUZZ_SECONDS) $(FUZZ_TARGETS)

$(BUILD)/fuzz/obj/%.o: %.c | $(LAYER_CHECK)
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -MMD -MP -fsanitize=fuzzer-no-link $(FUZZ_SAN) -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/fuzz/bin/%: tests/fuzz/%.c tests/fuzz/fuzz.h $(FUZZ_LIB)
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(FUZZ_SAN) $< $(FUZZ_LIB) -o $@ $(FUZZ_LDLIBS)

$(BUILD)/fuzz/replay/%: tests/fuzz/%.c tests/fuzz/replay.c tests/fuzz/fuzz.h $(ASAN_LIBS)
	@mkdir -p $(@D)
	$(CC) $(FUZZ_CFLAGS) $(SAN) tests/fuzz/replay.c $< $(ASAN_LIBS) -o $@ $(LDLIBS)

# The fault matrix (docs/faults.md) on 6 workers with the control-connection cut at every
# phase; the 4-worker matrix is part of `make test`.
test-faults: all
	@PLIANT_FAULT_MATRIX=big PLIANT_FAULT_MATRIX_TABLE=$(BUILD)/fault_matrix.md \
		$(PYTHON) tests/run_tests.py --build $(BUILD) -k fault_matrix

# Randomized spot-trace replays of `pliant run`, each strategy, checked for exact training,
# no worker lost but the trace's and no stall (docs/faults.md "Soak"; not part of `make test`).
# SOAK_RUNS: seeds 1..N (default 2; a seed about a minute, more under load); SOAK_SEEDS: a comma-separated list
# instead; SOAK_STRATEGIES: a subset of templates,redundant-eager,redundant-lazy,checkpoint
.PHONY: soak
soak: all
	@$(PYTHON) tests/soak/trace_soak.py --build $(BUILD) $(if $(SOAK_SEEDS),--seeds $(SOAK_SEEDS)) \
	    $(if $(SOAK_RUNS),--runs $(SOAK_RUNS)) $(if $(SOAK_STRATEGIES),--strategies $(SOAK_STRATEGIES))

# The operator's end-to-end tests: kubectl against the API emulator, the test cluster
# itself, and the chart's operator in it (needs root; skipped without); also part of
# `make test`.
test-e2e: all
	@$(PYTHON) tests/run_tests.py --build $(BUILD) -k operator_e2e -k cli/test_cluster

# A test cluster with a real cluster's boundaries (tests/k8s/README.md): 4 nodes as network
# namespaces in zones a,b, the chart's operator running as Pods; needs root. It stays up in
# the background: `python3 tests/k8s/cluster.py down --state build/cluster` stops it.
.PHONY: cluster
cluster: all
	@$(PYTHON) tests/k8s/cluster.py up --nodes 4 --zones a,b --state $(BUILD)/cluster \
	    --kubeconfig $(BUILD)/cluster/kubeconfig --build $(BUILD)
	@echo "reach it:  kubectl --kubeconfig $(BUILD)/cluster/kubeconfig get nodes,pods -A"
	@echo "break it:  $(PYTHON) tests/k8s/cluster.py node node-1 preempt|lose|partition-from-peers|partition-from-coordinator|restore --state $(BUILD)/cluster"
	@echo "stop it:   $(PYTHON) tests/k8s/cluster.py down --state $(BUILD)/cluster"

# The whole default suite: unit tests (plain and sanitized) and command-line tests;
# where nvcc exists the CUDA backend is built too and its tests run (skipping without a GPU).
test: all unit-tests fuzz-targets $(BENCH_BIN) $(if $(wildcard $(NVCC)),cuda)
	@$(PYTHON) tests/run_tests.py --build $(BUILD)

bench: bench-planner bench-kernels bench-train
bench-planner: $(BUILD)/bench/planner_bench
	$(BUILD)/bench/planner_bench

# LLMC_T64 / LLMC_T256: commands running llm.c's CPU trainer at T=64 / 256 (see bench/README.md)
bench-train: $(BUILD)/bench/train_bench
	$(BUILD)/bench/train_bench $(if $(LLMC_T64),--llmc-t64 "$(LLMC_T64)") $(if $(LLMC_T256),--llmc-t256 "$(LLMC_T256)")
bench-kernels: $(BUILD)/bench/kernels_bench
	$(BUILD)/bench/kernels_bench
bench-comm: $(BUILD)/bench/comm_bench
	$(BUILD)/bench/comm_bench
# A recovery's layer copy against one loopback stream, alternated (bench/README.md "Recovery at
# size"); COPY_BENCH_ARGS: e.g. "--preset gpt2-350m --reps 11"
bench-copy: $(BUILD)/bench/layer_copy_bench
	$(BUILD)/bench/layer_copy_bench $(COPY_BENCH_ARGS)
# Receiving a stream of tensors into fresh memory, each way of preparing it (bench/README.md
# "Receiving into fresh memory"); RECV_BENCH_ARGS: e.g. "--mb 256 --reps 3 --huge"
bench-recv: $(BUILD)/bench/recv_bench
	$(BUILD)/bench/recv_bench $(RECV_BENCH_ARGS)
# Single-loss recoveries of GPT-2 124M/350M-shaped local jobs against their bound; MODELS: a
# comma-separated subset of gpt2-124m,gpt2-350m; WORKERS: 7 for layers copied in parts from two
# holders; REPEAT: runs of each (bench/README.md "Recovery at size")
bench-recovery: $(BUILD)/bin/pliant $(BUILD)/bench/comm_bench $(BUILD)/bench/layer_copy_bench
	$(PYTHON) bench/recovery_size_bench.py --build $(BUILD) $(if $(MODELS),--models $(MODELS)) \
	    $(if $(WORKERS),--workers $(WORKERS)) $(if $(REPEAT),--repeat $(REPEAT))

# Spot-trace replay of the p3 and g4dn traces with a pipelined model, strategies templates,
# redundant and checkpoint (about 6 minutes; SPEEDUP: trace compression, default 1000)
bench-trace: $(BUILD)/bin/pliant $(BUILD)/bench/comm_bench
	$(PYTHON) bench/trace_bench.py --build $(BUILD) $(if $(SPEEDUP),--speedup $(SPEEDUP))

# `pliant simulate` against a real `pliant run --chaos trace:` of the same job, profile and
# trace, each strategy (docs/simulate.md "Against a real replay"; about a minute, needs a quiet machine)
bench-simulate: $(BUILD)/bin/pliant
	$(PYTHON) bench/simulate_agreement_bench.py --build $(BUILD)

# Oobleck's §7.3 and Bamboo's Table 2 setups in `pliant simulate`, the papers' figures beside
# (bench/README.md "The papers' setups"; about a second)
bench-papers: $(BUILD)/bin/pliant
	$(PYTHON) bench/paper_bench.py --build $(BUILD)

# The CUDA backend (kernels/cuda/, cuBLAS) builds only with `make cuda`; the default
# build never needs nvcc. libpliant_kernels_cuda.a = the CPU kernels + the CUDA
# kernels + the dispatch built with PLIANT_CUDA (so kn_create("cuda") exists);
# pliant-cuda and test_kernels_cuda link it in place of libpliant_kernels.a.
# GPU code: sm_90 (H100) plus its PTX for newer devices.
CUDA_HOME        ?= /usr/local/cuda
NVCC_FLAGS       := -std=c++17 -O3 -Ishared -Ikernels -Xcompiler -Wall -MMD -MP \
                    -gencode arch=compute_90,code=[sm_90,compute_90]
KERNEL_CUDA_LIB  := $(BUILD)/lib/libpliant_kernels_cuda.a
# The NCCL transport (worker/comm/nccl_comm.c, plain C on NCCL's and the CUDA
# runtime's C APIs; docs/nccl.md): its own library, never in the CPU build.
NCCL_LIB         := $(BUILD)/lib/libpliant_nccl.a
# libpliant_engine_cuda.a: the engine library with worker/agent/nccl_plan.c built with
# PLIANT_NCCL (the CPU build's copy says NCCL is not there), as kernels.c is built twice.
ENGINE_CUDA_LIB  := $(BUILD)/lib/libpliant_engine_cuda.a
CUDA_LIBS        := $(CLI_LIB) $(RUNTIME_LIB) $(ENGINE_CUDA_LIB) $(NCCL_LIB) $(KERNEL_CUDA_LIB) $(BUILD)/lib/libpliant_shared.a
CUDA_LDLIBS      := $(LDLIBS) -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
                    -lnccl -lcublasLt -lcublas -lcudart -lstdc++
.PHONY: test-gpu
cuda: $(BUILD)/bin/pliant-cuda $(BUILD)/bin/pliant-worker $(BUILD)/tests/test_kernels_cuda \
      $(BUILD)/tests/test_nccl

# pliant-worker: pliant-cuda under the worker's name (it runs `pliant worker`)
$(BUILD)/bin/pliant-worker: $(BUILD)/bin/pliant-cuda
	ln -f $< $@

# The CUDA kernel parity tests, the NCCL transport's, and `pliant run` with workers on
# the GPU(s) (each test prints "skip" where there is no GPU).
test-gpu: cuda all
	$(BUILD)/tests/test_kernels_cuda
	$(BUILD)/tests/test_nccl
	$(PYTHON) tests/cli/test_run_gpu.py --build $(BUILD)

$(BUILD)/cuda/%.o: %.cu | $(LAYER_CHECK)
	@mkdir -p $(@D)
	@if [ ! -x "$(NVCC)" ]; then echo "make cuda: $(NVCC) not found" >&2; exit 1; fi
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/cuda/kernels/kernels.o: kernels/kernels.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -DPLIANT_CUDA -c $< -o $@

$(KERNEL_CUDA_LIB): $(BUILD)/cuda/kernels/kernels.o $(filter-out $(BUILD)/obj/kernels/kernels.o,$(KERNEL_OBJ)) $(CUDA_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/bin/pliant-cuda: $(PLIANT_OBJ) $(CUDA_LIBS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $^ -o $@ $(CUDA_LDLIBS)

$(BUILD)/tests/test_kernels_cuda: tests/unit/test_kernels_cuda.c $(wildcard tests/unit/*.h) $(CUDA_LIBS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -Itests/unit $< $(CUDA_LIBS) -o $@ $(CUDA_LDLIBS)

# GPT-2 124M training throughput and MFU on one GPU, with a per-kernel time
# table (bench/README.md). Not a *_bench.c, so the CPU build leaves it out.
# GPU_BENCH_ARGS: e.g. "--steps 20 --warmup 5 --B 16 --T 1024 --tokens 'data/x_*.bin'".
.PHONY: bench-gpu
cuda: $(BUILD)/bench/gpu_bench_cuda
bench-gpu: $(BUILD)/bench/gpu_bench_cuda
	$(BUILD)/bench/gpu_bench_cuda $(GPU_BENCH_ARGS)

$(BUILD)/bench/gpu_bench_cuda: bench/gpu_bench_cuda.c $(CUDA_LIBS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -isystem $(CUDA_HOME)/include $< $(CUDA_LIBS) -o $@ $(CUDA_LDLIBS)

$(BUILD)/cuda/worker/agent/nccl_plan.o: worker/agent/nccl_plan.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -DPLIANT_NCCL -isystem $(CUDA_HOME)/include -c $< -o $@

$(ENGINE_CUDA_LIB): $(filter-out $(BUILD)/obj/worker/agent/nccl_plan.o,$(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)) \
                    $(BUILD)/cuda/worker/agent/nccl_plan.o
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

# -isystem: nccl.h's `ncclGroupStart();` would trip -Wstrict-prototypes
$(BUILD)/cuda/worker/comm/nccl_comm.o: worker/comm/nccl_comm.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -isystem $(CUDA_HOME)/include -c $< -o $@

# nccl_xport.c: pl_xport (the step's ordered transport) over nccl_comm.c
$(BUILD)/cuda/worker/comm/nccl_xport.o: worker/comm/nccl_xport.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -isystem $(CUDA_HOME)/include -c $< -o $@

$(NCCL_LIB): $(BUILD)/cuda/worker/comm/nccl_comm.o $(BUILD)/cuda/worker/comm/nccl_xport.o
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/tests/test_nccl: tests/unit/test_nccl.c $(wildcard tests/unit/*.h) $(NCCL_LIB) $(BUILD)/lib/libpliant_shared.a
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -isystem $(CUDA_HOME)/include -Itests/unit $< $(NCCL_LIB) \
	    $(BUILD)/lib/libpliant_shared.a -o $@ $(CUDA_LDLIBS)

clean:
	rm -rf $(BUILD)

# Byte-level Tiny Shakespeare shards (vocabulary 256): data/ts_train.bin (first
# 90% of the bytes) and data/ts_val.bin (the rest), in llm.c's token format.
.PHONY: data train-example demo
data: $(BUILD)/bin/pliant
	$(BUILD)/bin/pliant tokenize --bytes ../shared/data/tinyshakespeare.txt data/ts

# The Shakespeare example end to end: train, then sample from the last checkpoint.
train-example: data
	$(BUILD)/bin/pliant train examples/shakespeare-tiny.yaml --metrics $(BUILD)/shakespeare-tiny.jsonl
	$(BUILD)/bin/pliant sample $(BUILD)/ckpt/shakespeare-tiny --tokens 400 --prompt "ROMEO:"

# Recovery demo: 6 local workers, two SIGKILLs and a join during 300 steps (about a
# minute); reconfiguration and summary lines in $(BUILD)/demo.jsonl; then text sampled
# from the run's final checkpoint.
demo: data
	rm -rf $(BUILD)/demo-ckpt
	$(BUILD)/bin/pliant run examples/shakespeare-tiny.yaml --workers 6 --threads 1 --steps 300 \
	    --chaos kill:1@step=50,kill:4@step=100,add:1@step=150 --metrics $(BUILD)/demo.jsonl \
	    --checkpoint-dir $(BUILD)/demo-ckpt
	$(BUILD)/bin/pliant sample $(BUILD)/demo-ckpt --tokens 200 --prompt "ROMEO:"

-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d $(BUILD)/asan/obj/*/*.d $(BUILD)/asan/obj/*/*/*.d \
                  $(BUILD)/cuda/*/*.d $(BUILD)/cuda/*/*/*.d $(BUILD)/fuzz/obj/*/*.d $(BUILD)/fuzz/obj/*/*/*.d)
