# fasa - one Makefile. `make` builds bin/fasa and build/libfasa.a; `make test` runs the suite.
# Objects live in build/ mirroring the tree. CUDA=1 adds kernels/ (default: on when nvcc exists).

CC      ?= cc
PREFIX  ?= /usr/local
OPT     ?= -O2 -march=native
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -fopenmp -MMD -MP \
           $(LIB_INC) $(shell pkg-config --cflags libcjson libarchive libpcre2-8 stb)
LDLIBS  += $(shell pkg-config --libs libcjson libarchive libpcre2-8 libxxhash) -lm -fopenmp
TEST_LDLIBS = $(shell pkg-config --libs criterion)

# lib/ is grouped by concern (README: How the code is laid out); headers are included by name.
LIB_DIRS:= lib lib/core lib/fasa lib/eval lib/convert
LIB_INC := -I. -Iformats $(LIB_DIRS:%=-I%)
BUILD   := build
BIN     := bin
LIB_SRC := $(wildcard formats/*.c $(LIB_DIRS:%=%/*.c))
CMD_SRC := $(wildcard cmd/*.c)
TEST_SRC:= $(wildcard tests/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CMD_OBJ := $(CMD_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ:= $(TEST_SRC:%.c=$(BUILD)/%.o)
LIB     := $(BUILD)/libfasa.a
VENV    := .venv

.PHONY: all test verify clean sanitize test-avx2 bench

all: $(BIN)/fasa $(LIB)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/fasa: $(CMD_OBJ) $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) $(CMD_OBJ) $(LIB) $(LDLIBS) -o $@

$(BIN)/fasa-tests: $(TEST_OBJ) $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) $(TEST_OBJ) $(LIB) $(LDLIBS) $(TEST_LDLIBS) -o $@

# The suite: unit tests on generated fixtures, plus end-to-end checks on the real model when
# setup has installed it (they report themselves skipped otherwise). Criterion's summary is last.
test: check-headers check-lines $(BIN)/fasa $(BIN)/fasa-tests
	FASA_BIN=$(CURDIR)/$(BIN)/fasa ./$(BIN)/fasa-tests -j2

# The usage example atop every public header compiles (tests/tools/header_examples.py), and no
# source line is longer than 120 columns (the house limit; .clang-format says the same).
.PHONY: check-headers check-lines
check-headers:
	@python3 tests/tools/header_examples.py $(CC) $(filter-out -MMD -MP -g,$(CFLAGS)) -- $(PUB_HDR)

check-lines:
	@awk 'length > 120 { printf "%s:%d: %d columns (the limit is 120)\n", FILENAME, FNR, length; bad = 1 } \
	     END { exit bad }' $(wildcard formats/*.[ch] $(LIB_DIRS:%=%/*.[ch]) cmd/*.[ch] tests/*.[ch] kernels/*.c kernels/*.h kernels/*.cu kernels/*.cuh fuzz/*.[ch] tests/tools/*.c)

# Logits and greedy tokens of the real model against Hugging Face transformers (scripts/setup.sh
# installs the reference into $(VENV)); MODEL=... checks another GGUF the same way.
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
# K-quant files: VERIFY_ARGS=--exact (fasa's f32 path; the K kernels round x to 8 bits per 256)
VERIFY_ARGS ?=
verify: bin/fasa
	$(VENV)/bin/python scripts/verify_logits.py --fasa bin/fasa --model $(MODEL) $(VERIFY_ARGS)

# The suite under AddressSanitizer + UBSan, in build-asan/ (binaries too). Real-model checks find
# the model through FASA_MODEL / FASA_PROFILE; the transformers check skips (no .venv there).
# -march=native: the kernels this host runs are the ones checked (without it every product took
# the scalar twins, and a 1k-token prefill of the default model 3 minutes).
sanitize:
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	FASA_MODEL=$(CURDIR)/models/SmolLM2-135M-Instruct.Q4_1.gguf \
	FASA_PROFILE=$(CURDIR)/models/SmolLM2-135M-Instruct.Q4_1.profile.json \
	$(MAKE) BUILD=build-asan BIN=build-asan/bin OPT="-O1 -march=native -fsanitize=address,undefined -fno-omit-frame-pointer" test

# The suite built for a CPU with AVX2 and FMA but no AVX-512 (the kernels' AVX2 bodies and
# scalar ends, which this host's native build never runs).
test-avx2:
	$(MAKE) BUILD=build-avx2 BIN=bin-avx2 OPT="-O2 -march=haswell" test

# Speed (issue 6): decode tok/s, attention ms, bytes, GB/s and KV memory by tier at cache depths
# 0..32k for full, fasa-c, fasa-m and quest, medians of 5 runs, ratios printed; plus the CA table.
# Minutes, not seconds: not part of `make test`.
BENCH_MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
bench: $(BIN)/fasa
	@mkdir -p $(BUILD)
	$(BIN)/fasa bench $(BENCH_MODEL) --task speed --csv $(BUILD)/bench-speed.csv
	$(BIN)/fasa bench $(BENCH_MODEL) --task ca --csv $(BUILD)/bench-ca.csv

clean:
	rm -rf build build-asan build-avx2 bin bin-avx2

-include $(LIB_OBJ:.o=.d) $(CMD_OBJ:.o=.d) $(TEST_OBJ:.o=.d)

# --- fuzzing (issue 8) ---
# libFuzzer targets for every parser of files from outside (fuzz/fuzz_*.c), built with clang,
# AddressSanitizer and UBSan in build-fuzz/ (the library's objects are instrumented too).
#   make fuzz-build                     the targets and the seed generator
#   make fuzz FUZZ_SECONDS=N            each target in turn for N seconds (default 60)
#   make fuzz-run-gguf FUZZ_RUNS=1000000 FUZZ_SECONDS=600    one target, stopping at either limit
# Corpora grow in build-fuzz/corpus/<target>; fresh seeds from fuzz/make_seeds.c go to
# build-fuzz/seeds/<target> first; crashes, leaks and timeouts are saved in
# build-fuzz/artifacts/<target>/ (rerun one with: build-fuzz/fuzz_<target> FILE).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?=
FUZZ_BUILD   := build-fuzz
FUZZ_TARGETS := safetensors gguf config tokenizer profile bundle
FUZZ_CFLAGS  := -O1 -g -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -fopenmp -MMD -MP \
                $(LIB_INC) -Itests -Ifuzz \
                $(shell pkg-config --cflags libcjson libarchive libpcre2-8 stb) \
                -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_LIB     := $(FUZZ_BUILD)/libfasa.a
# CUDA's stub (when it exists) stands in for kernels/: fuzz builds never link CUDA.
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o) $(patsubst %.c,$(FUZZ_BUILD)/%.o,$(wildcard kernels/fasa_cuda_stub.c))
FUZZ_LDLIBS  := $(shell pkg-config --libs libcjson libarchive libpcre2-8 libxxhash) -lm -fopenmp
FUZZ_FIX_OBJ := $(FUZZ_BUILD)/tests/fixtures.o
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%) $(FUZZ_BUILD)/make_seeds
# Largest input per target: a few times the largest seed of that target.
FUZZ_MAXLEN_safetensors := 8192
FUZZ_MAXLEN_gguf        := 32768
FUZZ_MAXLEN_config      := 4096
FUZZ_MAXLEN_tokenizer   := 16384
FUZZ_MAXLEN_profile     := 16384
FUZZ_MAXLEN_bundle      := 65536
FUZZ_DICT_safetensors   := fuzz/safetensors.dict
FUZZ_DICT_gguf          := fuzz/gguf.dict
FUZZ_DICT_config        := fuzz/json.dict
FUZZ_DICT_tokenizer     := fuzz/json.dict
FUZZ_DICT_profile       := fuzz/json.dict
FUZZ_DICT_bundle        := fuzz/bundle.dict
FUZZ_FLAGS = -rss_limit_mb=2048 -timeout=10 -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
             $(if $(FUZZ_RUNS),-runs=$(FUZZ_RUNS))

.PHONY: fuzz fuzz-build fuzz-seeds $(FUZZ_TARGETS:%=fuzz-run-%)

fuzz-build: $(FUZZ_BINS)

$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

# The safetensors target compiles the stb-style header itself and needs nothing else.
$(FUZZ_BUILD)/fuzz_safetensors: $(FUZZ_BUILD)/fuzz/fuzz_safetensors.o
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -o $@

$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/fuzz/fuzz_%.o $(FUZZ_FIX_OBJ) $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ $(FUZZ_LDLIBS) -o $@

$(FUZZ_BUILD)/make_seeds: $(FUZZ_BUILD)/fuzz/make_seeds.o $(FUZZ_FIX_OBJ) $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $^ $(FUZZ_LDLIBS) -o $@

fuzz-seeds: $(FUZZ_BUILD)/make_seeds
	rm -rf $(FUZZ_BUILD)/seeds
	$(FUZZ_BUILD)/make_seeds $(FUZZ_BUILD)/seeds

# One target at a time, never in parallel (benchmarks share this machine).
fuzz: fuzz-build fuzz-seeds
	@for t in $(FUZZ_TARGETS); do $(MAKE) --no-print-directory fuzz-run-$$t || exit 1; done

$(FUZZ_TARGETS:%=fuzz-run-%): fuzz-run-%: $(FUZZ_BUILD)/fuzz_% $(FUZZ_BUILD)/seeds
	@mkdir -p $(FUZZ_BUILD)/corpus/$* $(FUZZ_BUILD)/artifacts/$*
	$(FUZZ_BUILD)/fuzz_$* $(FUZZ_FLAGS) -max_len=$(FUZZ_MAXLEN_$*) -dict=$(FUZZ_DICT_$*) \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/$*/ $(FUZZ_BUILD)/corpus/$* $(FUZZ_BUILD)/seeds/$*

$(FUZZ_BUILD)/seeds:
	$(MAKE) --no-print-directory fuzz-seeds

-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_BUILD)/fuzz/*.d $(FUZZ_FIX_OBJ:.o=.d)

# --- CUDA (issue 7) ---
# CUDA=1 (the default when nvcc is on PATH) compiles kernels/*.cu into the library for sm_80 and
# sm_90 and links the CUDA runtime statically (cuBLAS is dlopen'ed on first use: linked, its
# 600 MB of libraries cost every process start 0.3-0.4 s); CUDA=0 puts kernels/fasa_cuda_stub.c's
# "built without CUDA" there instead. The stub is compiled either way and depends on a stamp of
# the setting, so switching CUDA rebuilds the library. `make cuda-check`: every kernel for each
# architecture on its own, warnings (nvcc's, gcc's, ptxas's, register spills too) as errors.
CUDA       ?= $(if $(shell command -v nvcc),1,0)
NVCC       ?= nvcc
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC)))
CUDA_ARCHS := 80 90
NVFLAGS    ?= -O2 -g
NVFLAGS    += -std=c++17 --fmad=false -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -Xptxas -Werror,-warn-spills -MMD -MP $(LIB_INC)
CUDA_SRC   := $(wildcard kernels/*.cu)
CUDA_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CUDA_STAMP := $(BUILD)/kernels/cuda-setting
CUDA_CHECK := $(foreach a,$(CUDA_ARCHS),$(CUDA_SRC:kernels/%.cu=$(BUILD)/cuda-check/sm_$(a)/%.o))
KERNEL_OBJ := $(BUILD)/kernels/fasa_cuda_stub.o
ifeq ($(CUDA),1)
KERNEL_OBJ += $(CUDA_OBJ)
CFLAGS     += -DFASA_CUDA=1
LDLIBS     += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
endif

.PHONY: cuda-check cuda-setting

$(LIB): $(KERNEL_OBJ)
$(BUILD)/kernels/fasa_cuda_stub.o: $(CUDA_STAMP)

# Rewritten only when the setting changes (its date is what the stub's object compares to).
$(CUDA_STAMP): cuda-setting
	@mkdir -p $(dir $@)
	@echo $(CUDA) | cmp -s - $@ || echo $(CUDA) > $@

$(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) -c $< -o $@

cuda-check: $(CUDA_CHECK)
	@echo "cuda-check: $(words $(CUDA_SRC)) kernel files compile for $(CUDA_ARCHS:%=sm_%), no warnings"

define CUDA_CHECK_RULE
$(BUILD)/cuda-check/sm_$(1)/%.o: kernels/%.cu
	@mkdir -p $$(dir $$@)
	$$(NVCC) $$(NVFLAGS) -gencode arch=compute_$(1),code=sm_$(1) -c $$< -o $$@
endef
$(foreach a,$(CUDA_ARCHS),$(eval $(call CUDA_CHECK_RULE,$(a))))

-include $(CUDA_OBJ:.o=.d) $(CUDA_CHECK:.o=.d) $(KERNEL_OBJ:.o=.d)

# --- install, valgrind (issue 8) ---
# make install [PREFIX=/usr/local] [DESTDIR=/staging]: bin/fasa, the library with its headers
# (lib/*/*.h and formats/*.h, flat under include/fasa/: #include <fasa/model.h>), a pkg-config
# file, the manual pages and the bash completion. make uninstall removes exactly those files.
# fasa finds its pages through ../share/man/man1 next to the binary (fasa help CMD).
DESTDIR      ?=
INSTALL      ?= install
FASA_VERSION := $(shell sed -n 's/.*puts("fasa \([0-9][0-9.]*\)").*/\1/p' cmd/main.c)
# simd.h, quant.h, attn_impl.h are internal, not part of the library's interface
PUB_HDR      := $(sort $(filter-out lib/core/simd.h lib/core/quant.h lib/fasa/attn_impl.h,$(wildcard formats/*.h $(LIB_DIRS:%=%/*.h))))
MAN_PAGES    := $(sort $(wildcard man/*.1))
I_BIN        := $(DESTDIR)$(PREFIX)/bin
I_LIB        := $(DESTDIR)$(PREFIX)/lib
I_INC        := $(DESTDIR)$(PREFIX)/include/fasa
I_PC         := $(DESTDIR)$(PREFIX)/lib/pkgconfig
I_MAN1       := $(DESTDIR)$(PREFIX)/share/man/man1
I_BASHCOMP   := $(DESTDIR)$(PREFIX)/share/bash-completion/completions

.PHONY: install uninstall valgrind

install: all
	$(INSTALL) -d $(I_BIN) $(I_LIB) $(I_INC) $(I_PC) $(I_MAN1) $(I_BASHCOMP)
	$(INSTALL) -m 755 $(BIN)/fasa $(I_BIN)/fasa
	$(INSTALL) -m 644 $(LIB) $(I_LIB)/libfasa.a
	$(INSTALL) -m 644 $(PUB_HDR) $(I_INC)/
	$(INSTALL) -m 644 $(MAN_PAGES) $(I_MAN1)/
	$(INSTALL) -m 644 completions/fasa.bash $(I_BASHCOMP)/fasa
	printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$${prefix}/lib' \
	    'includedir=$${prefix}/include' '' 'Name: fasa' \
	    'Description: FASA frequency-aware sparse attention for LLM decoding' \
	    'Version: $(FASA_VERSION)' 'Libs: -L$${libdir} -lfasa $(strip $(LDLIBS))' \
	    'Cflags: -I$${includedir}' > $(I_PC)/fasa.pc.tmp && mv $(I_PC)/fasa.pc.tmp $(I_PC)/fasa.pc

uninstall:
	rm -f $(I_BIN)/fasa $(I_LIB)/libfasa.a $(I_PC)/fasa.pc $(I_BASHCOMP)/fasa
	rm -f $(addprefix $(I_INC)/,$(notdir $(PUB_HDR))) $(addprefix $(I_MAN1)/,$(notdir $(MAN_PAGES)))
	-rmdir $(I_INC) 2>/dev/null

# make valgrind: a short end-to-end job under memcheck, one thread, on the default model: a
# dense run, a profile summary, and a truncated model file (bad input: fasa must exit 1 with no
# memcheck complaint, which --quiet would print to the log). Any error or leak fails the target.
# One suppression: with CUDA=1, libcublasLt dlopen()s at load time and ld.so's own strncmp reads
# a few bytes past an rpath string (is_dst); valgrind before 3.22 does not redirect that
# strncmp, so memcheck reports it even for `fasa --version`. Nothing else is suppressed.
VG_MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
VG_PROFILE ?= $(VG_MODEL:.gguf=.profile.json)
VALGRIND   ?= valgrind --tool=memcheck --error-exitcode=1 --leak-check=full --quiet
VG_SUPP    := $(BUILD)/valgrind/ldso-strncmp.supp
VG_RUN      = OMP_NUM_THREADS=1 $(VALGRIND) --suppressions=$(VG_SUPP)

$(VG_SUPP): Makefile
	@mkdir -p $(dir $@)
	printf '%s\n' '{' '   ld.so strncmp in is_dst' '   Memcheck:Addr8' '   fun:strncmp' '   fun:is_dst' '}' > $@

valgrind: all $(VG_SUPP)
	@test -r $(VG_MODEL) && test -r $(VG_PROFILE) || \
	    { echo "make valgrind: needs $(VG_MODEL) and its profile (scripts/setup.sh)" >&2; exit 1; }
	$(VG_RUN) $(BIN)/fasa run $(VG_MODEL) --mode full -n 4 --raw "Hello"
	$(VG_RUN) $(BIN)/fasa inspect $(VG_PROFILE) >/dev/null
	head -c 5000000 $(VG_MODEL) > $(BUILD)/valgrind/truncated.gguf
	$(VG_RUN) --log-file=$(BUILD)/valgrind/bad-input.log \
	    $(BIN)/fasa inspect $(BUILD)/valgrind/truncated.gguf; test $$? = 1
	@if test -s $(BUILD)/valgrind/bad-input.log; then cat $(BUILD)/valgrind/bad-input.log; exit 1; fi
	@echo "make valgrind: no memcheck errors or leaks"

# --- bench-compare ---
# make bench-compare [MODEL=...]: llama.cpp (llama-cpp-python, built into .venv by
# scripts/setup-llamacpp.sh on first use: a long compile) and fasa on the same model file, token
# ids, threads and f16 KV cache, in alternating rounds: prefill of 2,048 tokens, decode at each
# depth (full attention, and fasa-c when the model has a profile), ratios and roofline fractions.
# BENCH_COMPARE_ARGS passes more options, e.g. BENCH_COMPARE_ARGS="--depths 0,8192,32768 --json".
BENCH_COMPARE_MODEL ?= $(MODEL)
BENCH_COMPARE_ARGS  ?=

.PHONY: bench-compare

bench-compare: $(BIN)/fasa
	scripts/setup-llamacpp.sh
	.venv/bin/python scripts/bench_compare.py --fasa $(BIN)/fasa --model $(BENCH_COMPARE_MODEL) $(BENCH_COMPARE_ARGS)
