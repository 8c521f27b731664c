# strata: build, test, check, fuzz, bench. `make help` lists the targets.
CC      ?= cc
CFLAGS  ?= -O2 -g
# -ffp-contract=off: no silent FMA contraction, so scalar and SIMD paths round alike.
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes \
           -Wno-unused-parameter -ffp-contract=off -pthread -MMD -MP
# The library's layers, bottom up (docs/architecture.md); headers are included by
# bare name and tools/check_includes.sh holds every include to this order.
LIB_DIRS := src/base src/format src/text src/engine src/place src
LIB_INC := -Iinclude $(addprefix -I,$(LIB_DIRS)) -Itools/gen
# The public boundary: app/, bench/ and src/serve/ (the server, a library
# consumer like the CLI) see include/ and their own folder only.
APP_INC := -Iinclude -Iapp
# src/serve/ includes its own headers by bare name, found beside the including
# file; no -Isrc/serve, where sched.h would shadow the system's <sched.h>.
SERVE_INC := -Iinclude
BENCH_INC := -Iinclude
# the include path of one object: the library's unless it is a public consumer
INC      = $(LIB_INC)
LDLIBS  += -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -luring -lpthread -lm
ifneq ($(WERROR),)
CFLAGS  += -Werror
endif
ifneq ($(SAN),)                                   # make SAN=address,undefined test
CFLAGS  += -O1 -fsanitize=$(SAN) -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SAN)
BUILD   ?= build-san
endif
BUILD   ?= build

LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
# tools/gen/: the checkpoint generator and presets (strata gen-model, the tests).
GEN_SRC  := $(wildcard tools/gen/*.c)
# src/serve/: the HTTP server (strata serve), a client of strata.h like the CLI.
SERVE_SRC := $(wildcard src/serve/*.c)
APP_SRC  := $(filter-out app/main.c,$(wildcard app/*.c)) $(SERVE_SRC) $(GEN_SRC)
TEST_SRC := $(wildcard tests/t_*.c) tests/run.c
FUZZ_SRC := $(filter-out fuzz/fz_main.c,$(wildcard fuzz/fz_*.c))
LIB_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRC))
APP_OBJ  := $(patsubst %.c,$(BUILD)/%.o,$(APP_SRC))
TEST_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(TEST_SRC) $(FUZZ_SRC))
$(patsubst %.c,$(BUILD)/%.o,$(wildcard app/*.c)): private INC = $(APP_INC)
$(patsubst %.c,$(BUILD)/%.o,$(SERVE_SRC)): private INC = $(SERVE_INC)

.PHONY: all help test check faults tsan fuzz bench bench-profile bench-batch bench-spec bench-serve bench-kernels bench-decode bench-grammar bench-tokenizer conformance clean deps
all: strata

# Open MPI (libopenmpi-dev): strata-mpi, one model across the ranks of an MPI job,
# is built only where mpicc compiles against mpi.h; the plain strata never needs it.
MPICC    ?= mpicc
HAVE_MPI := $(shell printf '#include <mpi.h>\nint main(void){return 0;}\n' | $(MPICC) -x c -o /dev/null - >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_MPI),1)
all: strata-mpi
endif

help:
	@echo "make            build ./strata"
	@echo "make test       unit, kernel, end-to-end tests and fuzz-corpus replay (< 5 min)"
	@echo "make check      the same tests under ASan+UBSan (build-san/)"
	@echo "make tsan       the threaded suites under ThreadSanitizer (build-tsan/)"
	@echo "make faults     every N of the fault-injection sweeps (make test samples them)"
	@echo "make strata-mpi the MPI build (needs libopenmpi-dev); make test-mpi: its tests under mpirun"
	@echo "make bench-mpi  ladder on 2 ranks vs 1 at the same total budget (bench/mpi)"
	@echo "make fuzz T=st  libFuzzer target fuzz/fz_T.c (clang); T in: $(patsubst fuzz/fz_%.c,%,$(FUZZ_SRC))"
	@echo "make bench      memory ladder on the ~30 GB ladder model (bench/ladder, CSV + PNG; GEN=N tokens (32), REPS=N rounds over the rungs (3), median run per rung)"
	@echo "make bench-profile  CPU ms per decode token by function for ladder rungs (perf; BUDGETS=\"6.2 16\", GEN=64), each against the last"
	@echo "make bench-kernels  bf16/MXFP4 matvec vs measured memory bandwidth"
	@echo "make bench-decode   resident decode ms/token vs the memory-bandwidth floor (demo model)"
	@echo "make bench-batch    sequences per step and long prefills on ladder (CSV + PNG)"
	@echo "make bench-spec     speculative decoding on ladder: K = 1..8, failing drafts (CSV + PNG)"
	@echo "make bench-serve    strata serve on ladder at 1 GB: 1-8 streaming clients, two-turn chat (CSV + PNG)"
	@echo "make bench-io   disk read bandwidth at the engine's read sizes"
	@echo "make bench-index    safetensors indexing on K3-shaped shards"
	@echo "make bench-grammar  constrained (JSON schema) vs plain decode s/token: mask cost on a 163,840 vocab, demo resident, ladder at 1 GB"
	@echo "make bench-tokenizer  strata vs js-tiktoken vs tiktoken (WASM), MB/s"
	@echo "make conformance engine vs the Python reference on generated models"
	@echo "make reference-selftest  the reference's internal equivalences"
	@echo "make deps       install Debian packages (scripts/install-deps.sh)"

deps:
	bash scripts/install-deps.sh

# A fresh machine without the Debian -dev packages gets one clear line instead of
# a wall of "No such file" errors (checked once per build dir).
$(BUILD)/.deps-ok:
	@mkdir -p $(BUILD)
	@printf '#include <jansson.h>\n#include <xxhash.h>\n#include <liburing.h>\n#include <microhttpd.h>\n#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' \
	  | $(CC) -E -x c - >/dev/null 2>&1 || { echo "strata: build dependencies are missing: run 'bash scripts/install-deps.sh' (or 'make deps') first" >&2; exit 2; }
	@touch $@

$(BUILD)/%.o: %.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) -c $< -o $@

$(BUILD)/libstrata.a: $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# ./strata is a copy of $(BUILD)/strata, refreshed on every make: after `make check`
# (whose tests drive the sanitizer build through ./strata) a plain `make` restores
# the optimised binary.
.PHONY: strata
strata: $(BUILD)/strata
	@cp -f $< $@.tmp && mv -f $@.tmp $@
$(BUILD)/strata: $(BUILD)/app/main.o $(APP_OBJ) $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# strata-mpi: app/main.c again with -DSTRATA_MPI (an MPI main around the same
# commands) and src/mpi/, compiled by mpicc; everything else is the same objects.
MPI_OBJ := $(BUILD)/mpi/app/main.o $(BUILD)/mpi/src/mpi/cluster_mpi.o
$(BUILD)/mpi/app/main.o: app/main.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(APP_INC) -DSTRATA_MPI -c $< -o $@
$(BUILD)/mpi/src/mpi/cluster_mpi.o: src/mpi/cluster_mpi.c | $(BUILD)/.deps-ok
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(LIB_INC) -c $< -o $@
$(BUILD)/strata-mpi: $(MPI_OBJ) $(APP_OBJ) $(BUILD)/libstrata.a
	$(MPICC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
.PHONY: strata-mpi test-mpi bench-mpi
strata-mpi: $(BUILD)/strata-mpi
	@cp -f $< $@.tmp && mv -f $@.tmp $@

# Under mpirun on this machine (ranks 1-4 over shared memory): ids and logits of
# run, batched run and speculative decode equal to the plain strata's, version
# and model refusals, a killed rank (tests/mpi/run.sh).
test-mpi: strata strata-mpi
	BUILD=$(BUILD) bash tests/mpi/run.sh

# The ladder model on 2 ranks vs 1 at the same total budget (bench/mpi/run.sh);
# LADDER_MODEL=DIR for a model generated elsewhere.
bench-mpi: strata strata-mpi
	BUILD=$(BUILD) bash bench/mpi/run.sh

# Test and fuzz registration tables are generated from TEST(name) / FUZZ_ENTRY(name)
# lines, so adding a test never edits a shared file.
$(BUILD)/gen/tests_list.h: $(TEST_SRC) $(FUZZ_SRC)
	@mkdir -p $(dir $@)
	@{ grep -ho '^TEST([a-z0-9_]*)' tests/t_*.c | sed 's/^TEST(\(.*\))/T(\1)/'; \
	   grep -ho '^FUZZ_ENTRY([a-z0-9_]*)' $(FUZZ_SRC) /dev/null | sed 's/^FUZZ_ENTRY(\(.*\))/F(\1)/'; } > $@.tmp
	@mv $@.tmp $@
$(BUILD)/tests/run.o: $(BUILD)/gen/tests_list.h
$(BUILD)/tests/run.o: CFLAGS += -I$(BUILD)/gen

$(BUILD)/test_runner: $(TEST_OBJ) $(APP_OBJ) $(BUILD)/libstrata.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

test: strata $(BUILD)/test_runner
	./$(BUILD)/test_runner
	@if command -v mpirun >/dev/null 2>&1 && [ "$(HAVE_MPI)" = 1 ]; then $(MAKE) --no-print-directory test-mpi; \
	 else echo "test-mpi: skipped (no mpirun/mpicc: install libopenmpi-dev and openmpi-bin to run the cluster tests)"; fi

check:
	$(MAKE) SAN=address,undefined WERROR=1 test

# Every N of every fault sweep (tests/t_faults.c samples them in `make test`).
faults: strata $(BUILD)/test_runner
	STRATA_TEST_FAULTS=full ./$(BUILD)/test_runner faults_

# ThreadSanitizer on the suites that run threads: the pool, the streaming source
# (reader thread, prefaulter, io rings), the expert cache, the pack writer and
# readers, the tokenizer shared by threads, the engine across thread counts and
# the generator's producers. Filters are substrings of suite names (tests/run.c).
TSAN_SUITES := pool_ stream_bytes stream_errors stream_decode stream_prefetch stream_preload stream_sliced stream_verify cache_ io_ring tok_small_threads \
               infer_threads gen_deterministic pack_roundtrip stage_chain_bits
tsan:
	$(MAKE) SAN=thread BUILD=build-tsan WERROR=1 strata build-tsan/test_runner
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ./build-tsan/test_runner $(TSAN_SUITES)
	$(MAKE) strata

# libFuzzer: make fuzz T=st [SECS=600]. New inputs and crash files go to
# build-fuzz/ (libFuzzer writes to its first corpus directory); fuzz/corpus/T
# is only read, so a run leaves the repository as it was. Add a finding there
# by hand, with its regression test.
SECS ?= 60
fuzz:
	@test -n "$(T)" || { echo "usage: make fuzz T=<target> [SECS=600]"; exit 2; }
	@mkdir -p build-fuzz/corpus-$(T) fuzz/corpus/$(T)
	clang -O1 -g -std=c11 -D_GNU_SOURCE -DFUZZ_TARGET -fsanitize=fuzzer,address,undefined \
	  -Iinclude $(addprefix -I,$(LIB_DIRS)) -Itools/gen -o build-fuzz/fz_$(T) fuzz/fz_$(T).c $(LIB_SRC) $(SERVE_SRC) $(GEN_SRC) $(LDLIBS)
	./build-fuzz/fz_$(T) -max_total_time=$(SECS) -max_len=65536 -artifact_prefix=build-fuzz/ build-fuzz/corpus-$(T) fuzz/corpus/$(T)

clean:
	rm -rf build build-san build-tsan build-fuzz strata strata-mpi

-include $(shell find build build-san build-tsan -name '*.d' 2>/dev/null)

# Engine vs the independent float64 reference (tests/reference) on generated models.
conformance: strata
	bash tools/conformance.sh

# Self-tests of the Python references themselves (no engine needed, ~8 s):
# K3 (selftest.py), Kimi Linear (kl_selftest.py), DeepSeek-V3/K2 (ds_selftest.py).
.PHONY: reference-selftest
reference-selftest:
	/usr/bin/python3 tests/reference/selftest.py
	/usr/bin/python3 tests/reference/kl_selftest.py
	/usr/bin/python3 tests/reference/ds_selftest.py

# Kernel throughput vs this machine's measured read bandwidth (bench/b_kern.c).
$(BUILD)/b_kern: private INC = $(BENCH_INC)
$(BUILD)/b_kern: bench/b_kern.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
bench-kernels: $(BUILD)/b_kern
	./$(BUILD)/b_kern

# Resident decode of the demo model vs bytes/token / measured bandwidth (bench/b_decode.c);
# ARGS="DIR --threads N --tokens N --reps N" for another model or setting.
$(BUILD)/b_decode: private INC = $(BENCH_INC)
$(BUILD)/b_decode: bench/b_decode.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
bench-decode: strata $(BUILD)/b_decode
	@test -f $(BUILD)/models/demo/config.json || ./strata gen-model $(BUILD)/models/demo --preset demo
	./$(BUILD)/b_decode $(if $(ARGS),$(ARGS),$(BUILD)/models/demo)

# Constrained vs plain decode (bench/b_gram.c): the mask alone on a generated model with
# K3's 163,840-id vocabulary, then demo resident, then ladder at 1 GB when it exists
# (LADDER_MODEL=DIR, default build/models/ladder). ARGS="DIR ..." for another run.
$(BUILD)/b_gram: private INC = $(BENCH_INC)
$(BUILD)/b_gram: bench/b_gram.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
.PHONY: bench-grammar
bench-grammar: strata $(BUILD)/b_gram
ifneq ($(ARGS),)
	./$(BUILD)/b_gram $(ARGS)
else
	@test -f $(BUILD)/models/tiny-v163k/config.json || ./strata gen-model $(BUILD)/models/tiny-v163k --config bench/grammar/tiny-v163k.json --quiet
	@test -f $(BUILD)/models/demo/config.json || ./strata gen-model $(BUILD)/models/demo --preset demo
	./$(BUILD)/b_gram --masks $(BUILD)/models/tiny-v163k $(BUILD)/models/demo
	@L=$(LADDER_MODEL); if test -f $$L/config.json; then ./$(BUILD)/b_gram $$L --ram-gb 1 --tokens 16 --reps 1; \
	  else echo "bench-grammar: no ladder model at $$L (LADDER_MODEL=DIR; make bench generates one): skipped"; fi
endif

# st_open on K3-shaped sparse shards (~5,200 tensors, ~790 KB headers each): bench/b_index.c.
.PHONY: bench-index
$(BUILD)/b_index: private INC = $(BENCH_INC)
$(BUILD)/b_index: bench/b_index.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
bench-index: $(BUILD)/b_index
	./$(BUILD)/b_index $(ARGS)

# Tokenizer throughput (single thread, MB/s of UTF-8 input): strata beside js-tiktoken
# and tiktoken (WASM) on the generated 1.2 MB corpus, o200k and cl100k (bench/tokenizer/).
TOKB := $(BUILD)/bench-tok
$(BUILD)/bench_tok: private INC = $(BENCH_INC)
$(BUILD)/bench_tok: bench/tokenizer/bench_tok.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
bench-tokenizer: $(BUILD)/bench_tok
	@test -d tests/tok/node_modules/tiktoken || npm ci --prefix tests/tok --no-audit --no-fund --loglevel=error
	@mkdir -p $(TOKB)
	@node tests/tok/gen_corpus.mjs $(TOKB)
	@node tests/tok/export_vocab.mjs cl100k_base $(TOKB)/cl100k.tiktoken
	@node tests/tok/export_vocab.mjs o200k_base $(TOKB)/o200k.tiktoken
	@for e in o200k cl100k; do ./$(BUILD)/bench_tok $(TOKB)/$$e.tiktoken $$e $(TOKB)/corpus.txt || exit 1; \
	  node bench/tokenizer/bench.mjs $${e}_base $(TOKB)/corpus.txt || exit 1; done
	@./$(BUILD)/bench_tok $(TOKB)/o200k.tiktoken kimi $(TOKB)/corpus.txt

# Memory ladder (bench/ladder): generates + packs the ~30 GB `ladder` model once, measures
# disk/memory bandwidth, runs one prompt at 1, 2, 4, 8, 16 GB and resident; table, CSV, PNG.
# bench-io: disk read bandwidth at the engine's read sizes (in-place vs aligned experts).
.PHONY: bench-io
$(BUILD)/place_run: private INC = $(BENCH_INC)
$(BUILD)/place_run: bench/ladder/place_run.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
$(BUILD)/bench_io: private INC = $(BENCH_INC)
$(BUILD)/bench_io: bench/ladder/bench_io.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
$(BUILD)/cache_replay: private INC = $(BENCH_INC)
$(BUILD)/cache_replay: bench/ladder/cache_replay.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
bench: strata $(BUILD)/place_run $(BUILD)/cache_replay
	BUILD=$(BUILD) bash bench/ladder/run.sh
# Where a rung's decode spends its CPU time, by function (perf; BUDGETS="6.2 16" by
# default), and each rung against the last one.
bench-profile: strata $(BUILD)/place_run
	BUILD=$(BUILD) bash bench/ladder/profile.sh
# Many rows per pass: sequences stepped together and long prefills on ladder.
$(BUILD)/b_batch: private INC = $(BENCH_INC)
$(BUILD)/b_batch: bench/b_batch.c $(BUILD)/libstrata.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libstrata.a $(LDLIBS)
bench-batch: strata $(BUILD)/b_batch
	BUILD=$(BUILD) bash bench/batch/run.sh
# Speculative decoding on ladder: --spec K with the model's own continuation as drafts.
bench-spec: strata
	BUILD=$(BUILD) bash bench/spec/run.sh
# strata serve on ladder (LADDER_MODEL=DIR for a model made elsewhere): concurrent
# streaming clients and a two-turn chat with and without prefix reuse. flock: one
# ladder benchmark at a time on a shared machine.
LADDER_MODEL ?= $(BUILD)/models/ladder
bench-serve: strata
	flock /tmp/strata-bench.lock env BUILD=$(BUILD) LADDER_MODEL=$(LADDER_MODEL) bash bench/serve/run.sh
bench-io: strata $(BUILD)/bench_io
	@test -f $(BUILD)/models/ladder/config.json || ./strata gen-model $(BUILD)/models/ladder --preset ladder
	./$(BUILD)/bench_io $(BUILD)/models/ladder $(ARGS)

# Output bits of every preset, the demo model too, against tests/bits/expected.txt
# (make test checks the tiny presets; this adds demo: ~2 GB generated once, ~1 min),
# then tests/forward_hashes.sh: threads, budgets, sampled speculation, batches, self-drafts.
.PHONY: check-includes
# The layer order and no include circles (tools/check_includes.sh; make test runs it).
check-includes:
	@bash tools/check_includes.sh && echo "check-includes: layers and includes in order"

.PHONY: test-bits
test-bits: strata
	@mkdir -p $(BUILD)/bits
	bash tests/bits/hash.sh ./strata $(BUILD)/bits tiny tiny-odd tiny-blocks tiny-shards tiny-mixed tiny-bf16experts demo > $(BUILD)/bits/got.txt
	@grep -v '^#' tests/bits/expected.txt | diff - $(BUILD)/bits/got.txt && echo "test-bits: every preset's ids and logits as recorded"
	FH_MODELS=$(BUILD)/bits/fh bash tests/forward_hashes.sh --demo ./strata > $(BUILD)/bits/forward.md5
	@diff tests/data/forward_hashes.md5 $(BUILD)/bits/forward.md5 && echo "test-bits: speculation, batches and self-drafts as recorded"
