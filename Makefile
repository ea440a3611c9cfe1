# npulm build: `make` builds build/npulm and build/libnpulm.a; `make test` runs every test.
# `make SAN=1 test` does the same under AddressSanitizer + UndefinedBehaviorSanitizer in build-san/.
# `make CLANG=1` builds everything (library, CLI, tests, benchmarks, fuzz harnesses) with clang and
# its warnings on a variable read before it is set on some path, as errors, in build-clang/.
# `make TSAN=1 test` runs the tests under ThreadSanitizer (clang) in build-tsan/.
# `make format` applies .clang-format to every C file; `make format-check` fails on any that differs.
# `make CROSS=aarch64` cross-builds the library, CLI, tests and benchmarks for AArch64 Linux with
# aarch64-linux-gnu-gcc in build-aarch64/ (Debian's arm64 libraries: .ci/install-deps);
# `make CROSS=aarch64 test-cross` runs the kernel tests and the end-to-end checks of tests/cross/
# under qemu-aarch64, against the x86 build in build/ (which it builds first).
# `make shared` builds the shared library (build/libnpulm.so.VERSION); `make install PREFIX=/usr/local
# DESTDIR=` installs the CLI, the header, both libraries and npulm.pc; `make uninstall` removes them.

BUILD := build
OPT := -O2 -g
WARN := -Wall -Wextra -Werror
CLANG_WARN := -Wconditional-uninitialized -Wsometimes-uninitialized
ifeq ($(SAN)$(TSAN),11)
$(error SAN=1 and TSAN=1 do not combine: AddressSanitizer and ThreadSanitizer exclude each other)
endif
ifeq ($(SAN),1)
BUILD := build-san
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
else ifeq ($(TSAN),1)
CC := clang
BUILD := build-tsan
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=thread
WARN += $(CLANG_WARN)
else ifeq ($(CLANG),1)
CC := clang
BUILD := build-clang
WARN += $(CLANG_WARN)
else ifeq ($(CROSS),aarch64)
CC := aarch64-linux-gnu-gcc
AR := aarch64-linux-gnu-ar
BUILD := build-aarch64
else ifneq ($(CROSS),)
$(error CROSS=$(CROSS): the only cross target is aarch64)
endif

# -ffp-contract=off: no fused multiply-adds, whose single rounding would break the float kernels'
# bit-exactness with the reference (GCC's default under -std=c11 already; not Clang's)
CFLAGS += -std=c11 -D_POSIX_C_SOURCE=200809L $(WARN) -ffp-contract=off -Iinclude -Isrc -pthread \
          $(OPT)
LDFLAGS += $(filter -fsanitize%,$(OPT))
LDLIBS := -lpcre2-8 -lxxhash -lm -pthread

SRCS := $(shell find src -name '*.c' | sort)
OBJS := $(SRCS:%.c=$(BUILD)/%.o)
TEST_SRCS := $(sort $(wildcard tests/test_*.c))
TESTS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

.PHONY: all test tests clean fuzz fuzz-program fuzz-run fuzz-run-gguf fuzz-run-program bench \
        format format-check shared install uninstall
all: $(BUILD)/npulm

