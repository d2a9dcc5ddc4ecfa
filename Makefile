# fasa - one Makefile. `make` builds bin/fasa and build/libfasa.a; `make test` runs the suite.
# Objects live in build/ mirroring the tree. CUDA=1 adds kernels/ (default: on when nvcc exists).

CC      ?= cc
PREFIX  ?= /usr/local
OPT     ?= -O2 -march=native
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -fopenmp -MMD -MP \
           -I. -Ilib -Iformats $(shell pkg-config --cflags libcjson libarchive libpcre2-8 stb)
LDLIBS  += $(shell pkg-config --libs libcjson libarchive libpcre2-8 libxxhash) -lm -fopenmp
TEST_LDLIBS = $(shell pkg-config --libs criterion)

BUILD   := build
BIN     := bin
LIB_SRC := $(wildcard lib/*.c formats/*.c)
CMD_SRC := $(wildcard cmd/*.c)
TEST_SRC:= $(wildcard tests/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CMD_OBJ := $(CMD_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ:= $(TEST_SRC:%.c=$(BUILD)/%.o)
LIB     := $(BUILD)/libfasa.a
VENV    := .venv

.PHONY: all test verify clean sanitize bench

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
test: $(BIN)/fasa $(BIN)/fasa-tests
	FASA_BIN=$(CURDIR)/$(BIN)/fasa ./$(BIN)/fasa-tests -j2

# Logits and greedy tokens of the real model against Hugging Face transformers (scripts/setup.sh
# installs the reference into $(VENV)).
verify: bin/fasa
	$(VENV)/bin/python scripts/verify_logits.py --fasa bin/fasa

# The suite under AddressSanitizer + UBSan, in build-asan/ (binaries too). Real-model checks find
# the model through FASA_MODEL / FASA_PROFILE; the transformers check skips (no .venv there).
sanitize:
	FASA_MODEL=$(CURDIR)/models/SmolLM2-135M-Instruct.Q4_1.gguf \
	FASA_PROFILE=$(CURDIR)/models/SmolLM2-135M-Instruct.Q4_1.profile.json \
	$(MAKE) BUILD=build-asan BIN=build-asan/bin OPT="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer" test

clean:
	rm -rf build build-asan bin

-include $(LIB_OBJ:.o=.d) $(CMD_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
