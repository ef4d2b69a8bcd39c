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

.PHONY: lib test test-c test-asan clean fuzz examples cuda check-layers
# Keep objects between runs (make would delete them as intermediates of the test binaries).
.SECONDARY:

lib: $(LIB)

# The layers' include rules and the one environment reader (tests/test_layering.py): the library and
# the C tests are not built over a forbidden include (order-only, so it relinks nothing).
check-layers:
	@python3 tests/test_layering.py

$(LIB): $(OBJ) | check-layers
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
build/tests/%: tests/c/%.c $(OBJ) tests/c/ctest.h | check-layers
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Ilibh3 -o $@ $< $(OBJ) $(LDLIBS)

build/tests-asan/%: tests/c/%.c $(ASAN_OBJ) tests/c/ctest.h | check-layers
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -Ilibh3 -o $@ $< $(ASAN_OBJ) $(LDLIBS)

# test_backend_ops.c includes the decoders' op checks.
build/tests/test_backend_ops build/tests-asan/test_backend_ops: tests/c/backend_ops_decoders.inc
# test_dit.c and test_sp.c share the tiny checkpoint writer.
build/tests/test_dit build/tests-asan/test_dit build/tests/test_sp build/tests-asan/test_sp: tests/c/dit_checkpoint.inc
build/tests/test_backend_ops build/tests-asan/test_backend_ops: tests/c/backend_ops_int8.inc
build/tests/test_backend_ops build/tests-asan/test_backend_ops: tests/c/backend_ops_audio_enc.inc
build/tests/test_backend_ops build/tests-asan/test_backend_ops: tests/c/backend_ops_fp8.inc
build/tests/test_backend_ops build/tests-asan/test_backend_ops: tests/c/backend_ops_wstream.inc
build/tests/test_backend_ops build/tests-asan/test_backend_ops: tests/c/backend_ops_wpack.inc
build/tests/test_api_seq build/tests-asan/test_api_seq: tests/c/api_seq_model.inc

# test_backend_abi loads fake backend libraries (tests/c/fake_backend.c, plain C) built next to it.
FAKE_BACKENDS := noabi wrong hollow
build/tests/test_backend_abi: $(FAKE_BACKENDS:%=build/tests/fake_backend_%.so)
build/tests-asan/test_backend_abi: $(FAKE_BACKENDS:%=build/tests-asan/fake_backend_%.so)
build/tests/fake_backend_%.so: tests/c/fake_backend.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -shared -DFAKE_$* -o $@ $<
build/tests-asan/fake_backend_%.so: tests/c/fake_backend.c $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -shared -DFAKE_$* -o $@ $<

# test_cudnn_sdpa: cuDNN's attention host code (backend/cuda/cuda_sdpa_cudnn.cpp, plain C++17 as in
# libh3_cuda) against a recording double of cuDNN's backend API (tests/c/fake_cudnn.c) that the test
# loads from fake_cudnn/ next to itself; no GPU, no NVIDIA file. The graphs are compared with
# tests/c/cudnn_graphs/ (what cudnn-frontend built for the same calls).
CXX          ?= g++
CUDNN_SDPA    = libh3/backend/cuda/cuda_sdpa_cudnn.cpp
CUDNN_SDPA_H  = libh3/backend/cuda/cuda_sdpa.h libh3/backend/cuda/cudnn_api.h libh3/h3.h
CUDNN_CXXFLAGS = -std=c++17 -Wall -Wextra -Wshadow -fPIC -fvisibility=hidden -Ilibh3 -pthread
build/tests/cuda_sdpa_cudnn.o: $(CUDNN_SDPA) $(CUDNN_SDPA_H) Makefile
	@mkdir -p $(dir $@)
	$(CXX) $(CUDNN_CXXFLAGS) -O2 -g -c -o $@ $<
build/tests-asan/cuda_sdpa_cudnn.o: $(CUDNN_SDPA) $(CUDNN_SDPA_H) Makefile
	@mkdir -p $(dir $@)
	$(CXX) $(CUDNN_CXXFLAGS) -O1 -g $(SAN) -c -o $@ $<
