# libh3 build. `make lib` builds the shared library into the Python package, where both
# `pip install .` and `pip install -e .` find it; `make test` runs the C tests, plain and under
# ASan+UBSan.

CC       ?= cc
UNAME_S  := $(shell uname -s)
UNAME_M  := $(shell uname -m)
OPT      ?= -O2
# Baseline ISA only: SIMD paths are compiled per file (*_avx2.c) and chosen at run time, so one
# build runs on any CPU of the architecture. No FMA contraction: `x + g * y` rounds the product
# first, as torch does, with GCC (off by default in ISO C modes) and clang (on by default) alike.
CFLAGS_BASE := -std=c11 -Wall -Wextra -Wshadow -Wno-unused-parameter -fPIC -fvisibility=hidden \
               -ffp-contract=off -Ilibh3 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -pthread
CFLAGS   ?= $(OPT) -g
LDLIBS   := -lm -pthread
ifneq ($(UNAME_S),Darwin)
  LDLIBS += -ldl
endif

ifeq ($(UNAME_S),Darwin)
  LIBEXT := dylib
  SHARED := -dynamiclib
  # _POSIX_C_SOURCE hides madvise, _SC_NPROCESSORS_ONLN and st_mtimespec on Darwin; this restores them.
  CFLAGS_BASE += -D_DARWIN_C_SOURCE
else
  LIBEXT := so
  SHARED := -shared -Wl,--exclude-libs,ALL
endif

ifneq (,$(filter x86_64 amd64,$(UNAME_M)))
  AVX2_FLAGS := -mavx2 -mfma -mf16c
else
  AVX2_FLAGS :=
endif

LIB      := python/h3ctl/libh3.$(LIBEXT)
# libh3's layout: api/ (the only code that knows the context), core/, models/, runtime/ and
# backend/cpu/. backend/cuda/ is built separately (see `cuda` below) and loaded at run time.
SRC_DIRS := libh3/api libh3/core libh3/models libh3/runtime libh3/backend libh3/backend/cpu
SRC      := $(sort $(foreach d,$(SRC_DIRS),$(wildcard $(d)/*.c)))
HDR      := $(wildcard libh3/*.h $(foreach d,$(SRC_DIRS),$(d)/*.h $(d)/*.inc))
INC      := -Ilibh3
OBJ      := $(patsubst libh3/%.c,build/obj/%.o,$(SRC))
ASAN_OBJ := $(patsubst libh3/%.c,build/asan/%.o,$(SRC))
SAN      := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

CTEST_SRC := $(sort $(wildcard tests/c/test_*.c))
CTEST_BIN := $(patsubst tests/c/%.c,build/tests/%,$(CTEST_SRC))
CTEST_ASAN := $(patsubst tests/c/%.c,build/tests-asan/%,$(CTEST_SRC))

.PHONY: lib test test-c test-asan clean fuzz examples cuda
# Keep objects between runs (make would delete them as intermediates of the test binaries).
.SECONDARY:

lib: $(LIB)

$(LIB): $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(SHARED) -o $@ $(OBJ) $(LDLIBS)

# Kernel files get -O3: their inner loops are written for the vectoriser.
build/obj/%_avx2.o: libh3/%_avx2.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -O3 $(AVX2_FLAGS) -c -o $@ $<

build/obj/%_generic.o: libh3/%_generic.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -O3 -Wno-psabi -c -o $@ $<

build/obj/%.o: libh3/%.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -c -o $@ $<

build/asan/%_avx2.o: libh3/%_avx2.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) $(AVX2_FLAGS) -c -o $@ $<

build/asan/%.o: libh3/%.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -Wno-psabi -c -o $@ $<

# C tests link the objects directly (not the .so) so they can reach internal functions.
build/tests/%: tests/c/%.c $(OBJ) tests/c/ctest.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Ilibh3 -o $@ $< $(OBJ) $(LDLIBS)

build/tests-asan/%: tests/c/%.c $(ASAN_OBJ) tests/c/ctest.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -Ilibh3 -o $@ $< $(ASAN_OBJ) $(LDLIBS)

test-c: $(CTEST_BIN)
	@set -e; for t in $(CTEST_BIN); do echo "== $$t"; $$t; done

test-asan: $(CTEST_ASAN)
	@set -e; for t in $(CTEST_ASAN); do echo "== $$t (asan+ubsan)"; \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 $$t; done

test: lib test-c test-asan examples

# Programs that use libh3 through its public header only, linked against the shared library.
examples: build/render

build/render: examples/render.c libh3/h3.h $(LIB)
	@mkdir -p build
	$(CC) -std=c11 -Wall -Wextra -O2 -Ilibh3 -o $@ $< -L$(dir $(LIB)) -lh3 -Wl,-rpath,'$$ORIGIN/../$(dir $(LIB))' $(LDLIBS)

# Coverage-guided fuzzing of the safetensors/JSON header reader under ASan+UBSan, bounded by an
# execution count. gcc's trace-pc instrumentation feeds tests/fuzz/driver.c (clang users can link
# tests/fuzz/fuzz_safetensors.c with -fsanitize=fuzzer instead).
FUZZ_RUNS ?= 200000
FUZZ_SRC  := libh3/core/util.c libh3/core/json.c libh3/core/safetensors.c
fuzz: build/fuzz/fuzz_safetensors
	build/fuzz/fuzz_safetensors $(FUZZ_RUNS)

build/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c tests/fuzz/driver.c $(FUZZ_SRC) $(HDR)
	@mkdir -p build/fuzz
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -fsanitize-coverage=trace-pc -Ilibh3 -c -o build/fuzz/target.o tests/fuzz/fuzz_safetensors.c
	for f in $(FUZZ_SRC); do $(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -fsanitize-coverage=trace-pc -c -o build/fuzz/$$(basename $$f .c).o $$f || exit 1; done
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -o $@ tests/fuzz/driver.c build/fuzz/target.o $(foreach f,$(FUZZ_SRC),build/fuzz/$(basename $(notdir $(f))).o) $(LDLIBS)

clean:
	rm -rf build $(LIB)

# ---- CUDA backend (begin) -------------------------------------------------------------------
# libh3_cuda: the CUDA backend as its own shared library next to libh3, loaded at run time by
# libh3/backend/backend.c, so one install serves machines with and without a GPU.
CUDA_LIB := python/h3ctl/libh3_cuda.$(LIBEXT)
cuda: $(CUDA_LIB)
# ---- CUDA backend (end) ---------------------------------------------------------------------
