# spanserve - build, test, run.
#
#   make            bin/spanserve (CPU; the CUDA core too when nvcc is found), bin/spanctl
#   make test       every test; ends with "N passed, N failed, N skipped"
#   make asan       the tests under AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz       libFuzzer on the checkpoint, session-state and config parsers,
#                   and the HTTP request path of a whole server (FUZZ_SECONDS each)
#   make run        builds and serves the default model on 127.0.0.1:8080
#   make load       64 sessions generating for 30 s: tokens/s, latency
#   make soak       64 clients doing everything for 60 s against the sanitized
#                   server: no report, no 5xx, no session lost
#   make test-gpu   the CUDA forward against the fixtures and the CPU (skips without a GPU)
#   make bench      the GPU benchmarks of issues 4 and 18 (../shared/bench), the
#                   forward alone and through the server; skips without a GPU
#
# Missing system packages are installed by deploy/deps.sh (apt-get as root,
# otherwise it prints the command to run).

# Every build runs as many jobs as the machine has processors (a -j of
# the command line wins); the objects wait for `deps` (order-only), which
# installs what they include.
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)

CC       ?= gcc
CXX      ?= g++
BUILD    ?= build
SAN      ?=
OPT      ?= -O3
PKGS     := jansson openblas libmicrohttpd libcurl
# Recursive (=) so that pkg-config is asked at compile time, after `deps` has
# installed what was missing.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
# (messages are cut to their buffers on purpose: no format-truncation warning)
CFLAGS   += -std=c11 $(OPT) -g -Wall -Wextra -Werror -Wno-format-truncation -Icore -Iserver $(SAN) $(PKG_CFLAGS)
# SentencePiece (core/spm.cc, the one C++ file: a shim over the library)
SPM_LIBS := -lsentencepiece -lstdc++
CXXFLAGS += -std=c++17 $(OPT) -g -Wall -Wextra -Werror -Icore $(SAN) $(shell pkg-config --cflags sentencepiece 2>/dev/null)
LDLIBS   += $(PKG_LIBS) $(SPM_LIBS) -lm -lpthread
LDFLAGS  += $(SAN)

