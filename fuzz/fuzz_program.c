/* libFuzzer harness for program files: open the input with npulm_model_open (GGUF parse, model,
 * tokenizer, graphs, quantization table, sites, npu_program_verify) and, when it is accepted,
 * describe it and evaluate a few tokens through its graphs, so that the sanitizers see any read or
 * write the loader's checks let through, in the loader or in the integer kernels. A rejected input
 * must come back with a message and no model; an accepted one must then describe itself, make a
 * session and evaluate: any other status aborts, with its message.
 *
 * Build: `make fuzz-program` (the harness, and its seeds in build-fuzz/seeds/program/). Seeds:
 * `NPULM_FUZZ_SEEDS=DIR build-fuzz/fuzz_program` writes small program files of a micro model, one
 * of each quantization mode and one with attention on the integer NPU, into DIR and exits; then
 * `build-fuzz/fuzz_program CORPUS DIR -max_len=131072` (see README.md). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_checksum.h"
#include "gguf_write.h"
#include "graph/program.h"
#include "model.h"
#include "npulm.h"
#include "quant/calibrate.h"
#include "quant/quantize.h"

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

/* ---- Seeds: a micro llama (dim 16, one layer, byte-fallback vocabulary), five programs ----- */

enum { DIM = 16, HEADS = 2, KV_HEADS = 1, FFN = 32, VOCAB = 259 + 5, CTX = 32 };

_Noreturn static void die(const char *what, const npulm_error *err) {
  fprintf(stderr, "fuzz_program seeds: %s: %s\n", what, err != NULL ? err->msg : "failed");
  exit(1);
}

/* The micro model, opened from memory (no file to leave behind). */
static npulm_model *open_micro_model(void) {
  struct npu_gguf_writer *w;
  npulm_error err;
  if (npu_gguf_writer_open_memory(&w, &err) != NPULM_OK) die("writer", &err);
  npu_gguf_writer_add_str(w, "general.architecture", "llama");
  npu_gguf_writer_add_u32(w, "llama.embedding_length", DIM);
  npu_gguf_writer_add_u32(w, "llama.block_count", 1);
  npu_gguf_writer_add_u32(w, "llama.feed_forward_length", FFN);
  npu_gguf_writer_add_u32(w, "llama.attention.head_count", HEADS);
  npu_gguf_writer_add_u32(w, "llama.attention.head_count_kv", KV_HEADS);
  npu_gguf_writer_add_u32(w, "llama.context_length", CTX);
  npu_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
  npu_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
  static char names[VOCAB][16];
  const char *tokens[VOCAB];
  float scores[VOCAB];
  int32_t types[VOCAB];
  for (int i = 0; i < VOCAB; i++) {
    if (i < 3)
      snprintf(names[i], 16, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
    else if (i < 259)
      snprintf(names[i], 16, "<0x%02X>", i - 3);
    else
      snprintf(names[i], 16, "\xe2\x96\x81%c", 'a' + (i - 259));
    tokens[i] = names[i];
    scores[i] = (float)-i;
    types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
  }
  npu_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, VOCAB);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.scores", NPU_GGUF_F32, scores, VOCAB);
  npu_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", NPU_GGUF_I32, types, VOCAB);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
  npu_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
  const struct {
    const char *name;
    uint64_t ne0, ne1; /* ne1 = 0: a vector */
  } specs[] = {
      {"token_embd.weight", DIM, VOCAB},         {"output_norm.weight", DIM, 0},
      {"blk.0.attn_norm.weight", DIM, 0},        {"blk.0.attn_q.weight", DIM, DIM},
      {"blk.0.attn_k.weight", DIM, DIM / HEADS}, {"blk.0.attn_v.weight", DIM, DIM / HEADS},
      {"blk.0.attn_output.weight", DIM, DIM},    {"blk.0.ffn_norm.weight", DIM, 0},
      {"blk.0.ffn_gate.weight", DIM, FFN},       {"blk.0.ffn_up.weight", DIM, FFN},
      {"blk.0.ffn_down.weight", FFN, DIM},
  };
  enum { N_SPECS = sizeof(specs) / sizeof(specs[0]) };
  for (int i = 0; i < N_SPECS; i++) {
    uint64_t ne[2] = {specs[i].ne0, specs[i].ne1};
    npu_gguf_writer_add_tensor(w, specs[i].name, NPU_GGML_F32, specs[i].ne1 ? 2 : 1, ne, NULL);
  }
  uint64_t seed = 42;
  for (int i = 0; i < N_SPECS; i++) {
    size_t count = (size_t)(specs[i].ne0 * (specs[i].ne1 ? specs[i].ne1 : 1));
    float *data = malloc(count * sizeof(float));
    if (data == NULL) die("out of memory", NULL);
    for (size_t j = 0; j < count; j++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      float v = (float)((int64_t)(seed >> 33) % 2001 - 1000) / 2500.0f;
      if ((seed >> 20) % 61 == 0) v *= 12.0f; /* a few large weights: outlier channels */
      data[j] = specs[i].ne1 == 0 ? 1.0f + v / 4.0f : v;
    }
    if (npu_gguf_writer_write_data(w, data, count * sizeof(float), &err) != NPULM_OK) {
      die("write", &err);
    }
    free(data);
  }
  void *image;
  size_t size;
  if (npu_gguf_writer_finish(w, &err) != NPULM_OK ||
      npu_gguf_writer_take_memory(w, &image, &size, &err) != NPULM_OK) {
    die("finish", &err);
  }
  npu_gguf_writer_free(w);
  npulm_model *m;
  if (open_input(image, size, &m, &err) != NPULM_OK) die("micro model", &err);
  free(image);
  return m;
}

/* Compile, calibrate and quantize the micro model for 'mode' with the precision policy
 * 'float_ops' (as npu_quant_float_ops widens it for the mode) and save it as DIR/micro-NAME.npu. */
static void write_seed(const char *dir, const char *name, enum npu_quant_mode mode,
                       uint32_t float_ops) {
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
  if (npu_compile(m, &o, &p, &err) != NPULM_OK) die("compile", &err);
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
      write_seed(seeds, name, (enum npu_quant_mode)mode, NPU_DEFAULT_FLOAT_OPS);
    }
    /* attention's QK, SOFTMAX and PV on the integer NPU */
    write_seed(seeds, "w8a8-naive-int-attention", NPU_QUANT_NAIVE, 0);
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