build/tests/fake_cudnn/libcudnn.so.9 build/tests-asan/fake_cudnn/libcudnn.so.9: tests/c/fake_cudnn.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g -shared -o $@ $<
# The dispatcher's sub-library that the loader opens first (empty: the double is all in libcudnn.so.9).
build/tests/fake_cudnn/libcudnn_graph.so.9 build/tests-asan/fake_cudnn/libcudnn_graph.so.9: Makefile
	@mkdir -p $(dir $@)
	printf 'int h3_fake_cudnn_graph;\n' | $(CC) -x c -shared -fPIC -o $@ -
CUDNN_TEST_DEPS = tests/c/test_cudnn_sdpa.c tests/c/ctest.h $(wildcard tests/c/cudnn_graphs/*.txt)
build/tests/test_cudnn_sdpa: $(CUDNN_TEST_DEPS) build/tests/cuda_sdpa_cudnn.o \
  build/tests/fake_cudnn/libcudnn.so.9 build/tests/fake_cudnn/libcudnn_graph.so.9 | check-layers
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -DCUDNN_GRAPHS_DIR='"$(CURDIR)/tests/c/cudnn_graphs"' -o $@ $< \
	  build/tests/cuda_sdpa_cudnn.o -lstdc++ $(LDLIBS)
build/tests-asan/test_cudnn_sdpa: $(CUDNN_TEST_DEPS) build/tests-asan/cuda_sdpa_cudnn.o \
  build/tests-asan/fake_cudnn/libcudnn.so.9 build/tests-asan/fake_cudnn/libcudnn_graph.so.9 | check-layers
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -DCUDNN_GRAPHS_DIR='"$(CURDIR)/tests/c/cudnn_graphs"' -o $@ $< \
	  build/tests-asan/cuda_sdpa_cudnn.o -lstdc++ $(LDLIBS)

# cuDNN's attention on a GPU against a double reference and the own kernel, with timings (builds
# with the ordinary C++ compiler, no CUDA header; the own kernel comes from libh3_cuda):
# `make lib cuda build/sdpa_check && tests/cuda/run_sdpa_check.sh [--quick]`.
build/sdpa_check: tests/cuda/sdpa_check.cpp $(CUDNN_SDPA) $(CUDNN_SDPA_H) libh3/backend/backend.h
	@mkdir -p $(dir $@)
	$(CXX) $(CUDNN_CXXFLAGS) -O2 -g -o $@ tests/cuda/sdpa_check.cpp $(CUDNN_SDPA) -ldl

# test_nccl drives the NCCL communicator (backend/cuda/cuda_nccl.cpp: plain C++, no CUDA header, so the
# host compiler builds it) against fake libnccl libraries (tests/c/fake_nccl.c) built next to it.
CXX_HOST ?= g++
FAKE_NCCLS := ok initfail hang old nosend
build/obj/backend/cuda/cuda_nccl.o: libh3/backend/cuda/cuda_nccl.cpp libh3/backend/comm.h $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CXX_HOST) -std=c++17 -O2 -g -Wall -Wextra -Wshadow -fPIC -fvisibility=hidden -Ilibh3 -c -o $@ $<
build/asan/backend/cuda/cuda_nccl.o: libh3/backend/cuda/cuda_nccl.cpp libh3/backend/comm.h $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CXX_HOST) -std=c++17 -O1 -g $(SAN) -Wall -Wextra -Wshadow -fPIC -fvisibility=hidden -Ilibh3 -c -o $@ $<
build/tests/test_nccl: tests/c/test_nccl.c build/obj/backend/cuda/cuda_nccl.o $(OBJ) tests/c/ctest.h \
                       $(FAKE_NCCLS:%=build/tests/fake_nccl_%.so) | check-layers
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -Ilibh3 -o $@ $< build/obj/backend/cuda/cuda_nccl.o $(OBJ) $(LDLIBS) -lstdc++
build/tests-asan/test_nccl: tests/c/test_nccl.c build/asan/backend/cuda/cuda_nccl.o $(ASAN_OBJ) tests/c/ctest.h \
                            $(FAKE_NCCLS:%=build/tests-asan/fake_nccl_%.so) | check-layers
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 -g $(SAN) -Ilibh3 -o $@ $< build/asan/backend/cuda/cuda_nccl.o $(ASAN_OBJ) $(LDLIBS) -lstdc++
FAKE_NCCL_CC = $(CC) -std=c11 -Wall -Wextra -O1 -fPIC -fvisibility=hidden -shared -D_DEFAULT_SOURCE \
               -DFAKE_NCCL_$(shell echo $* | tr a-z A-Z) -o $@ $<
build/tests/fake_nccl_%.so: tests/c/fake_nccl.c Makefile
	@mkdir -p $(dir $@)
	$(FAKE_NCCL_CC)
build/tests-asan/fake_nccl_%.so: tests/c/fake_nccl.c Makefile
	@mkdir -p $(dir $@)
	$(FAKE_NCCL_CC)

test-c: check-layers $(CTEST_BIN)
	@set -e; for t in $(CTEST_BIN); do echo "== $$t"; $$t; done

test-asan: check-layers $(CTEST_ASAN)
	@set -e; for t in $(CTEST_ASAN); do echo "== $$t (asan+ubsan)"; \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 $$t; done

test: lib test-c test-asan examples

# Programs that use libh3 through its public header only, linked against the shared library.
examples: build/render

build/render: examples/render.c libh3/h3.h $(LIB)
	@mkdir -p build
	$(CC) -std=c11 -Wall -Wextra -O2 -Ilibh3 -o $@ $< -L$(dir $(LIB)) -lh3 -Wl,-rpath,'$$ORIGIN/../$(dir $(LIB))' $(LDLIBS)

# Coverage-guided fuzzing under ASan+UBSan, bounded by an execution count (FUZZ_RUNS): the
# safetensors header reader (`fuzz`), the JSON reader (`fuzz-json`) and the tokenizer.json loader
# with the encoder it builds (`fuzz-tokenizer`). gcc's trace-pc instrumentation of the library
# sources feeds tests/fuzz/driver.c; each target brings its seeds and dictionary (tests/fuzz/fuzz.h).
# clang users can link a tests/fuzz/fuzz_*.c target with -fsanitize=fuzzer instead.
FUZZ_RUNS ?= 200000
FUZZ_SRC_safetensors := libh3/core/util.c libh3/core/json.c libh3/core/safetensors.c libh3/core/singlefile.c \
                        libh3/core/quant_formats.c libh3/core/tuning.c
FUZZ_SRC_json        := libh3/core/util.c libh3/core/json.c
FUZZ_SRC_tokenizer   := libh3/core/util.c libh3/core/json.c libh3/core/tokenizer.c libh3/core/unicode_tables.c
FUZZ_CFLAGS := $(CFLAGS_BASE) -O1 -g $(SAN)

.PHONY: fuzz-json fuzz-tokenizer
fuzz: build/fuzz/fuzz_safetensors
	build/fuzz/fuzz_safetensors $(FUZZ_RUNS)
fuzz-json: build/fuzz/fuzz_json
	build/fuzz/fuzz_json $(FUZZ_RUNS)
fuzz-tokenizer: build/fuzz/fuzz_tokenizer
	build/fuzz/fuzz_tokenizer $(FUZZ_RUNS)

# One fuzzer: its target and the library sources it reaches, instrumented, in a folder of its own
# (so two fuzzers can build at once); the driver itself is not instrumented.
define FUZZER
build/fuzz/fuzz_$(1): tests/fuzz/fuzz_$(1).c tests/fuzz/driver.c tests/fuzz/fuzz.h $$(FUZZ_SRC_$(1)) $$(HDR)
	@mkdir -p build/fuzz/$(1)
	$$(CC) $$(FUZZ_CFLAGS) -fsanitize-coverage=trace-pc -Itests/fuzz -c -o build/fuzz/$(1)/target.o tests/fuzz/fuzz_$(1).c
	for f in $$(FUZZ_SRC_$(1)); do $$(CC) $$(FUZZ_CFLAGS) -fsanitize-coverage=trace-pc -c -o build/fuzz/$(1)/$$$$(basename $$$$f .c).o $$$$f || exit 1; done
	$$(CC) $$(FUZZ_CFLAGS) -Itests/fuzz -o $$@ tests/fuzz/driver.c build/fuzz/$(1)/target.o $$(foreach f,$$(FUZZ_SRC_$(1)),build/fuzz/$(1)/$$(basename $$(notdir $$(f))).o) $$(LDLIBS)
endef
$(foreach t,safetensors json tokenizer,$(eval $(call FUZZER,$(t))))

clean:
	rm -rf build $(LIB)

# ---- CUDA backend (begin) -------------------------------------------------------------------
# libh3_cuda: the CUDA backend as its own shared library next to libh3, loaded at run time by
# libh3/backend/backend.c, so one install serves machines with and without a GPU.
#
# Built by the ordinary C++ compiler with no CUDA header and no CUDA library at build time: the
# host code (libh3/backend/cuda/*.cpp) reaches the GPU through the driver API, and libcuda.so.1,
# libnvrtc.so.13 and libcublasLt.so.13 are opened at run time (cuda_loader.cpp). The kernels
# (libh3/backend/cuda/kernels/*.cu, device code only) are embedded as byte arrays and compiled by
# NVRTC for the GPU found, cached on disk (cuda_kernels.cpp). `make cuda` works on any Linux
# machine with g++ or clang++; CUDA_CXX picks the compiler.
CUDA_LIB      := python/h3ctl/libh3_cuda.$(LIBEXT)
CUDA_CXX      ?= $(or $(shell command -v g++ 2>/dev/null),$(shell command -v clang++ 2>/dev/null),c++)
CUDA_CXXFLAGS ?= -O2 -g
CUDA_WERROR   ?=
CUDA_BASE      = -std=c++17 -fPIC -fvisibility=hidden -Wall -Wextra $(CUDA_WERROR) -Ilibh3
# Every .cpp of the folder (the cuDNN path, NCCL, ...).
CUDA_SRC      := $(sort $(wildcard libh3/backend/cuda/*.cpp))
CUDA_HDR      := $(wildcard libh3/backend/cuda/*.h) libh3/backend/cuda/kernels/h3k.h libh3/backend/backend.h \
                 libh3/core/internal.h libh3/core/wpack.h libh3/h3.h libh3/h3_stages.h
CUDA_KERNELS  := $(sort $(wildcard libh3/backend/cuda/kernels/*.cu libh3/backend/cuda/kernels/*.h))
CUDA_OBJ      := $(patsubst libh3/%.cpp,build/cuda/%.o,$(CUDA_SRC)) build/cuda/kernels_src.o

cuda: $(CUDA_LIB)

build/cuda/%.o: libh3/%.cpp $(CUDA_HDR) Makefile
	@mkdir -p $(dir $@)
	$(CUDA_CXX) $(CUDA_BASE) $(CUDA_CXXFLAGS) -c -o $@ $<

build/cuda/embed_kernels: libh3/backend/cuda/embed_kernels.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -o $@ $<

build/cuda/kernels_src.cpp: build/cuda/embed_kernels $(CUDA_KERNELS)
	build/cuda/embed_kernels $@ $(CUDA_KERNELS)

build/cuda/kernels_src.o: build/cuda/kernels_src.cpp
	$(CUDA_CXX) $(CUDA_BASE) -O0 -c -o $@ $<

# The exported symbols: the backend entry points and the compile check (tests). A version script
# hides everything else, including the std:: template instantiations libstdc++'s headers give
# default visibility; -static-libstdc++ so the library loads next to any libstdc++ in the process.
$(CUDA_LIB): $(CUDA_OBJ)
	@mkdir -p $(dir $@) build/cuda
	@printf '{ global: h3_backend_cuda_create; h3_backend_cuda_abi; h3_cuda_compile_check; h3_backend_cuda_stream; h3_comm_nccl_create; h3_comm_nccl_version; local: *; };\n' > build/cuda/exports.map
	$(CUDA_CXX) -shared -o $@ $(CUDA_OBJ) -static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL \
	  -Wl,--version-script=build/cuda/exports.map -Wl,--no-undefined -lpthread -ldl

.PHONY: cuda-clean
clean: cuda-clean
cuda-clean:
	rm -f $(CUDA_LIB)
# ---- CUDA backend (end) ---------------------------------------------------------------------

# ---- Metal kernels in emulation (shaders/metal, tests/metal_emu) ------------------------------
# The .metal kernels compile as C++17 against shaders/metal/msl_emu.h and run in the fiber emulator
# (tests/metal_emu/msl_emu.cpp); `make test-metal-emu` runs the emulator's own checks and the
# kernels' conformance to the ops' double references. g++ (or any C++17 compiler) is enough.
METAL_CXX      ?= g++
METAL_CXXFLAGS ?= -std=c++17 -O2 -g -Wall -Wextra
METAL_EMU_DIR   = build/metal_emu
METAL_SRC       = $(wildcard shaders/metal/*.metal) shaders/metal/h3_metal.h shaders/metal/msl_emu.h
$(METAL_EMU_DIR)/msl_emu.o: tests/metal_emu/msl_emu.cpp shaders/metal/msl_emu.h
	@mkdir -p $(dir $@)
	$(METAL_CXX) $(METAL_CXXFLAGS) -c -o $@ $<
# -Wno-attributes: g++ does not know MSL's [[buffer(n)]], [[host_name(...)]], ... and ignores them.
$(METAL_EMU_DIR)/kernels_emu.o: tests/metal_emu/kernels_emu.cpp tests/metal_emu/kernels_emu.h $(METAL_SRC)
	@mkdir -p $(dir $@)
	$(METAL_CXX) $(METAL_CXXFLAGS) -Wno-attributes -c -o $@ $<
$(METAL_EMU_DIR)/test_msl_emu: tests/metal_emu/test_msl_emu.cpp $(METAL_EMU_DIR)/msl_emu.o shaders/metal/msl_emu.h
	$(METAL_CXX) $(METAL_CXXFLAGS) -Wno-attributes -o $@ $< $(METAL_EMU_DIR)/msl_emu.o
# libh3's step function, which the euler kernel must reproduce bit for bit.
$(METAL_EMU_DIR)/schedule.o: libh3/core/schedule.c libh3/core/schedule.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Ilibh3 -c -o $@ $<
$(METAL_EMU_DIR)/test_metal_kernels: tests/metal_emu/test_metal_kernels.cpp tests/metal_emu/kernels_emu.h \
                                     $(METAL_EMU_DIR)/kernels_emu.o $(METAL_EMU_DIR)/msl_emu.o $(METAL_EMU_DIR)/schedule.o
	$(METAL_CXX) $(METAL_CXXFLAGS) -o $@ $< $(METAL_EMU_DIR)/kernels_emu.o $(METAL_EMU_DIR)/msl_emu.o \
	  $(METAL_EMU_DIR)/schedule.o -lm
.PHONY: test-metal-emu
# The kernels in the emulator, then (where GNU Objective-C and GNUstep are, installed best effort as .ci/run
# does) the Objective-C host against the Metal test double: op conformance (test_backend_ops's metal part).
test-metal-emu: $(METAL_EMU_DIR)/test_msl_emu $(METAL_EMU_DIR)/test_metal_kernels
	$(METAL_EMU_DIR)/test_msl_emu
	$(METAL_EMU_DIR)/test_metal_kernels
ifneq ($(UNAME_S),Darwin)
	@bash tests/metal_double/install_deps.sh
	$(MAKE) metal-double lib build/tests/test_backend_ops
	build/tests/test_backend_ops
endif
# The strict check: clang compiles the kernels with device / constant / threadgroup as distinct
# address spaces (shaders/metal/msl_emu.h under H3_MSL_STRICT), so a pointer of one address space
# handed to another fails as in MSL; tests/metal_emu/strict_bad.metal's three cases must fail.
# Stock clang cannot take two MSL spellings, so a copy is compiled with them rewritten:
# [[threadgroup(0)]] (the address-space macro would eat the word) and the explicit instantiations'
# [[host_name(...)]] (Apple's compiler only). Syntax only: nothing runs.
METAL_CLANG    ?= clang++
METAL_STRICT    = build/metal_strict
METAL_STRICT_FLAGS = -x c++ -std=c++17 -fsyntax-only -Wall -Wextra -Wno-unknown-attributes -DH3_MSL_EMU -DH3_MSL_STRICT
.PHONY: test-metal-strict
test-metal-strict: $(METAL_SRC) tests/metal_emu/strict_bad.metal
	@command -v $(METAL_CLANG) >/dev/null || { echo "test-metal-strict: $(METAL_CLANG) not found"; exit 2; }
	@mkdir -p $(METAL_STRICT)
	@cp shaders/metal/msl_emu.h shaders/metal/h3_metal.h $(METAL_STRICT)/
	@for f in $(wildcard shaders/metal/*.metal) tests/metal_emu/strict_bad.metal; do \
	  sed -e 's/\[\[threadgroup(/[[h3_threadgroup(/g' -e 's/\[\[host_name([^)]*)\]\]//g' $$f > $(METAL_STRICT)/$${f##*/}; done
	@for f in $(notdir $(wildcard shaders/metal/*.metal)); do \
	  $(METAL_CLANG) $(METAL_STRICT_FLAGS) $(METAL_STRICT)/$$f || exit 1; echo "strict: $$f compiles"; done
	@$(METAL_CLANG) $(METAL_STRICT_FLAGS) $(METAL_STRICT)/strict_bad.metal || exit 1
	@for c in TG_AS_DEVICE DEVICE_AS_THREAD DEVICE_AS_TG; do \
	  if $(METAL_CLANG) $(METAL_STRICT_FLAGS) -DH3_BAD_$$c $(METAL_STRICT)/strict_bad.metal 2>$(METAL_STRICT)/bad.log; then \
	    echo "strict: H3_BAD_$$c compiled: address spaces are not checked"; exit 1; fi; \
	  echo "strict: H3_BAD_$$c refused: $$(grep -m1 error: $(METAL_STRICT)/bad.log | sed 's/.*error: //')"; done
# ---- Metal kernels in emulation (end) ---------------------------------------------------------

# ---- Metal backend (begin) ------------------------------------------------------------------
# libh3_metal: the Metal backend (libh3/backend/metal/*.m, Objective-C with manual reference
# counting) as its own shared library next to libh3, loaded at run time as libh3_cuda is
# (backend.c). The kernels' source is embedded (shaders/metal/embed.py) and compiled by Metal at
# backend creation (newLibraryWithSource).
#   Darwin: clang against Metal.framework and Foundation: `make metal` (hatch_build.py runs it on a Mac).
#   Linux:  GNU Objective-C against GNUstep's Foundation and our declarations of the Metal API
#           (metal_api.h), linked with the test double of tests/metal_double/, whose dispatches run
#           the kernels in the MSL emulator: `make metal-double` (needs gobjc and
#           libgnustep-base-dev; .ci/run installs them). Test builds only: nothing ships it.
METAL_HOST_SRC := $(sort $(wildcard libh3/backend/metal/*.m))
METAL_HOST_HDR := $(wildcard libh3/backend/metal/*.h) libh3/backend/backend.h libh3/core/internal.h libh3/h3.h \
                  shaders/metal/h3_metal.h
METAL_SHADERS  := shaders/metal/h3_gemm.metal shaders/metal/h3_attention.metal shaders/metal/h3_rows.metal \
                  shaders/metal/h3_eltwise.metal shaders/metal/h3_decoders.metal shaders/metal/h3_knobs.metal
METAL_LIB      := python/h3ctl/libh3_metal.$(LIBEXT)
PYTHON3        ?= python3
build/metal/metal_shaders.c: shaders/metal/embed.py shaders/metal/h3_metal.h $(METAL_SHADERS)
	@mkdir -p $(dir $@)
	$(PYTHON3) shaders/metal/embed.py $@ shaders/metal/h3_metal.h $(METAL_SHADERS)
ifeq ($(UNAME_S),Darwin)
METAL_OBJC     ?= clang
METAL_OBJ      := $(patsubst libh3/backend/metal/%.m,build/metal/%.o,$(METAL_HOST_SRC)) build/metal/metal_shaders.o
build/metal/%.o: libh3/backend/metal/%.m $(METAL_HOST_HDR) Makefile
	@mkdir -p $(dir $@)
	$(METAL_OBJC) -x objective-c -fno-objc-arc -std=gnu11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -fPIC \
	  -fvisibility=hidden -Ilibh3 -c -o $@ $<
build/metal/metal_shaders.o: build/metal/metal_shaders.c
	$(METAL_OBJC) -std=c11 $(OPT) -fPIC -fvisibility=hidden -c -o $@ $<
$(METAL_LIB): $(METAL_OBJ)
	$(METAL_OBJC) -dynamiclib -o $@ $(METAL_OBJ) -framework Metal -framework Foundation \
	  -Wl,-exported_symbol,_h3_backend_metal_create -Wl,-exported_symbol,_h3_backend_metal_abi
.PHONY: metal
metal: $(METAL_LIB)
else
# GNUstep's headers are read as system headers: they are not -Wall -Wextra clean.
GNUSTEP_INC    ?= /usr/include/GNUstep
METAL_OBJC     ?= gcc
METAL_OBJCFLAGS = -x objective-c -std=gnu11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -fPIC -fvisibility=hidden \
                  -DGNUSTEP -DGNUSTEP_BASE_LIBRARY=1 -DGNU_RUNTIME=1 -fno-strict-aliasing -fexceptions \
                  -fobjc-exceptions -fconstant-string-class=NSConstantString -isystem $(GNUSTEP_INC) -Ilibh3
METAL_DOUBLE   := build/metal_double
METAL_DOBJ     := $(patsubst libh3/backend/metal/%.m,$(METAL_DOUBLE)/%.o,$(METAL_HOST_SRC)) \
                  $(METAL_DOUBLE)/metal_shaders.o $(METAL_DOUBLE)/mtl_double.o $(METAL_DOUBLE)/kernels_all.o \
                  $(METAL_DOUBLE)/msl_emu.o
$(METAL_DOUBLE)/.objc-ok:
	@mkdir -p $(dir $@)
	@{ command -v $(METAL_OBJC) >/dev/null && test -f $(GNUSTEP_INC)/Foundation/Foundation.h && \
	  test -x "$$($(METAL_OBJC) -print-prog-name=cc1obj)"; } || { echo "metal-double: needs GNU Objective-C \
	  ($(METAL_OBJC) with cc1obj: apt-get install gobjc) and GNUstep's Foundation headers in $(GNUSTEP_INC) \
	  (apt-get install libgnustep-base-dev)"; exit 2; }
	@touch $@
$(METAL_DOUBLE)/%.o: libh3/backend/metal/%.m $(METAL_HOST_HDR) Makefile | $(METAL_DOUBLE)/.objc-ok
	$(METAL_OBJC) $(METAL_OBJCFLAGS) -c -o $@ $<
$(METAL_DOUBLE)/mtl_double.o: tests/metal_double/mtl_double.m tests/metal_double/kernel_table.h \
                              libh3/backend/metal/metal_api.h | $(METAL_DOUBLE)/.objc-ok
	$(METAL_OBJC) $(METAL_OBJCFLAGS) -c -o $@ $<
$(METAL_DOUBLE)/metal_shaders.o: build/metal/metal_shaders.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -fPIC -fvisibility=hidden -c -o $@ $<
# The double's kernel table, generated from the kernels' own [[buffer(n)]] / position attributes.
$(METAL_DOUBLE)/kernel_table.inc: tests/metal_double/gen_kernels.py $(METAL_SHADERS)
	@mkdir -p $(dir $@)
	for f in $(METAL_SHADERS); do $(METAL_CXX) -x c++ -E -P -DH3_METAL_H $$f || exit 1; done > $(METAL_DOUBLE)/kernels.pp
	$(PYTHON3) tests/metal_double/gen_kernels.py $(METAL_DOUBLE)/kernels.pp > $@
$(METAL_DOUBLE)/kernels_all.o: tests/metal_double/kernels_all.cpp tests/metal_double/kernel_table.h \
                               $(METAL_DOUBLE)/kernel_table.inc $(METAL_SRC)
	$(METAL_CXX) $(METAL_CXXFLAGS) -fPIC -fvisibility=hidden -Wno-attributes -I$(METAL_DOUBLE) -c -o $@ $<
$(METAL_DOUBLE)/msl_emu.o: tests/metal_emu/msl_emu.cpp shaders/metal/msl_emu.h
	@mkdir -p $(dir $@)
	$(METAL_CXX) $(METAL_CXXFLAGS) -fPIC -fvisibility=hidden -c -o $@ $<
$(METAL_LIB): $(METAL_DOBJ)
	@printf '{ global: h3_backend_metal_create; h3_backend_metal_abi; local: *; };\n' > $(METAL_DOUBLE)/exports.map
	$(METAL_CXX) -shared -o $@ $(METAL_DOBJ) -Wl,--version-script=$(METAL_DOUBLE)/exports.map -lgnustep-base -lobjc
.PHONY: metal-double
metal-double: $(METAL_LIB)
endif
.PHONY: metal-clean
clean: metal-clean
metal-clean:
	rm -f $(METAL_LIB)
# ---- Metal backend (end) --------------------------------------------------------------------