CORE_SRC := $(wildcard core/*.c)
SRV_SRC  := $(wildcard server/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
CORE_CXX := $(wildcard core/*.cc)
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o) $(CORE_CXX:%.cc=$(BUILD)/%.o)
OPENAPI_C := $(BUILD)/server/openapi.c $(BUILD)/server/openapi_jobs.c
UI_SRC   := server/ui/index.html server/ui/jobs.html server/ui/ui.js server/ui/ui.css
UI_C     := $(BUILD)/server/ui.c
SRV_OBJ  := $(SRV_SRC:%.c=$(BUILD)/%.o) $(OPENAPI_C:.c=.o) $(UI_C:.c=.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BIN      := $(if $(filter build,$(BUILD)),bin/spanserve,$(BUILD)/bin/spanserve)
# The client, clients/spanctl.c: HTTP only, so libcurl and jansson, no core.
CTL      := $(dir $(BIN))spanctl
CTL_PKGS := libcurl jansson
CTL_CFLAGS = $(shell pkg-config --cflags $(CTL_PKGS) 2>/dev/null)
CTL_LIBS   = $(shell pkg-config --libs $(CTL_PKGS) 2>/dev/null)

# The CUDA core (kernels/) is built only where nvcc exists; a CPU build never
# needs CUDA.
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CU_SRC   := $(wildcard kernels/*.cu)
# the host compiler's warnings and nvcc's own (device code), all errors
NVCC_WARN := -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings
# NCCL (several GPUs in one training run, kernels/train_multi.cu) where the
# toolkit has it; without it `train --gpus N` says so.
NVCC_DEFS :=
ifneq ($(and $(NVCC),$(CU_SRC)),)
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/%.o)
CFLAGS   += -DSPANSERVE_CUDA
LDLIBS   += -L$(dir $(NVCC))../lib64 -lcudart -lcublas -lcublasLt -lstdc++
ifneq ($(wildcard $(dir $(NVCC))../include/nccl.h),)
ifneq ($(wildcard $(dir $(NVCC))../lib64/libnccl.so),)
NVCC_DEFS += -DSPANSERVE_NCCL
LDLIBS   += -lnccl
endif
endif
endif

.PHONY: all deps test asan fuzz soak run load clean test-gpu bench
all: deps $(BIN) $(CTL)

deps:
	@sh deploy/deps.sh

$(BUILD)/%.o: %.c $(wildcard core/*.h server/*.h tests/*.h) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cc $(wildcard core/*.h) | deps
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# The OpenAPI documents (the API listener's, the jobs listener's), embedded
# as C strings named after their files.
$(OPENAPI_C): $(BUILD)/server/%.c: server/%.json
	@mkdir -p $(dir $@)
	{ printf 'const char $(notdir $(basename $<))_json[] =\n'; sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' $<; printf ';\n'; } > $@

# The dashboard (GET /, route_ui.c): server/ui/NAME.EXT as ui_NAME_EXT,
# each '?' escaped so that no "??x" reads as a trigraph.
$(UI_C): $(UI_SRC)
	@mkdir -p $(dir $@)
	for f in $(UI_SRC); do n=$$(basename $$f | tr . _); printf 'const char ui_%s[] =\n' $$n; \
	    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/?/\\?/g' -e 's/^/"/' -e 's/$$/\\n"/' $$f; printf ';\n'; done > $@

$(OPENAPI_C:.c=.o) $(UI_C:.c=.o): %.o: %.c | deps
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(wildcard kernels/*.h kernels/*.cuh core/*.h) | deps
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -arch=sm_90 -Icore $(NVCC_DEFS) $(NVCC_WARN) -c $< -o $@

$(BUILD)/libcore.a: $(CORE_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(SRV_OBJ) $(BUILD)/libcore.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(SRV_OBJ) $(BUILD)/libcore.a $(LDLIBS) -o $@

$(CTL): clients/spanctl.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CTL_CFLAGS) $< $(LDFLAGS) $(CTL_LIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(BUILD)/libcore.a tests/harness.h | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libcore.a $(LDFLAGS) $(LDLIBS) -o $@

# test_fetch tests server/fetch.c (the destination policy of the server's
# own requests) alone, with stubs for the rest of the server.
$(BUILD)/tests/test_fetch: tests/test_fetch.c $(BUILD)/server/fetch.o $(BUILD)/libcore.a tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/server/fetch.o $(BUILD)/libcore.a $(LDFLAGS) $(LDLIBS) -o $@

test: deps $(BIN) $(CTL) $(TEST_BIN)
	@sh tests/run.sh $(BUILD) $(BIN)

# The GPU tests and benchmark (tests/test_gpu.c, tests/bench_gpu.c): built
# with the CUDA core where nvcc exists; without a GPU they report a skip.
$(BUILD)/tests/test_gpu $(BUILD)/tests/bench_gpu: tests/randmodel.h kernels/gpu.h
$(BUILD)/tests/test_infer: tests/randmodel.h

test-gpu: deps $(BUILD)/tests/test_gpu
	SPANSERVE_SHARED=$${SPANSERVE_SHARED:-../shared} $(BUILD)/tests/test_gpu

# Then the same models through the server (tests/bench_server.py: 1, 16 and
# 64 concurrent /v1/score requests of 100 kB texts; tests/bench_generate.py:
# one streamed generation of 500 tokens, then 64 at once, also with
# SPANSERVE_GPU_DECODE_KERNEL=1), written by `bench_gpu write-models` into a
# temporary folder, served in SPANSERVE_SERVE_ARGS (default bf16 on the GPU).
bench: deps $(BUILD)/tests/bench_gpu $(BIN)
	SPANSERVE_SHARED=$${SPANSERVE_SHARED:-../shared} $(BUILD)/tests/bench_gpu
	@if [ -z "$(CU_OBJ)" ] || ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIP bench_server.py, bench_generate.py: no GPU"; else \
	    d=$$(mktemp -d) && SPANSERVE_SHARED=$${SPANSERVE_SHARED:-../shared} $(BUILD)/tests/bench_gpu write-models $$d && \
	    export SPANSERVE_BIN=$(BIN) SPANSERVE_SHARED=$${SPANSERVE_SHARED:-../shared} \
	    SPANSERVE_SERVE_ARGS="$${SPANSERVE_SERVE_ARGS:---device cuda --precision bf16}" && \
	    python3 tests/bench_server.py --memory exact,span $$d/aspan-enwik8.safetensors $$d/par-base.safetensors && \
	    python3 tests/bench_generate.py --memory span --decode-kernel $$d/aspan-enwik8.safetensors $$d/par-base.safetensors; \
	    rc=$$?; rm -rf $$d; exit $$rc; fi

# Sanitized build in its own tree; OpenBLAS's own threads are kept to one
# (OPENBLAS_NUM_THREADS=1): under ASan its threads' spinning took a second
# core and a fifth of the time of scoring a text on a machine of 2 cores.
# SPANSERVE_SANITIZED=1: test_fixtures scores the first 4096 predictions of
# each 100,000-prediction full evaluation (the same code; make test compares
# the whole with the reference), which took most of its time under the
# sanitizers; test_convert.sh converts without torch (the same bytes, make
# test checks) and scores texts of 2,000 characters, and test_convert_tf.sh
# converts and scores the fixture only (its TensorFlow checks are Python's):
# the sanitizers check spanserve's side of them.
asan: deps
	SPANSERVE_SANITIZED=1 OPENBLAS_NUM_THREADS=1 $(MAKE) BUILD=build/asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	    $(if $(CU_OBJ),NVCC=) test

# The soak (tests/soak.py): SOAK_CLIENTS clients (64) for SOAK_SECONDS (60)
# mixing generation, scoring, sessions, cut-off streams and a model unloaded
# and loaded again, against the server built with the sanitizers: no report,
# no 5xx, no session lost (also across the restart that ends it).
SOAK_SECONDS ?= 60
SOAK_CLIENTS ?= 64
soak: deps
	$(MAKE) BUILD=build/asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	    $(if $(CU_OBJ),NVCC=) build/asan/bin/spanserve
	SPANSERVE_BIN=build/asan/bin/spanserve SOAK_SECONDS=$(SOAK_SECONDS) SOAK_CLIENTS=$(SOAK_CLIENTS) \
	    SPANSERVE_SHARED=$${SPANSERVE_SHARED:-../shared} python3 tests/soak.py

# libFuzzer targets (tests/fuzz/), FUZZ_SECONDS each, under ASan + UBSan:
# the safetensors header, whole model files, session states (PUT
# /v1/sessions/ID/state), the trainer's config, text -> tokens, and HTTP
# requests (method, path, headers, body) to a server. The core is compiled
# with coverage for them (clang), once, in $(BUILD)/fuzz.
FUZZ_SECONDS ?= 60
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_FLAGS  = -std=c11 -g -O1 $(FUZZ_SAN) -Icore $(PKG_CFLAGS)
FUZZ_OBJ   := $(CORE_SRC:core/%.c=$(BUILD)/fuzz/obj/%.o) $(CORE_CXX:core/%.cc=$(BUILD)/fuzz/obj/%.o)
FUZZ_LIBS   = $(PKG_LIBS) $(SPM_LIBS) -lm -lpthread
$(BUILD)/fuzz/obj/%.o: core/%.c $(wildcard core/*.h) | deps
	@mkdir -p $(dir $@)
	clang $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
# (the shim has no classes of its own: vptr checks would need clang++'s C++ runtime at the link)
$(BUILD)/fuzz/obj/%.o: core/%.cc $(wildcard core/*.h) | deps
	@mkdir -p $(dir $@)
	clang++ -std=c++17 -g -O1 $(FUZZ_SAN) -fno-sanitize=vptr -Icore -fsanitize=fuzzer-no-link -c $< -o $@
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_models.h $(FUZZ_OBJ)
	clang $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_OBJ) $(FUZZ_LIBS) -o $@
$(BUILD)/fuzz/state_seeds: tests/fuzz/fuzz_state_seeds.c tests/fuzz/fuzz_models.h $(FUZZ_OBJ)
	clang $(FUZZ_FLAGS) $< $(FUZZ_OBJ) $(FUZZ_LIBS) -o $@

# fuzz_http runs a whole server in its process: the server's files too
FUZZ_SRV_OBJ := $(patsubst server/%.c,$(BUILD)/fuzz/srv/%.o,$(filter-out server/main.c,$(SRV_SRC))) \
                $(BUILD)/fuzz/srv/openapi.o $(BUILD)/fuzz/srv/openapi_jobs.o $(BUILD)/fuzz/srv/ui.o
$(BUILD)/fuzz/srv/%.o: server/%.c $(wildcard core/*.h server/*.h) | deps
	@mkdir -p $(dir $@)
	clang $(FUZZ_FLAGS) -Iserver -fsanitize=fuzzer-no-link -c $< -o $@
$(BUILD)/fuzz/srv/openapi.o $(BUILD)/fuzz/srv/openapi_jobs.o $(BUILD)/fuzz/srv/ui.o: $(BUILD)/fuzz/srv/%.o: $(BUILD)/server/%.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_FLAGS) -c $< -o $@
$(BUILD)/fuzz/fuzz_http: tests/fuzz/fuzz_http.c $(FUZZ_SRV_OBJ) $(FUZZ_OBJ)
	clang $(FUZZ_FLAGS) -Iserver -fsanitize=fuzzer $< $(FUZZ_SRV_OBJ) $(FUZZ_OBJ) $(FUZZ_LIBS) -o $@

FUZZ_TARGETS := st model state config vocab http
fuzz: deps $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%) $(BUILD)/fuzz/state_seeds
	@rm -rf $(BUILD)/fuzz/corpus && mkdir -p $(FUZZ_TARGETS:%=$(BUILD)/fuzz/corpus/%)
	cp tests/fuzz/corpus/* $(BUILD)/fuzz/corpus/st/
	for f in tests/fuzz/models/*.safetensors; do for b in 0 1; do printf "\\$$b" | cat - $$f > $(BUILD)/fuzz/corpus/model/$$b-$$(basename $$f); done; done
	$(BUILD)/fuzz/state_seeds $(BUILD)/fuzz/corpus/state
	cp tests/fuzz/configs/*.json $(BUILD)/fuzz/corpus/config/
	for f in tests/fuzz/models/*.safetensors; do python3 tests/fuzz/vocab_seed.py $$f $(BUILD)/fuzz/corpus/vocab; done
	OPENBLAS_NUM_THREADS=1 $(BUILD)/fuzz/fuzz_st -artifact_prefix=$(BUILD)/fuzz/ -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/corpus/st
	OPENBLAS_NUM_THREADS=1 $(BUILD)/fuzz/fuzz_model -artifact_prefix=$(BUILD)/fuzz/ -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/corpus/model
	OPENBLAS_NUM_THREADS=1 $(BUILD)/fuzz/fuzz_state -artifact_prefix=$(BUILD)/fuzz/ -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/corpus/state
	OPENBLAS_NUM_THREADS=1 $(BUILD)/fuzz/fuzz_config -artifact_prefix=$(BUILD)/fuzz/ -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -dict=tests/fuzz/config.dict $(BUILD)/fuzz/corpus/config
	$(BUILD)/fuzz/fuzz_vocab -artifact_prefix=$(BUILD)/fuzz/ -max_total_time=$(FUZZ_SECONDS) -max_len=4096 $(BUILD)/fuzz/corpus/vocab
	cp tests/fuzz/http/* $(BUILD)/fuzz/corpus/http/
	OPENBLAS_NUM_THREADS=1 $(BUILD)/fuzz/fuzz_http -artifact_prefix=$(BUILD)/fuzz/ -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -dict=tests/fuzz/http.dict $(BUILD)/fuzz/corpus/http

# Serves the default model (an adaptive-span model of tiny Shakespeare) on
# 127.0.0.1:8080, with models/ (made if missing) as the --model-dir that
# POST /v1/models loads from; PORT=, MODEL=, MODEL_DIR= and ARGS= override.
PORT      ?= 8080
MODEL     ?= deploy/models/aspan-shakespeare.safetensors
MODEL_DIR ?= models
run: all
	@mkdir -p $(MODEL_DIR)
	$(BIN) serve --listen 127.0.0.1:$(PORT) --model default=$(MODEL) --model-dir $(MODEL_DIR) --state-dir spanserve-state $(ARGS)

# 64 sessions generating for 30 s against a server on a free port (tests/load).
LOAD_ARGS ?= --seconds 30 --sessions 64 --model aspan
load: all
	SPANSERVE_BIN=$(BIN) sh tests/load/run.sh $(LOAD_ARGS)

clean:
	rm -rf build bin

# The CUDA trainer's speed (tests/bench_train.c, issues 5 and 19) and the
# PyTorch baseline of its PAR figure (tests/bench_par_torch.py): `make bench`
# runs them too; they skip without a GPU (the baseline also without torch).
.PHONY: bench-train
bench: bench-train
bench-train: deps $(BUILD)/tests/bench_train
	$(BUILD)/tests/bench_train
	python3 tests/bench_par_torch.py
