/* libFuzzer harness for program files: open the input with npulm_model_open (GGUF parse, model,
 * tokenizer, graphs, quantization table, sites, npu_program_verify) and, when it is accepted,
 * describe it and evaluate a few tokens through its graphs, so that the sanitizers see any read or
 * write the loader's checks let through, in the loader or in the integer kernels. A rejected input
 * must come back with a message and no model; an accepted one must then describe itself, make a
 * session and evaluate: any other status aborts, with its message.
 *
 * Build: `make fuzz-program` (the harness, and its seeds in build-fuzz/seeds/program/). Seeds:
 * `NPULM_FUZZ_SEEDS=DIR build-fuzz/fuzz_program` writes small program files of a micro model, one
 * of each quantization mode, one with attention on the integer NPU and one with the float copy of
 * every weight (--keep-float), into DIR and exits; then
 * `build-fuzz/fuzz_program CORPUS DIR -max_len=131072` (see README.md). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/calibrate.h"
#include "compiler/compiler.h"
#include "compiler/quantize.h"
#include "io/gguf_checksum.h"
#include "io/gguf_write.h"
#include "model/model.h"
#include "model/synth.h"
#include "npulm.h"
#include "program/program_io.h"

static FILE *g_null;

/* Open 'size' bytes as a model: npulm_model_open maps a path, so the bytes go to an anonymous
 * in-memory file (memfd: nothing to clean up, even after SIGKILL) opened as /proc/self/fd/N. A
 * program file's checksums are recomputed first (where they still cover the file), or nearly
 * every mutation would stop at them and the checks behind them would go unfuzzed; their own
 * refusals are tested in tests/test_gguf.c and tests/test_program.c. */
static npulm_status open_input(const uint8_t *data, size_t size, npulm_model **m_out,
                               npulm_error *err) {
  uint8_t *bytes = malloc(size ? size : 1);
  if (bytes == NULL) {
    perror("fuzz_program: malloc");
    abort();
  }
  memcpy(bytes, data, size);
  npulm_error ignored;
  (void)npu_gguf_checksums_reseal(bytes, size, NPU_PROGRAM_CHECKSUMS, &ignored);
  int fd = memfd_create("npulm-fuzz-input", MFD_CLOEXEC);
  if (fd < 0) {
    perror("fuzz_program: memfd_create");
    abort();
  }
  for (size_t done = 0; done < size;) {
    ssize_t k = write(fd, bytes + done, size - done);
    if (k <= 0) {
      perror("fuzz_program: writing the input");
      abort();
    }
    done += (size_t)k;
  }
  free(bytes);
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  npulm_status st = npulm_model_open(path, m_out, err);
  close(fd); /* an open model keeps its mapping */
  return st;
}

/* Abort, naming the call, on a status the harness does not expect. */
static void must(npulm_status st, const char *what, const npulm_error *err) {
  if (st == NPULM_OK) return;
  fprintf(stderr, "fuzz_program: %s: %s: %s\n", what, npulm_status_name(st),
          err != NULL ? err->msg : "");
  abort();
}

/* ---- Seeds: a micro llama (dim 16, one layer, synth's vocabulary), five programs --------- */

enum { DIM = 16, HEADS = 2, KV_HEADS = 1, FFN = 32, VOCAB = 259 + 5, CTX = 32 };

_Noreturn static void die(const char *what, const npulm_error *err) {
  fprintf(stderr, "fuzz_program seeds: %s: %s\n", what, err != NULL ? err->msg : "failed");
  exit(1);
}

/* Seeded weights with a few large ones (outlier channels); norms near 1. */
static void fill_micro(void *user, const struct npu_synth_tensor *t, uint64_t first, float *vals,
                       size_t n) {
  (void)first;
  uint64_t *seed = user;
  for (size_t j = 0; j < n; j++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    float v = (float)((int64_t)(*seed >> 33) % 2001 - 1000) / 2500.0f;
    if ((*seed >> 20) % 61 == 0) v *= 12.0f; /* a few large weights: outlier channels */
    vals[j] = t->n_dims == 1 ? 1.0f + v / 4.0f : v;
  }
}

/* The micro model, opened from memory (no file to leave behind). */
static npulm_model *open_micro_model(void) {
  static const struct npu_synth_shape micro = {.arch = "llama",
                                               .title = "micro",
                                               .dim = DIM,
                                               .n_layers = 1,
                                               .n_heads = HEADS,
                                               .n_kv_heads = KV_HEADS,
                                               .ffn_dim = FFN,
                                               .n_vocab = VOCAB,
                                               .n_ctx = CTX,
                                               .rope_base = 10000.0f,
                                               .rms_eps = 1e-5f,
                                               .tied = true};
  uint64_t seed = 42;
  const struct npu_synth_options o = {.fill = fill_micro, .user = &seed};
  struct npu_gguf_writer *w;
  npulm_error err;
  void *image;
  size_t size;
  if (npu_gguf_writer_open_memory(&w, &err) != NPULM_OK ||
      npu_synth_write(w, &micro, &o, &err) != NPULM_OK ||
      npu_gguf_writer_finish(w, &err) != NPULM_OK ||
      npu_gguf_writer_take_memory(w, &image, &size, &err) != NPULM_OK) {
    die("micro model", &err);
  }
  npu_gguf_writer_free(w);
  npulm_model *m;
  if (open_input(image, size, &m, &err) != NPULM_OK) die("micro model", &err);
  free(image);
  return m;
}