$(BUILD)/libnpulm.a: $(OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

TOOL_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tools/*.c)))
# npulm serve (tools/serve.c) is built on libmicrohttpd; the arm64 one is found where multiarch
# puts it, as the other libraries are
MHD_CFLAGS := $(shell pkg-config --cflags libmicrohttpd 2>/dev/null)
MHD_LIBS := $(or $(shell pkg-config --libs libmicrohttpd 2>/dev/null),-lmicrohttpd)
$(TOOL_OBJS): CFLAGS += $(MHD_CFLAGS)
$(BUILD)/npulm: $(TOOL_OBJS) $(BUILD)/libnpulm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(MHD_LIBS) -ljansson $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libnpulm.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LDLIBS)

# test_noalloc counts every allocation call the library makes, through link-time wrappers
$(BUILD)/tests/test_noalloc: LDFLAGS += \
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=aligned_alloc,--wrap=posix_memalign

# test_dequant reads llama.cpp's expected digests (JSON) and hashes every dequantized tensor
$(BUILD)/tests/test_dequant: LDLIBS += -ljansson -lnettle

# npulm's reference logits for npulm export's ONNX checks (tests/cli/test_export.sh); not a
# test_* program, so tests/run.sh does not run it as one
EXPORT_REF := $(BUILD)/tests/export_ref
$(EXPORT_REF): $(BUILD)/tests/export/ref_logits.o $(BUILD)/libnpulm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

tests: $(TESTS) $(EXPORT_REF)

# The version, from include/npulm.h's macros, and the git commit the library is built from
# ("unknown" outside a git checkout), which only src/base/version.c sees: $(BUILD)/commit is
# rewritten when the commit changes, and that object is rebuilt with it.
version_part = $(shell awk '$$2 == "NPULM_VERSION_$(1)" { print $$3 }' include/npulm.h)
VERSION_MAJOR := $(call version_part,MAJOR)
VERSION := $(VERSION_MAJOR).$(call version_part,MINOR).$(call version_part,PATCH)
COMMIT := $(shell [ -e .git ] && git describe --always --dirty 2>/dev/null || echo unknown)
VERSION_OBJS := $(BUILD)/src/base/version.o $(BUILD)/pic/src/base/version.o
$(VERSION_OBJS): $(BUILD)/commit
$(VERSION_OBJS): CFLAGS += -DNPULM_COMMIT='"$(COMMIT)"'
$(BUILD)/commit: FORCE
	@mkdir -p $(dir $@)
	@[ "$$(cat $@ 2>/dev/null)" = '$(COMMIT)' ] || echo '$(COMMIT)' >$@
FORCE:

# The shared library, `make shared` (and make install; plain make does not build it): the library's
# objects again, position-independent, in $(BUILD)/pic/, exporting only the npulm_* API
# (src/libnpulm.map), its soname libnpulm.so.MAJOR.
SONAME := libnpulm.so.$(VERSION_MAJOR)
SHLIB := $(BUILD)/libnpulm.so.$(VERSION)
PIC_OBJS := $(SRCS:%.c=$(BUILD)/pic/%.o)
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -MMD -MP -c $< -o $@
$(SHLIB): $(PIC_OBJS) src/libnpulm.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=src/libnpulm.map -o $@ \
	  $(PIC_OBJS) $(LDLIBS)
shared: $(SHLIB)

# `make install PREFIX=/usr/local DESTDIR=`: the CLI, both headers, both libraries and npulm.pc
# (pkg-config) under DESTDIR/PREFIX; `make uninstall` removes them.
PREFIX := /usr/local
DEST := $(DESTDIR)$(PREFIX)
install: $(BUILD)/npulm $(BUILD)/libnpulm.a $(SHLIB)
	install -d "$(DEST)/bin" "$(DEST)/include" "$(DEST)/lib/pkgconfig"
	install -m 755 $(BUILD)/npulm "$(DEST)/bin/"
	install -m 644 include/npulm.h include/npulm_bench.h "$(DEST)/include/"
	install -m 644 $(BUILD)/libnpulm.a "$(DEST)/lib/"
	install -m 755 $(SHLIB) "$(DEST)/lib/"
	ln -sf libnpulm.so.$(VERSION) "$(DEST)/lib/$(SONAME)"
	ln -sf $(SONAME) "$(DEST)/lib/libnpulm.so"
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS_PRIVATE@|$(LDLIBS)|' \
	  src/npulm.pc.in >"$(DEST)/lib/pkgconfig/npulm.pc"
uninstall:
	rm -f "$(DEST)/bin/npulm" "$(DEST)/include/npulm.h" "$(DEST)/include/npulm_bench.h" \
	  "$(DEST)/lib/pkgconfig/npulm.pc" \
	  "$(DEST)/lib/libnpulm.a" "$(DEST)/lib/libnpulm.so.$(VERSION)" "$(DEST)/lib/$(SONAME)" \
	  "$(DEST)/lib/libnpulm.so"

# Microbenchmarks (not tests): `make bench && build/bench/npu_kernels [runs]`,
# `build/bench/program_load FILE.npu [runs]`
BENCHES := $(BUILD)/bench/npu_kernels $(BUILD)/bench/program_load $(BUILD)/bench/export_windows
bench: $(BENCHES)
$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libnpulm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# CLANG=1 builds every C file of the tree, the fuzz harnesses as objects (they link only with
# -fsanitize=fuzzer, below)
ifeq ($(CLANG),1)
all: $(TESTS) $(EXPORT_REF) $(BENCHES) $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard fuzz/*.c)))
endif
ifeq ($(CROSS),aarch64)
all: $(TESTS) $(BENCHES)
endif

# Under ThreadSanitizer the first race ends the process; and clang 14's TSan cannot place its
# shadow memory under a newer kernel's wider address randomization (vm.mmap_rnd_bits > 28), so the
# tests run without randomization (setarch -R, inherited by every process they start) where the
# system lets them turn it off.
ifeq ($(TSAN),1)
TEST_ENV := TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)"
TEST_WRAP := $(shell setarch $$(uname -m) -R true 2>/dev/null && echo setarch $$(uname -m) -R)
endif

test: $(BUILD)/npulm $(TESTS) $(EXPORT_REF)
	@$(TEST_ENV) $(TEST_WRAP) tests/run.sh $(BUILD)

# The cross build's tests under qemu-aarch64 (`make CROSS=aarch64 test-cross`): the kernel tests
# and those quick under emulation, the NPU's float-free check on the AArch64 objects, then
# tests/cross/, which compares the AArch64 build's text with the host build's (build/npulm, made
# first). Debian's cross loader (libc6-arm64-cross) and its
# arm64 libc (libc6:arm64, which the arm64 libraries bring) may be different releases that must
# not be mixed: the loader finds the libc beside it first (LD_LIBRARY_PATH), the other libraries
# where multiarch puts them.
QEMU_AARCH64 := qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
CROSS_TESTS := test_npu_kernels test_cpu_kernels test_costmodel test_dequant test_gguf test_model \
               test_pages test_ref test_sampler test_scheduler test_synth test_threads test_tokenizer
.PHONY: test-cross
ifeq ($(CROSS),aarch64)
test-cross: $(BUILD)/npulm $(CROSS_TESTS:%=$(BUILD)/tests/%)
	@$(MAKE) --no-print-directory CROSS= build/npulm
	@NPULM_EXEC="$(QEMU_AARCH64)" NPULM_HOST_BIN=build/npulm tests/run.sh $(BUILD) \
	  $(CROSS_TESTS:%=$(BUILD)/tests/%) tests/cli/test_npu_float_free.sh tests/cross/test_*.sh
else
test-cross:
	$(error test-cross runs a cross build's tests: make CROSS=aarch64 test-cross)
endif

# libFuzzer harnesses (clang only; fuzz/README.md): `make fuzz` builds build-fuzz/fuzz_gguf and its
# seeds in build-fuzz/seeds/gguf/, `make fuzz-program` build-fuzz/fuzz_program and its seeds (a
# program of every quantization mode) in build-fuzz/seeds/program/; `make -j2 fuzz-run` runs both
# from their seeds for FUZZ_SECONDS each (default 60), keeping new inputs in build-fuzz/corpus/.
FUZZ := build-fuzz
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror $(CLANG_WARN) \
               -ffp-contract=off -Iinclude -Isrc -pthread -g -O1 -fno-omit-frame-pointer \
               -fsanitize=fuzzer-no-link $(FUZZ_SAN)
FUZZ_SECONDS := 60
FUZZ_OBJS := $(SRCS:%.c=$(FUZZ)/obj/%.o)

$(FUZZ)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ)/libnpulm.a: $(FUZZ_OBJS)
	@rm -f $@
	$(AR) rcs $@ $^

FUZZERS := $(FUZZ)/fuzz_gguf $(FUZZ)/fuzz_program
$(FUZZERS): $(FUZZ)/fuzz_%: $(FUZZ)/obj/fuzz/fuzz_%.o $(FUZZ)/libnpulm.a
	clang -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ $(LDLIBS)

# each harness writes its seeds when NPULM_FUZZ_SEEDS names a folder; whole or not at all
$(FUZZERS:$(FUZZ)/fuzz_%=$(FUZZ)/seeds/%): $(FUZZ)/seeds/%: $(FUZZ)/fuzz_%
	@rm -rf $@ $@.tmp && mkdir -p $@.tmp
	NPULM_FUZZ_SEEDS=$@.tmp $<
	@mv $@.tmp $@

fuzz: $(FUZZ)/fuzz_gguf $(FUZZ)/seeds/gguf
fuzz-program: $(FUZZ)/fuzz_program $(FUZZ)/seeds/program

fuzz-run: fuzz-run-gguf fuzz-run-program
fuzz-run-gguf: FUZZ_ARGS := -max_len=4096 -timeout=10 -rss_limit_mb=2048
fuzz-run-program: FUZZ_ARGS := -max_len=131072 -timeout=20 -rss_limit_mb=4096
# libFuzzer's summary, or on a failure the log's last 80 lines (the report)
fuzz-run-gguf fuzz-run-program: fuzz-run-%: $(FUZZ)/fuzz_% $(FUZZ)/seeds/%
	@mkdir -p $(FUZZ)/corpus/$* $(FUZZ)/artifacts/$*
	@echo "fuzz_$*: $(FUZZ_SECONDS) s from $(FUZZ)/seeds/$*"
	@$< $(FUZZ)/corpus/$* $(FUZZ)/seeds/$* $(FUZZ_ARGS) -max_total_time=$(FUZZ_SECONDS) \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ)/artifacts/$*/ >$(FUZZ)/fuzz_$*.log 2>&1 \
	  || { tail -n 80 $(FUZZ)/fuzz_$*.log; echo "fuzz_$*: FAILED (log: $(FUZZ)/fuzz_$*.log)"; exit 1; }
	@grep -h '^Done\|^stat::new_units_added\|^stat::peak_rss_mb' $(FUZZ)/fuzz_$*.log \
	  | sed 's/^/fuzz_$*: /'

clean:
	rm -rf build build-san build-clang build-tsan build-aarch64 $(FUZZ)

# Every C file of the repository in .clang-format's style: `make format` rewrites them in place,
# `make format-check` (CI) lists each file that differs and fails.
FORMAT_FILES = $(shell git ls-files '*.c' '*.h' '*.inc' 2>/dev/null || \
  find include src tools tests bench fuzz -name '*.[ch]' -o -name '*.inc')
format:
	clang-format -i $(FORMAT_FILES)
format-check:
	@clang-format --dry-run --Werror $(FORMAT_FILES) && echo "$(words $(FORMAT_FILES)) files formatted as .clang-format says"

-include $(OBJS:.o=.d) $(PIC_OBJS:.o=.d) $(TESTS:=.d) $(BUILD)/tests/export/ref_logits.d $(BENCHES:=.d) $(TOOL_OBJS:.o=.d) $(FUZZ_OBJS:.o=.d) \
  $(FUZZERS:$(FUZZ)/%=$(FUZZ)/obj/fuzz/%.d)