/* Compile, calibrate and quantize the micro model for 'mode' with the precision policy
 * 'float_ops' (as npu_quant_float_ops widens it for the mode) and save it as DIR/micro-NAME.npu:
 * with the float copy of every weight if 'keep_float', else (an integer program) only those the
 * CPU reads. */
static void write_seed(const char *dir, const char *name, enum npu_quant_mode mode,
                       uint32_t float_ops, bool keep_float) {
  npulm_model *m = open_micro_model();
  npulm_error err;
  struct npu_compile_options o;
  memset(&o, 0, sizeof(o));
  o.n_chunks = 1;
  o.chunks[0] = 4;
  o.n_buckets = 1;
  o.buckets[0] = 16;
  o.float_ops = npu_quant_float_ops(mode, float_ops);
  struct npu_program *p;
  if (npu_compile(m, &o, NULL, NULL, &p, &err) != NPULM_OK) die("compile", &err);
  size_t len = strlen(npu_calib_default_text), cap = 4 * len + 16, n = 0;
  int32_t *ids = malloc(cap * sizeof(int32_t));
  if (ids == NULL) die("out of memory", NULL);
  if (npulm_tokenize(m, npu_calib_default_text, len, false, false, ids, cap, &n, &err)) {
    die("tokenize", &err);
  }
  struct npu_quant_options qo;
  npu_quant_default_options(&qo);
  qo.mode = mode;
  qo.shadow_threshold = 1.5f;
  if (npu_quantize_program(m, p, ids, n < 96 ? n : 96, 1, &qo, NULL, NULL, &err) != NPULM_OK) {
    die("quantize", &err);
  }
  free(ids);
  p->keep_float = keep_float;
  m->program = p;
  char path[512];
  snprintf(path, sizeof(path), "%s/micro-%s.npu", dir, name);
  if (npu_program_save(m, p, path, NULL, NULL, &err) != NPULM_OK) die("save", &err);
  int32_t outliers = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) outliers += p->qsites[i].n_outliers;
  struct stat sb;
  stat(path, &sb);
  fprintf(stderr, "wrote %s (%lld bytes, %d sites, %d outlier channels)\n", path,
          (long long)sb.st_size, p->n_qsites, outliers);
  npulm_model_close(m);
}

/* ---- The harness --------------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *seeds = getenv("NPULM_FUZZ_SEEDS");
  if (seeds != NULL) {
    mkdir(seeds, 0755);
    for (int mode = 0; mode < NPU_QUANT_MODE_COUNT; mode++) {
      const char *name = npu_quant_mode_name((enum npu_quant_mode)mode);
      write_seed(seeds, name, (enum npu_quant_mode)mode, NPU_DEFAULT_FLOAT_OPS, false);
    }
    /* attention's QK, SOFTMAX and PV on the integer NPU */
    write_seed(seeds, "w8a8-naive-int-attention", NPU_QUANT_NAIVE, 0, false);
    /* every float weight as well (compile --keep-float) */
    write_seed(seeds, "w8a8-shadow-keep-float", NPU_QUANT_SHADOW, NPU_DEFAULT_FLOAT_OPS, true);
    exit(0);
  }
  g_null = fopen("/dev/null", "w");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npulm_model *m = NULL;
  npulm_error err;
  err.msg[0] = '\0';
  if (open_input(data, size, &m, &err) != NPULM_OK) {
    /* a failure must name itself and own nothing (the message may quote a hostile key name,
     * newlines included: the GGUF reader prints names as they are) */
    if (m != NULL || err.msg[0] == '\0') abort();
    return 0;
  }
  if (npulm_model_has_program(m) && g_null != NULL) {
    must(npulm_model_print_program(m, g_null, &err), "print_program", &err);
  }
  /* an accepted model runs: a prefill of up to 4 tokens and a decode step, in a context that fits
   * its program (a session of a model without one compiles FP32 graphs of its own) */
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  int n_ctx = info.n_ctx_train < 16 ? info.n_ctx_train : 16;
  if (m->program != NULL) {
    const struct npu_compile_options *o = &m->program->opts;
    if (o->buckets[o->n_buckets - 1] < n_ctx) n_ctx = o->buckets[o->n_buckets - 1];
  }
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = n_ctx;
  sp.n_threads = 1;
  npulm_session *s = NULL;
  must(npulm_session_create(m, &sp, &s, &err), "session_create", &err);
  static const int32_t ids[5] = {1, 260, 100, 3, 261};
  int32_t tokens[5];
  for (int i = 0; i < 5; i++) tokens[i] = ids[i] % info.n_vocab;
  size_t n_prompt = n_ctx > 4 ? 4 : (size_t)n_ctx;
  must(npulm_session_eval(s, tokens, n_prompt, NULL, &err), "prefill", &err);
  if ((size_t)n_ctx > n_prompt) {
    must(npulm_session_eval(s, tokens + 4, 1, NULL, &err), "decode", &err);
  }
  npulm_session_free(s);
  npulm_model_close(m);
  return 0;
}
