/* Program files: compile -> save -> open gives the same graphs, weights, metadata, configuration
 * and tokenizer, and for integer programs (naive, shadow, smooth) the same integer data and the
 * same logits bit for bit; and hostile program files (truncated, another version, tampered graph
 * records, plans that reach outside an arena, wrong weight names, missing keys, tampered
 * quantization tables, sites, packed weights, outliers and multipliers) are one-line errors,
 * never a crash (run under SAN=1); and the operator table that drives the site records holds
 * together. Files go to /tmp. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "test_util.h"

#include "analysis/inspect.h"
#include "compiler/calibrate.h"
#include "compiler/compiler.h"
#include "compiler/quantize.h"
#include "io/gguf_checksum.h"
#include "io/gguf_write.h"
#include "model/model.h"
#include "model/synth.h"
#include "npulm.h"
#include "program/program_io.h"

/* ---- A tiny model ------------------------------------------------------------------------- */

/* i32 fields per record of npulm.qsites (program_file.h) */
enum {
  SITE_FIELDS = 42,
  SITE_QK = 23,
  SITE_SOFTMAX = 28,
  SITE_PV = 30,
  SITE_RMSNORM = 34,
  SITE_W_BITS = 38,
  SITE_W_BLOCK = 39,
  SITE_ACC_SHIFT = 40,
  SITE_LUT_WIDE = 41
};
/* i32 fields per record of npulm.graph.G.tensors, and where the layer and the role are */
enum { TENSOR_FIELDS = 14, TENSOR_KIND = 0, TENSOR_REF = 7, TENSOR_LAYER = 12, TENSOR_ROLE = 13 };

enum { DIM = 32, HEADS = 4, KV_HEADS = 2, HEAD_DIM = DIM / HEADS, FFN = 64, VOCAB = 259 + 5 };

struct tiny {
  const char *arch; /* "llama" (default) or "qwen2" (Q/K/V biases) */
  int n_layers;     /* default 1 */
  bool untied;      /* write output.weight */
  bool rope_freqs;  /* write rope_freqs.weight (llama 3) */
  uint32_t mtype;   /* ggml type of the matrices (default F32) */
  bool extra_keys;  /* metadata of every value type, nested arrays included */
};

/* Metadata of every value type, nested arrays included. */
static void add_extra_keys(struct npu_gguf_writer *w) {
  npu_gguf_writer_add_u8(w, "test.u8", 200);
  npu_gguf_writer_add_i8(w, "test.i8", -100);
  npu_gguf_writer_add_u16(w, "test.u16", 60000);
  npu_gguf_writer_add_i16(w, "test.i16", -30000);
  npu_gguf_writer_add_i32(w, "test.i32", -2000000000);
  npu_gguf_writer_add_u64(w, "test.u64", 0xfedcba9876543210ull);
  npu_gguf_writer_add_i64(w, "test.i64", -5);
  npu_gguf_writer_add_f64(w, "test.f64", 3.14159265358979);
  npu_gguf_writer_add_f32(w, "test.f32_nan", NAN);
  npu_gguf_writer_add_bool(w, "test.bool", true);
  npu_gguf_writer_add_str(w, "test.empty", "");
  /* an array of two arrays of u16 */
  struct npu_gguf_buf b = {0};
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&b, 2);
  for (int i = 0; i < 2; i++) {
    npu_gguf_buf_put_u32(&b, NPU_GGUF_U16);
    npu_gguf_buf_put_u64(&b, 3);
    for (int j = 0; j < 3; j++) npu_gguf_buf_put_u16(&b, (uint16_t)(10 * i + j));
  }
  assert_false(b.failed);
  npu_gguf_writer_add_raw(w, "test.nested", NPU_GGUF_ARR, b.data, b.size);
  npu_gguf_buf_free(&b);
  npu_gguf_writer_add_u32(w, "npulm.stale.key", 1); /* a foreign npulm.* key is not copied */
}

/* Seeded weights as the tests have always had them: uniform in [-0.2, 0.2], vectors (norms,
 * biases, rope divisors) near 1. */
static void fill_uniform(void *user, const struct npu_synth_tensor *t, uint64_t first, float *vals,
                         size_t n) {
  (void)first;
  uint64_t *seed = user;
  for (size_t j = 0; j < n; j++) {
    float v = (float)((int64_t)(test_rand(seed) % 2001) - 1000) / 5000.0f;
    vals[j] = t->n_dims == 1 ? 1.0f + v : v;
  }
}

/* Write a tiny model with a synthetic SPM vocabulary and seeded random weights to 'path'. */
static void write_tiny(const char *path, const struct tiny *t) {
  const char *arch = t->arch ? t->arch : "llama";
  const struct npu_synth_shape sh = {
      .arch = arch,
      .title = "tiny test model",
      .dim = DIM,
      .n_layers = t->n_layers ? t->n_layers : 1,
      .n_heads = HEADS,
      .n_kv_heads = KV_HEADS,
      .ffn_dim = FFN,
      .n_vocab = VOCAB,
      .n_ctx = 64,
      .rope_base = 10000.0f,
      .rms_eps = 1e-5f,
      .tied = !t->untied,
      .qkv_bias = strcmp(arch, "qwen2") == 0,
      /* (the factors are the fill's: these only ask for rope_freqs.weight) */
      .rope_llama3_factor = t->rope_freqs ? 8.0f : 0.0f,
      .rope_low_freq_factor = 1.0f,
      .rope_high_freq_factor = 4.0f,
      .rope_orig_ctx = 64};
  uint64_t seed = 42;
  const struct npu_synth_options o = {.type2d = t->mtype, .fill = fill_uniform, .user = &seed};
  struct npu_gguf_writer *w;
  npulm_error err;
  assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
  if (t->extra_keys) add_extra_keys(w);
  assert_int_equal(npu_synth_write(w, &sh, &o, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  npu_gguf_writer_free(w);
}

/* ---- Files -------------------------------------------------------------------------------- */

static char *tmp_path(void) {
  char *path = strdup("/tmp/npulm-test-program-XXXXXX");
  assert_non_null(path);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  return path;
}

static void write_all(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, size, f), size);
  assert_int_equal(fclose(f), 0);
}

static npulm_model *open_ok(const char *path) {
  npulm_model *m = NULL;
  npulm_error err = {{0}};
  npulm_status st = npulm_model_open(path, &m, &err);
  if (st != NPULM_OK) fail_msg("cannot open '%s': %s", path, err.msg);
  return m;
}

/* Compile with 'cp' (NULL: the defaults); FP32 unless 'cp' names a quantization (the integer
 * programs are made with npu_quantize_program below, on options of the tests' choosing). */
static void compile_ok(npulm_model *m, const npulm_compile_params *cp) {
  npulm_error err = {{0}};
  npulm_compile_params params = cp != NULL ? *cp : npulm_compile_default_params();
  if (params.quant == NULL) params.quant = "f32";
  npulm_status st = npulm_model_compile(m, &params, &err);
  if (st != NPULM_OK) fail_msg("compile failed: %s", err.msg);
  st = npu_program_verify(m, m->program, &err);
  if (st != NPULM_OK) fail_msg("the compiler's own program fails verification: %s", err.msg);
}

static void save_ok(const npulm_model *m, const char *path) {
  npulm_error err = {{0}};
  npulm_status st = npulm_model_save_program(m, path, NULL, NULL, &err);
  if (st != NPULM_OK) fail_msg("save failed: %s", err.msg);
}

/* Save model 'p' (opened from program file 'path') again to 'path2': the bytes must be the same. */
static void assert_resave_identical(npulm_model *p, const char *path, const char *path2) {
  save_ok(p, path2);
  size_t n1, n2;
  uint8_t *b1 = test_read_file(path, &n1), *b2 = test_read_file(path2, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(b1, b2, n1);
  free(b1);
  free(b2);
}

/* ---- Comparisons -------------------------------------------------------------------------- */

static void assert_graphs_equal(const struct npu_graph *a, const struct npu_graph *b) {
  assert_int_equal(a->rows, b->rows);
  assert_int_equal(a->ctx, b->ctx);
  assert_int_equal(a->n_tensors, b->n_tensors);
  assert_int_equal(a->n_nodes, b->n_nodes);
  assert_int_equal(a->n_subgraphs, b->n_subgraphs);
  assert_int_equal(a->n_transfers, b->n_transfers);
  for (int be = 0; be < NPU_BE_COUNT; be++) assert_int_equal(a->arena_size[be], b->arena_size[be]);
  for (int32_t i = 0; i < a->n_tensors; i++) {
    const struct npu_ir_tensor *x = &a->tensors[i], *y = &b->tensors[i];
    assert_int_equal(x->kind, y->kind);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->backend, y->backend);
    assert_int_equal(x->kv_is_value, y->kv_is_value);
    for (int d = 0; d < 3; d++) assert_int_equal(x->ne[d], y->ne[d]);
    assert_int_equal(x->ref, y->ref);
    assert_int_equal(x->layer, y->layer);
    assert_int_equal(x->role, y->role);
    assert_int_equal(x->offset, y->offset);
    assert_memory_equal(&x->q.scale, &y->q.scale, sizeof(float));
    assert_int_equal(x->q.zero_point, y->q.zero_point);
    assert_string_equal(x->name, y->name);
  }
  for (int32_t i = 0; i < a->n_nodes; i++) {
    const struct npu_ir_node *x = &a->nodes[i], *y = &b->nodes[i];
    assert_int_equal(x->op, y->op);
    assert_int_equal(x->backend, y->backend);
    assert_int_equal(x->pinned, y->pinned);
    assert_int_equal(x->pad, y->pad);
    for (int s = 0; s < NPU_IR_MAX_IN; s++) assert_int_equal(x->in[s], y->in[s]);
    assert_int_equal(x->out, y->out);
    assert_int_equal(x->layer, y->layer);
    assert_memory_equal(&x->param, &y->param, sizeof(float));
  }
  for (int32_t i = 0; i < a->n_subgraphs; i++) {
    assert_int_equal(a->subgraphs[i].first, b->subgraphs[i].first);
    assert_int_equal(a->subgraphs[i].count, b->subgraphs[i].count);
    assert_int_equal(a->subgraphs[i].backend, b->subgraphs[i].backend);
  }
}

/* Program 'b' loaded from the file program 'a' was saved to: the same, but for the float weights
 * a lean file (an integer program's, without keep_float) leaves out: exactly those that no node
 * reads in float (a tied output is held with the embedding). */
static void assert_programs_equal(const struct npu_program *a, const struct npu_program *b) {
  assert_memory_equal(&a->opts, &b->opts, sizeof(a->opts));
  assert_int_equal(a->n_graphs, b->n_graphs);
  for (int32_t i = 0; i < a->n_graphs; i++) assert_graphs_equal(&a->graphs[i], &b->graphs[i]);
  assert_int_equal(a->n_weights, b->n_weights);
  const bool lean = a->quant_mode != NPU_QUANT_F32 && !a->keep_float;
  bool *reads = calloc((size_t)a->n_weights + 1, sizeof(*reads));
  assert_non_null(reads);
  npu_program_float_weights(a, reads);
  bool all_held = true;
  for (int32_t i = 0; i < a->n_weights; i++) {
    const struct npu_weight *x = &a->weights[i], *y = &b->weights[i];
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->ne0, y->ne0);
    assert_int_equal(x->ne1, y->ne1);
    bool read = reads[i];
    for (int32_t j = 0; j < a->n_weights; j++) {
      read |= reads[j] && strcmp(a->weights[j].name, x->name) == 0;
    }
    assert_int_equal(x->data == NULL || (lean && !read), y->data == NULL);
    all_held &= x->data == NULL || y->data != NULL;
    if (y->data != NULL) {
      assert_memory_equal(x->data, y->data, (size_t)x->ne0 * (size_t)x->ne1 * sizeof(float));
    }
  }
  free(reads);
  assert_int_equal(b->keep_float, all_held);
  if (all_held) assert_int_equal(a->weight_bytes, b->weight_bytes);
  if (!all_held) assert_true(b->weight_bytes < a->weight_bytes);
  assert_int_equal(a->kv_bytes, b->kv_bytes);
}

/* The source's metadata must reappear in the program file value for value and in order, less
 * general.alignment and npulm.*; general.file_type becomes 0 (F32). */
static void assert_metadata_copied(const struct npu_gguf *src, const struct npu_gguf *dst) {
  uint64_t j = 0;
  for (uint64_t i = 0; i < src->n_kv; i++) {
    const struct npu_gguf_kv *a = &src->kv[i];
    if (npu_gguf_str_eq(a->key, "general.alignment") ||
        (a->key.len >= 6 && memcmp(a->key.ptr, "npulm.", 6) == 0)) {
      continue;
    }
    while (j < dst->n_kv && npu_gguf_str_eq(dst->kv[j].key, "general.alignment")) j++;
    assert_true(j < dst->n_kv);
    const struct npu_gguf_kv *b = &dst->kv[j++];
    assert_int_equal(a->key.len, b->key.len);
    assert_memory_equal(a->key.ptr, b->key.ptr, (size_t)a->key.len);
    if (npu_gguf_str_eq(a->key, "general.file_type")) {
      assert_int_equal(b->val.type, NPU_GGUF_U32);
      assert_int_equal(b->val.v.u, 0);
      continue;
    }
    assert_int_equal(a->val.type, b->val.type);
    switch (a->val.type) {
    case NPU_GGUF_STR:
      assert_int_equal(a->val.v.s.len, b->val.v.s.len);
      assert_memory_equal(a->val.v.s.ptr, b->val.v.s.ptr, (size_t)a->val.v.s.len + 0);
      break;
    case NPU_GGUF_ARR:
      assert_int_equal(a->val.v.a.type, b->val.v.a.type);
      assert_int_equal(a->val.v.a.n, b->val.v.a.n);
      assert_int_equal(a->val.v.a.size, b->val.v.a.size);
      if (a->val.v.a.size)
        assert_memory_equal(a->val.v.a.data, b->val.v.a.data, (size_t)a->val.v.a.size);
      break;
    default:
      if (memcmp(&a->val.v, &b->val.v, sizeof(a->val.v.u)) != 0) { /* u, i and f alike */
        fail_msg("metadata '%.*s' (type %u) changed", (int)a->key.len, a->key.ptr, a->val.type);
      }
    }
  }
  /* what follows is the program */
  assert_true(j < dst->n_kv);
  assert_true(npu_gguf_str_eq(dst->kv[j].key, "npulm.program.version"));
}

static void assert_models_equal(const npulm_model *a, const npulm_model *b) {
  npulm_model_info x, y;
  npulm_model_get_info(a, &x);
  npulm_model_get_info(b, &y);
  assert_string_equal(x.arch, y.arch);
  assert_string_equal(x.name, y.name);
  assert_int_equal(x.n_vocab, y.n_vocab);
  assert_int_equal(x.dim, y.dim);
  assert_int_equal(x.n_layers, y.n_layers);
  assert_int_equal(x.n_heads, y.n_heads);
  assert_int_equal(x.n_kv_heads, y.n_kv_heads);
  assert_int_equal(x.head_dim, y.head_dim);
  assert_int_equal(x.ffn_dim, y.ffn_dim);
  assert_int_equal(x.n_ctx_train, y.n_ctx_train);
  assert_true(x.rope_base == y.rope_base && x.rms_eps == y.rms_eps);
  assert_int_equal(x.tied_output, y.tied_output);
  assert_int_equal(x.bos_id, y.bos_id);
  assert_int_equal(x.eos_id, y.eos_id);
  assert_int_equal(x.add_bos, y.add_bos);
  assert_int_equal(x.n_params, y.n_params);
  assert_memory_equal(&a->cfg, &b->cfg, sizeof(a->cfg));
  /* the tokenizer: every token's text, and an encoding */
  for (int32_t id = 0; id < x.n_vocab; id++) {
    assert_string_equal(npulm_token_text(a, id), npulm_token_text(b, id));
  }
  const char *text = "Once upon a time, there was a dog.\n";
  int32_t ia[256], ib[256];
  size_t na, nb;
  assert_int_equal(npulm_tokenize(a, text, strlen(text), true, false, ia, 256, &na, NULL),
                   NPULM_OK);
  assert_int_equal(npulm_tokenize(b, text, strlen(text), true, false, ib, 256, &nb, NULL),
                   NPULM_OK);
  assert_int_equal(na, nb);
  assert_memory_equal(ia, ib, na * sizeof(int32_t));
  /* the RoPE frequencies, which no graph names */
  assert_int_equal(a->w.rope_freqs == NULL, b->w.rope_freqs == NULL);
  if (a->w.rope_freqs != NULL) {
    assert_memory_equal(a->w.rope_freqs, b->w.rope_freqs,
                        (size_t)a->cfg.rope_dim / 2 * sizeof(float));
  }
}

/* compile 'src' with 'cp', save, open, compare; save again: the same bytes. */
static void round_trip(const char *src, const npulm_compile_params *cp) {
  char *npu = tmp_path(), *npu2 = tmp_path();
  npulm_model *m = open_ok(src);
  assert_false(npulm_model_has_program(m));
  compile_ok(m, cp);
  assert_true(npulm_model_has_program(m));
  save_ok(m, npu);
  npulm_model *p = open_ok(npu);
  assert_true(npulm_model_has_program(p));
  assert_programs_equal(m->program, p->program);
  assert_models_equal(m, p);
  assert_metadata_copied(m->gguf, p->gguf);
  /* weights are used in place from the mapping, aligned */
  for (uint64_t i = 0; i < p->gguf->n_tensors; i++) {
    assert_int_equal(p->gguf->tensors[i].type, NPU_GGML_F32);
    assert_int_equal((uintptr_t)p->gguf->tensors[i].data % 64, 0);
  }
  assert_int_equal(p->n_owned, 0);
  /* saving the opened program file again gives the same file */
  assert_resave_identical(p, npu, npu2);
  npulm_model_close(p);
  npulm_model_close(m);
  unlink(npu);
  unlink(npu2);
  free(npu);
  free(npu2);
}

/* ---- Round trips -------------------------------------------------------------------------- */

static void test_round_trip_tiny(void **state) {
  (void)state;
  struct tiny variants[] = {
      {.extra_keys = true},
      {.n_layers = 2, .untied = true, .rope_freqs = true, .mtype = NPU_GGML_F16},
      {.arch = "qwen2", .n_layers = 2, .mtype = NPU_GGML_Q8_0},
  };
  npulm_compile_params custom = npulm_compile_default_params();
  custom.n_chunks = 2;
  custom.chunks[0] = 4;
  custom.chunks[1] = 16;
  custom.n_buckets = 3;
  custom.buckets[0] = 16;
  custom.buckets[1] = 32;
  custom.buckets[2] = 64;
  npulm_compile_params one = npulm_compile_default_params(); /* fewer than the defaults */
  one.n_chunks = 1;
  one.chunks[0] = 8;
  one.n_buckets = 2;
  one.buckets[0] = 32;
  one.buckets[1] = 64;
  for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
    char *src = tmp_path();
    write_tiny(src, &variants[i]);
    round_trip(src, NULL);
    round_trip(src, &custom);
    round_trip(src, &one);
    unlink(src);
    free(src);
  }
}

static void test_round_trip_stories(void **state) {
  (void)state;
  const char *path = test_shared_path("models/stories260K.gguf");
  TEST_REQUIRE_FILE(path);
  round_trip(path, NULL);
}

/* Default chunk sizes that exceed the context are dropped; the model's context is the last
 * bucket; given options are checked. */
static void test_compile_params(void **state) {
  (void)state;
  char *src = tmp_path();
  struct tiny t = {0};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  compile_ok(m, NULL);
  const struct npu_program *p = m->program;
  assert_int_equal(p->opts.n_chunks, 2); /* 128 exceeds the context */
  assert_int_equal(p->opts.chunks[0], 16);
  assert_int_equal(p->opts.chunks[1], 64);
  assert_int_equal(p->opts.n_buckets, 1);
  assert_int_equal(p->opts.buckets[0], 64);
  assert_int_equal(p->n_graphs, 5); /* decode; each chunk with all rows' logits and the last's */

  struct {
    int chunks[3], n_chunks, buckets[3], n_buckets;
    const char *needle;
  } bad[] = {
      {{16, 4}, 2, {0}, 0, "ascending"}, {{4}, 1, {32, 16}, 2, "ascending"},
      {{4}, 1, {128}, 1, "context"},     {{1}, 1, {0}, 0, "at least 2"},
      {{32}, 1, {16}, 1, "exceeds"},     {{4}, 9, {0}, 0, "chunk sizes"},
      {{4}, 1, {16}, -1, "buckets"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    npulm_compile_params cp = npulm_compile_default_params();
    cp.n_chunks = bad[i].n_chunks;
    memcpy(cp.chunks, bad[i].chunks, sizeof(bad[i].chunks));
    cp.n_buckets = bad[i].n_buckets;
    memcpy(cp.buckets, bad[i].buckets, sizeof(bad[i].buckets));
    npulm_error err = {{0}};
    assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_ERR_ARG);
    if (strstr(err.msg, bad[i].needle) == NULL) fail_msg("'%s' lacks '%s'", err.msg, bad[i].needle);
    assert_ptr_equal(m->program, p); /* a failed compile keeps the program */
  }
  npulm_model_close(m);
  unlink(src);
  free(src);
}

/* A session of a model without a program compiles the default graphs of its own, a context
 * shorter than the largest default chunk included: the same logits as the program
 * npulm_model_compile makes with the defaults. */
static float *session_eval_ok(const npulm_model *m, const int32_t *ids, size_t n) {
  npulm_session_params sp = npulm_session_default_params();
  sp.n_threads = 1;
  npulm_session *s = NULL;
  npulm_error err;
  if (npulm_session_create(m, &sp, &s, &err) != NPULM_OK) fail_msg("%s", err.msg);
  float *logits = malloc(n * VOCAB * sizeof(float));
  assert_non_null(logits);
  if (npulm_session_eval(s, ids, n, logits, &err) != NPULM_OK) fail_msg("%s", err.msg);
  npulm_session_free(s);
  return logits;
}

static void test_session_compiles_short_context(void **state) {
  (void)state;
  char *src = tmp_path();
  struct tiny t = {0};
  write_tiny(src, &t); /* a context of 64 tokens */
  npulm_model *m = open_ok(src);
  enum { N = 20 }; /* more than the first chunk: a prompt of several steps */
  int32_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 11) % VOCAB);
  float *own = session_eval_ok(m, ids, N);
  assert_false(npulm_model_has_program(m));
  compile_ok(m, NULL);
  float *compiled = session_eval_ok(m, ids, N);
  assert_memory_equal(own, compiled, (size_t)N * VOCAB * sizeof(float));
  free(own);
  free(compiled);
  npulm_model_close(m);
  unlink(src);
  free(src);
}

static void test_api_errors(void **state) {
  (void)state;
  char *src = tmp_path(), *out = tmp_path();
  struct tiny t = {0};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  npulm_error err = {{0}};
  assert_int_equal(npulm_model_save_program(m, out, NULL, NULL, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "compile"));
  assert_int_equal(npulm_model_print_program(m, stdout, &err), NPULM_ERR_ARG);
  compile_ok(m, NULL);
  assert_int_equal(npulm_model_save_program(m, "/nonexistent-dir/x.npu", NULL, NULL, &err),
                   NPULM_ERR_IO);
  assert_non_null(strstr(err.msg, "/nonexistent-dir/x.npu"));
  /* an export never writes over the file the model is read from: its model, encodings or data
   * file (the library's own check, as a caller other than the CLI meets it) */
  char enc[512], data[512];
  snprintf(enc, sizeof(enc), "%s.encodings.json", out);
  snprintf(data, sizeof(data), "%s.data", out);
  const char *const onto[] = {src, enc, data};
  for (int i = 0; i < 3; i++) {
    if (i > 0) assert_int_equal(link(src, onto[i]), 0);
    assert_int_equal(npulm_model_export_onnx(m, i == 0 ? src : out, NULL, NULL, &err),
                     NPULM_ERR_ARG);
    assert_non_null(strstr(err.msg, "the model's own file"));
    if (i > 0) unlink(onto[i]);
  }
  assert_int_equal(npulm_check_output(src, "", &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_check_output(src, "/tmp", &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "names a directory"));
  assert_int_equal(npulm_check_output(src, out, &err), NPULM_OK);
  npulm_model_close(m);
  unlink(src);
  unlink(out);
  free(src);
  free(out);
}

struct progress_log {
  uint64_t last, total;
  int calls;
  bool monotonic;
};

static void log_progress(void *user, uint64_t done, uint64_t total) {
  struct progress_log *l = user;
  if (done < l->last || (l->calls > 0 && total != l->total) || done > total) l->monotonic = false;
  l->last = done;
  l->total = total;
  l->calls++;
}

static void test_progress_and_print(void **state) {
  (void)state;
  char *src = tmp_path(), *out = tmp_path();
  struct tiny t = {.untied = true};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  compile_ok(m, NULL);
  struct progress_log log = {.monotonic = true};
  npulm_error err = {{0}};
  assert_int_equal(npulm_model_save_program(m, out, log_progress, &log, &err), NPULM_OK);
  assert_true(log.monotonic);
  assert_true(log.calls >= 2);
  assert_int_equal(log.last, log.total);
  assert_int_equal(log.total, m->program->weight_bytes);

  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  assert_int_equal(npulm_model_print_program(m, f, &err), NPULM_OK);
  fclose(f);
  const char *needles[] = {"specializations: 5 graphs",
                           "decode",
                           "prefill",
                           "rmsnorm",
                           "not on the NPU's supported list",
                           "pinned to float",
                           "CPU fallbacks",
                           "KV cache",
                           "weights",
                           "arenas",
                           "transfer",
                           "quantization: f32",
                           "MACs per step",
                           "weight matmuls"};
  for (size_t i = 0; i < sizeof(needles) / sizeof(needles[0]); i++) {
    if (strstr(text, needles[i]) == NULL) fail_msg("description lacks '%s':\n%s", needles[i], text);
  }
  free(text);
  npulm_model_close(m);
  unlink(src);
  unlink(out);
  free(src);
  free(out);
}

/* The verifier on a compiled program changed in memory: two live activations made to share
 * bytes (still inside the arena) are caught. */
static void test_verify_aliasing(void **state) {
  (void)state;
  char *src = tmp_path();
  struct tiny t = {.n_layers = 2};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  compile_ok(m, NULL);
  int checked = 0;
  for (int32_t gi = 0; gi < m->program->n_graphs; gi++) {
    struct npu_graph *g = &m->program->graphs[gi];
    for (int32_t i = 0; i < g->n_nodes; i++) {
      const struct npu_ir_node *n = &g->nodes[i];
      if (n->op != NPU_OP_ADD) continue;
      struct npu_ir_tensor *a = &g->tensors[n->in[0]], *out = &g->tensors[n->out];
      uint64_t saved = out->offset;
      out->offset = a->offset; /* same shape, same arena: in bounds, but aliased */
      npulm_error err = {{0}};
      assert_int_equal(npu_program_verify(m, m->program, &err), NPULM_ERR_FORMAT);
      if (strstr(err.msg, "share arena bytes") == NULL) fail_msg("'%s'", err.msg);
      out->offset = saved;
      assert_int_equal(npu_program_verify(m, m->program, &err), NPULM_OK);
      checked++;
    }
  }
  assert_true(checked > 0);
  npulm_model_close(m);
  unlink(src);
  free(src);
}

/* ---- Hostile program files ---------------------------------------------------------------- */

/* A valid program file in memory, and where its fields are. */
struct image {
  uint8_t *data;
  size_t size;
  struct npu_gguf *g; /* parsed view of 'data', for locating fields */
  char *path;         /* scratch file the tampered copies are written to */
};

static void image_load(struct image *im) {
  char *src = tmp_path();
  struct tiny t = {.n_layers = 2};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  npulm_compile_params cp = npulm_compile_default_params();
  cp.n_chunks = 1;
  cp.chunks[0] = 4;
  cp.n_buckets = 2;
  cp.buckets[0] = 16;
  cp.buckets[1] = 64;
  compile_ok(m, &cp);
  im->path = tmp_path();
  save_ok(m, im->path);
  npulm_model_close(m);
  unlink(src);
  free(src);
  im->data = test_read_file(im->path, &im->size);
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(im->data, im->size, &im->g, &err), NPULM_OK);
}

static void image_free(struct image *im) {
  npu_gguf_close(im->g);
  free(im->data);
  unlink(im->path);
  free(im->path);
}

static const struct npu_gguf_kv *image_kv(const struct image *im, const char *key) {
  const struct npu_gguf_kv *kv = npu_gguf_find(im->g, key);
  if (kv == NULL) fail_msg("the test program has no key '%s'", key);
  return kv;
}

/* Offset in the file of a scalar key's value; of an array's first element. */
static size_t value_at(const struct image *im, const char *key) {
  const struct npu_gguf_kv *kv = image_kv(im, key);
  if (kv->val.type == NPU_GGUF_ARR) return (size_t)(kv->val.v.a.data - im->data);
  return (size_t)((const uint8_t *)kv->key.ptr + kv->key.len + 4 - im->data);
}

/* Recompute the checksums of an edited copy of a program image, so that the checks behind them
 * see the edit; false (the copy unchanged) when the edit left them unreadable or no longer
 * covering the file, which the loader then reports as it is. */
static bool reseal(uint8_t *data, size_t size) {
  npulm_error err = {{0}};
  return npu_gguf_checksums_reseal(data, size, NPU_PROGRAM_CHECKSUMS, &err) == NPULM_OK;
}

/* Open 'size' bytes of 'data' as a model file as they are; return the status, the model closed.
 * The scratch file holds the image again afterwards. */
static npulm_status open_raw(const struct image *im, const uint8_t *data, size_t size,
                             npulm_error *err) {
  write_all(im->path, data, size);
  npulm_model *m = NULL;
  npulm_status st = npulm_model_open(im->path, &m, err);
  write_all(im->path, im->data, im->size);
  if (st == NPULM_OK) {
    assert_non_null(m);
    npulm_model_close(m);
  } else {
    assert_null(m);
    assert_true(strlen(err->msg) > 0);
    assert_null(strchr(err->msg, '\n'));
  }
  return st;
}

/* Evaluate a few tokens with a model a tampered file gave: whatever the verifier lets through
 * must run without reading or writing out of bounds (SAN=1). */
static void run_briefly(const npulm_model *m);

/* open_raw with the checksums of the bytes recomputed (reseal). */
static npulm_status open_bytes(const struct image *im, const uint8_t *data, size_t size,
                               npulm_error *err) {
  uint8_t *sealed = malloc(size ? size : 1);
  assert_non_null(sealed);
  memcpy(sealed, data, size);
  reseal(sealed, size);
  npulm_status st = open_raw(im, sealed, size, err);
  free(sealed);
  return st;
}

static void run_briefly(const npulm_model *m) {
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = 16;
  sp.n_threads = 1;
  npulm_session *s = NULL;
  npulm_error err = {{0}};
  if (npulm_session_create(m, &sp, &s, &err) != NPULM_OK) return;
  const int32_t ids[5] = {1, 10, 20, 30, 40};
  (void)npulm_session_eval(s, ids, 4, NULL, &err);
  (void)npulm_session_eval(s, ids + 4, 1, NULL, &err);
  npulm_session_free(s);
}

/* Write bytes [at, at + n) of 'data' into the open file 'f' at the same place. */
static void put_bytes(FILE *f, const uint8_t *data, size_t at, size_t n) {
  assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
  assert_int_equal(fwrite(data + at, 1, n, f), n);
}

/* Open the image with the i32 at byte 'at' set to 'v' and its checksums recomputed. The scratch
 * file is patched in place and restored (rewriting whole files makes some filesystems flush each
 * one): the i32 and the checksums, which the patch does not move. */
static npulm_status open_patched(const struct image *im, size_t at, int32_t v, npulm_error *err) {
  const struct npu_gguf_arr *sums = &image_kv(im, NPU_PROGRAM_CHECKSUMS)->val.v.a;
  const size_t sums_at = (size_t)(sums->data - im->data);
  uint8_t *copy = malloc(im->size);
  assert_non_null(copy);
  memcpy(copy, im->data, im->size);
  memcpy(copy + at, &v, 4);
  reseal(copy, im->size);
  FILE *f = fopen(im->path, "r+b");
  assert_non_null(f);
  put_bytes(f, copy, at, 4);
  put_bytes(f, copy, sums_at, (size_t)sums->size);
  assert_int_equal(fflush(f), 0);
  free(copy);
  npulm_model *m = NULL;
  npulm_status st = npulm_model_open(im->path, &m, err);
  if (st == NPULM_OK) {
    assert_non_null(m);
    run_briefly(m);
    npulm_model_close(m);
  } else {
    assert_null(m);
    assert_true(strlen(err->msg) > 0);
    assert_null(strchr(err->msg, '\n'));
  }
  put_bytes(f, im->data, at, 4);
  put_bytes(f, im->data, sums_at, (size_t)sums->size);
  assert_int_equal(fclose(f), 0);
  return st;
}

static int32_t read_i32(const struct image *im, size_t at) {
  int32_t v;
  memcpy(&v, im->data + at, 4);
  return v;
}

/* The i32 at 'at' with its first byte set to 'b': patching it sets the one I8 at 'at' (such as a
 * stored shift) and leaves its neighbours. */
static int32_t with_i8(const struct image *im, size_t at, int8_t b) {
  uint8_t bytes[4];
  int32_t v;
  memcpy(bytes, im->data + at, 4);
  bytes[0] = (uint8_t)b;
  memcpy(&v, bytes, 4);
  return v;
}

/* Set the i32 at 'at' to 'v' and expect 'want' with 'needle' in the message. */
static void expect_patch(const struct image *im, const char *what, size_t at, int32_t v,
                         npulm_status want, const char *needle) {
  npulm_error err = {{0}};
  npulm_status st = open_patched(im, at, v, &err);
  if (st != want) fail_msg("%s: status %d (want %d): %s", what, st, want, err.msg);
  if (needle != NULL && strstr(err.msg, needle) == NULL) {
    fail_msg("%s: message '%s' lacks '%s'", what, err.msg, needle);
  }
}

/* Offset of field 'f' of record 'r' in an i32 record array 'key' of 'fields' per record. */
static size_t field_at(const struct image *im, const char *key, int fields, int r, int f) {
  const struct npu_gguf_kv *kv = image_kv(im, key);
  assert_true((uint64_t)(r * fields + f) < kv->val.v.a.n);
  return value_at(im, key) + 4 * (size_t)(r * fields + f);
}

/* Offset of the bytes of name 'i' of the string array 'key', its length in '*len'. */
static size_t name_at(const struct image *im, const char *key, int i, size_t *len) {
  const struct npu_gguf_kv *kv = image_kv(im, key);
  assert_true((uint64_t)i < kv->val.v.a.n);
  size_t at = value_at(im, key);
  uint64_t n;
  for (int k = 0;; k++) {
    memcpy(&n, im->data + at, sizeof(n));
    if (k == i) break;
    at += 8 + (size_t)n;
  }
  *len = (size_t)n;
  return at + 8;
}

/* The first tensor of graph 0 of 'kind' on 'backend' (backend < 0: any). */
static int find_tensor(const struct image *im, int kind, int backend) {
  const struct npu_gguf_kv *kv = image_kv(im, "npulm.graph.0.tensors");
  for (int i = 0; (uint64_t)(i + 1) * TENSOR_FIELDS <= kv->val.v.a.n; i++) {
    if (read_i32(im, field_at(im, "npulm.graph.0.tensors", TENSOR_FIELDS, i, 0)) == kind &&
        (backend < 0 ||
         read_i32(im, field_at(im, "npulm.graph.0.tensors", TENSOR_FIELDS, i, 2)) == backend)) {
      return i;
    }
  }
  fail_msg("no tensor of kind %d", kind);
  return -1;
}

/* The first node of graph 0 running 'op'. */
static int find_node(const struct image *im, int op) {
  const struct npu_gguf_kv *kv = image_kv(im, "npulm.graph.0.nodes");
  for (int i = 0; (uint64_t)(i + 1) * 9 <= kv->val.v.a.n; i++) {
    if (read_i32(im, field_at(im, "npulm.graph.0.nodes", 9, i, 0)) == op) return i;
  }
  fail_msg("no node running op %d", op);
  return -1;
}

static void test_hostile_version_and_keys(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  npulm_error err = {{0}};
  assert_int_equal(open_bytes(&im, im.data, im.size, &err), NPULM_OK);

  size_t v = value_at(&im, "npulm.program.version");
  expect_patch(&im, "version 11", v, 11, NPULM_ERR_UNSUPPORTED, "version 11");
  expect_patch(&im, "version 9", v, 9, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 8", v, 8, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 7", v, 7, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 6", v, 6, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 5", v, 5, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 4", v, 4, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 3", v, 3, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 2", v, 2, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 1", v, 1, NPULM_ERR_UNSUPPORTED, "recompile");
  expect_patch(&im, "version 0", v, 0, NPULM_ERR_UNSUPPORTED, "version 0");
  /* the version as an f32 (the same width, so the file still parses) */
  expect_patch(&im, "version type", v - 4, NPU_GGUF_F32, NPULM_ERR_FORMAT, "npulm.program.version");

  /* missing keys: rename each by changing its last byte */
  const char *keys[] = {"npulm.compile.chunks",       "npulm.compile.buckets",
                        "npulm.compile.float_ops",    "npulm.weights",
                        "npulm.graph.count",          "npulm.graph.1.info",
                        "npulm.graph.2.arena_size",   "npulm.graph.3.tensors",
                        "npulm.graph.0.tensor_names", "npulm.graph.1.nodes",
                        "npulm.graph.2.subgraphs",    "llama.block_count",
                        "tokenizer.ggml.tokens",      "npulm.quant.mode",
                        "npulm.weights.float"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    const struct npu_gguf_kv *kv = image_kv(&im, keys[i]);
    uint8_t *copy = malloc(im.size);
    assert_non_null(copy);
    memcpy(copy, im.data, im.size);
    copy[(const uint8_t *)kv->key.ptr + kv->key.len - 1 - im.data] ^= 0x20;
    npulm_status st = open_bytes(&im, copy, im.size, &err);
    free(copy);
    if (st != NPULM_ERR_FORMAT || strstr(err.msg, keys[i]) == NULL) {
      fail_msg("renamed '%s': status %d, '%s'", keys[i], st, err.msg);
    }
  }
  /* the wrong type for a record array: i32 -> f32 elements */
  size_t at = value_at(&im, "npulm.graph.0.nodes") - 12;
  expect_patch(&im, "nodes as f32", at, NPU_GGUF_F32, NPULM_ERR_FORMAT, "npulm.graph.0.nodes");
  image_free(&im);
}

static void test_hostile_weights(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  npulm_error err = {{0}};
  /* a weight name that is not the model's */
  const struct npu_gguf_kv *kv = image_kv(&im, "npulm.weights");
  const uint8_t *names = kv->val.v.a.data;
  const char *needle = "blk.1.attn_q.weight";
  const uint8_t *hit = NULL;
  for (size_t i = 0; i + strlen(needle) <= kv->val.v.a.size && hit == NULL; i++) {
    if (memcmp(names + i, needle, strlen(needle)) == 0) hit = names + i;
  }
  assert_non_null(hit);
  uint8_t *copy = malloc(im.size);
  assert_non_null(copy);
  memcpy(copy, im.data, im.size);
  copy[hit - im.data + 11] = 'x'; /* attn_q -> attn_x */
  assert_int_equal(open_bytes(&im, copy, im.size, &err), NPULM_ERR_FORMAT);
  assert_non_null(strstr(err.msg, "blk.1.attn_x.weight"));
  free(copy);

  /* a weight tensor renamed away: the model loader misses it */
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(im.g, "blk.0.ffn_up.weight");
  assert_non_null(t);
  copy = malloc(im.size);
  assert_non_null(copy);
  memcpy(copy, im.data, im.size);
  copy[(const uint8_t *)t->name.ptr - im.data] = 'X';
  assert_int_equal(open_bytes(&im, copy, im.size, &err), NPULM_ERR_FORMAT);
  assert_non_null(strstr(err.msg, "blk.0.ffn_up.weight"));
  free(copy);

  /* a graph weight tensor pointing at another weight (of another shape) */
  int w = find_tensor(&im, NPU_TK_WEIGHT, -1);
  expect_patch(&im, "weight ref", field_at(&im, "npulm.graph.0.tensors", TENSOR_FIELDS, w, 7), 1,
               NPULM_ERR_FORMAT, "graph 0");
  expect_patch(&im, "weight ref range", field_at(&im, "npulm.graph.0.tensors", TENSOR_FIELDS, w, 7),
               9999, NPULM_ERR_FORMAT, "graph 0");
  /* an absent bias (the tiny llama has none) */
  expect_patch(&im, "absent weight", field_at(&im, "npulm.graph.0.tensors", TENSOR_FIELDS, w, 7),
               3 + 4, NPULM_ERR_FORMAT, "does not have");
  image_free(&im);
}

static void test_hostile_records(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  const char *T = "npulm.graph.0.tensors", *N = "npulm.graph.0.nodes",
             *S = "npulm.graph.0.subgraphs";
  int act = find_tensor(&im, NPU_TK_ACT, NPU_BE_NPU);
  int kv = find_tensor(&im, NPU_TK_KV, -1);
  int rms = find_node(&im, NPU_OP_RMSNORM), mm = find_node(&im, NPU_OP_MATMUL);
  int rope = find_node(&im, NPU_OP_ROPE);
  struct {
    const char *what;
    size_t at;
    int32_t v;
    const char *needle;
  } cases[] = {
      {"node input id", field_at(&im, N, 9, 3, 3), 9999, "input tensor id out of range"},
      {"node input id -2", field_at(&im, N, 9, 3, 4), -2, "input tensor id out of range"},
      {"node output id", field_at(&im, N, 9, 2, 6), -1, "output tensor id out of range"},
      {"node output id big", field_at(&im, N, 9, 2, 6), INT32_MAX, "output tensor id out of range"},
      {"node op", field_at(&im, N, 9, 1, 0), NPU_OP_COUNT, "unknown op"},
      {"node backend", field_at(&im, N, 9, 1, 1), 2, "unknown backend"},
      {"node layer", field_at(&im, N, 9, 1, 7), 2, "layer"},
      {"node param", field_at(&im, N, 9, rms, 8), 0x7fc00000, "not finite"},
      {"rope on the NPU", field_at(&im, N, 9, rope, 1), NPU_BE_NPU, "does not support"},
      {"matmul on the CPU", field_at(&im, N, 9, mm, 1), NPU_BE_CPU, "arena"},
      {"node reads an unwritten tensor", field_at(&im, N, 9, 1, 3), act + 40, "graph 0"},
      {"tensor kind", field_at(&im, T, TENSOR_FIELDS, act, 0), 7, "unknown kind"},
      {"tensor dtype", field_at(&im, T, TENSOR_FIELDS, act, 1), 9, "unknown dtype"},
      {"tensor dtype i8", field_at(&im, T, TENSOR_FIELDS, act, 1), NPU_DT_I8, "graph 0"},
      {"tensor backend", field_at(&im, T, TENSOR_FIELDS, act, 2), -1, "unknown backend"},
      {"tensor shape 0", field_at(&im, T, TENSOR_FIELDS, act, 5), 0, "dimension"},
      {"tensor shape big", field_at(&im, T, TENSOR_FIELDS, act, 5), INT32_MAX, "graph 0"},
      {"tensor offset beyond the arena", field_at(&im, T, TENSOR_FIELDS, act, 8), 1 << 30,
       "outside"},
      {"tensor offset high word", field_at(&im, T, TENSOR_FIELDS, act, 9), 1, "outside"},
      {"tensor offset misaligned", field_at(&im, T, TENSOR_FIELDS, act, 8), 2, "not aligned"},
      {"tensor scale", field_at(&im, T, TENSOR_FIELDS, act, 10), 0, "quantization"},
      {"kv cache width", field_at(&im, T, TENSOR_FIELDS, kv, 5), 2 * KV_HEADS * HEAD_DIM,
       "graph 0"},
      {"kv cache layer", field_at(&im, T, TENSOR_FIELDS, kv, 7), 5, "graph 0"},
      {"tensor layer", field_at(&im, T, TENSOR_FIELDS, act, TENSOR_LAYER), -2, "invalid layer"},
      {"tensor layer big", field_at(&im, T, TENSOR_FIELDS, act, TENSOR_LAYER), 5, "graph 0"},
      {"tensor role", field_at(&im, T, TENSOR_FIELDS, act, TENSOR_ROLE), NPU_ROLE_COUNT,
       "unknown role"},
      {"tensor role 256", field_at(&im, T, TENSOR_FIELDS, act, TENSOR_ROLE), 256, "unknown role"},
      {"arena too small", value_at(&im, "npulm.graph.0.arena_size"), 64, "outside"},
      {"arena absurd", value_at(&im, "npulm.graph.0.arena_size") + 4, 1 << 20, "larger"},
      {"subgraph count", field_at(&im, S, 3, 0, 1), 1000, "subgraph 0"},
      {"subgraph first", field_at(&im, S, 3, 1, 0), 0, "subgraph 1"},
      {"subgraph backend", field_at(&im, S, 3, 0, 2), 1 - read_i32(&im, field_at(&im, S, 3, 0, 2)),
       "subgraph 0"},
      {"transfers", field_at(&im, "npulm.graph.0.info", 3, 0, 2), 1, "transfers"},
      {"rows", field_at(&im, "npulm.graph.0.info", 3, 0, 0), 4, "expected rows 1"},
      {"ctx", field_at(&im, "npulm.graph.1.info", 3, 0, 1), 32, "expected rows 1, ctx 64"},
      {"graph count", value_at(&im, "npulm.graph.count"), 3, "graphs"},
      {"float ops", value_at(&im, "npulm.compile.float_ops"), -1, "unknown ops"},
      {"chunks", value_at(&im, "npulm.compile.chunks"), 1000, "compile options"},
      {"buckets", value_at(&im, "npulm.compile.buckets") + 4, 8, "compile options"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    expect_patch(&im, cases[i].what, cases[i].at, cases[i].v, NPULM_ERR_FORMAT, cases[i].needle);
  }

  /* two live activations sharing bytes: move the output of a matmul onto its input */
  int32_t x = read_i32(&im, field_at(&im, N, 9, mm, 3)),
          y = read_i32(&im, field_at(&im, N, 9, mm, 6));
  uint8_t *copy = malloc(im.size);
  assert_non_null(copy);
  memcpy(copy, im.data, im.size);
  memcpy(copy + field_at(&im, T, TENSOR_FIELDS, y, 8),
         im.data + field_at(&im, T, TENSOR_FIELDS, x, 8), 8);
  npulm_error err = {{0}};
  npulm_status st = open_bytes(&im, copy, im.size, &err);
  free(copy);
  if (st != NPULM_ERR_FORMAT ||
      (strstr(err.msg, "share") == NULL && strstr(err.msg, "outside") == NULL)) {
    fail_msg("aliasing plan: status %d, '%s'", st, err.msg);
  }

  /* a NUL inside a tensor name (the first one stored: derived names are empty) */
  size_t name_len = 0, name = 0;
  for (int i = 0; name_len == 0; i++)
    name = name_at(&im, "npulm.graph.0.tensor_names", i, &name_len);
  copy = malloc(im.size);
  assert_non_null(copy);
  memcpy(copy, im.data, im.size);
  copy[name] = '\0';
  assert_int_equal(open_bytes(&im, copy, im.size, &err), NPULM_ERR_FORMAT);
  assert_non_null(strstr(err.msg, "name"));
  free(copy);

  /* names the records imply are stored empty (an activation's, from its role and layer; a
   * weight's, from the weight table), the others whole (a KV cache's "k_cache" is not
   * "blk.0.k_cache"); an empty name whose record implies none is refused */
  int w = find_tensor(&im, NPU_TK_WEIGHT, -1);
  name_at(&im, "npulm.graph.0.tensor_names", act, &name_len);
  assert_int_equal(name_len, 0);
  name_at(&im, "npulm.graph.0.tensor_names", w, &name_len);
  assert_int_equal(name_len, 0);
  name_at(&im, "npulm.graph.0.tensor_names", kv, &name_len);
  assert_int_equal(name_len, strlen("k_cache"));
  npulm_model *m = NULL;
  assert_int_equal(npulm_model_open(im.path, &m, &err), NPULM_OK);
  const struct npu_graph *g0 = &m->program->graphs[0];
  assert_string_equal(g0->tensors[w].name, m->program->weights[g0->tensors[w].ref].name);
  const char *role = npu_tensor_role_name((enum npu_tensor_role)g0->tensors[act].role);
  char want[NPU_IR_NAME_MAX];
  if (g0->tensors[act].layer >= 0) {
    snprintf(want, sizeof(want), "blk.%d.%s", g0->tensors[act].layer, role);
  } else {
    snprintf(want, sizeof(want), "%s", role);
  }
  assert_string_equal(g0->tensors[act].name, want);
  npulm_model_close(m);
  expect_patch(&im, "empty name without a role", field_at(&im, T, TENSOR_FIELDS, act, TENSOR_ROLE),
               NPU_ROLE_NONE, NPULM_ERR_FORMAT, "empty name");
  expect_patch(&im, "empty name of a weight without one",
               field_at(&im, T, TENSOR_FIELDS, act, TENSOR_KIND), NPU_TK_WEIGHT, NPULM_ERR_FORMAT,
               "empty name");
  expect_patch(&im, "empty weight name out of the table",
               field_at(&im, T, TENSOR_FIELDS, w, TENSOR_REF), 9999, NPULM_ERR_FORMAT,
               "empty name");
  image_free(&im);
}

/* Every i32 of graph 0's records and every program scalar, set to edge values: each file opens or
 * fails with one line; none crashes or reads out of bounds (SAN=1). */
static void test_hostile_sweep(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  const char *arrays[] = {"npulm.graph.0.info",       "npulm.graph.0.tensors",
                          "npulm.graph.0.nodes",      "npulm.graph.0.subgraphs",
                          "npulm.graph.0.arena_size", "npulm.compile.chunks",
                          "npulm.compile.buckets"};
  int accepted = 0, rejected = 0;
  for (size_t k = 0; k < sizeof(arrays) / sizeof(arrays[0]); k++) {
    const struct npu_gguf_kv *kv = image_kv(&im, arrays[k]);
    size_t base = value_at(&im, arrays[k]);
    size_t n_words = (size_t)kv->val.v.a.size / 4;
    for (size_t i = 0; i < n_words; i++) {
      int32_t old = read_i32(&im, base + 4 * i);
      int32_t values[] = {-1, old + 1, INT32_MAX, INT32_MIN, 64};
      for (size_t j = 0; j < sizeof(values) / sizeof(values[0]); j++) {
        if (values[j] == old) continue;
        npulm_error err = {{0}};
        npulm_status st = open_patched(&im, base + 4 * i, values[j], &err);
        if (st == NPULM_OK) accepted++;
        else rejected++;
      }
    }
  }
  print_message("record sweep: %d tampered files rejected, %d accepted (fields such as the layer "
                "of a node or an unused zero point are free)\n",
                rejected, accepted);
  assert_true(rejected > accepted);
  image_free(&im);
}

/* Every prefix of the metadata and tensor infos, and cuts through the weights: a clear error. */
static void test_hostile_truncated(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  size_t header = (size_t)im.g->data_offset;
  size_t step = header / 3000 + 1;
  int n = 0;
  /* from the longest cut to the shortest, so that each is a truncate() of the last */
  write_all(im.path, im.data, im.size);
  for (size_t cut = im.size - 1; cut > 0;
       cut -= cut > header ? (im.size - header) / 50 + 1 : step) {
    assert_int_equal(truncate(im.path, (off_t)cut), 0);
    npulm_model *m = NULL;
    npulm_error err = {{0}};
    npulm_status st = npulm_model_open(im.path, &m, &err);
    if (st == NPULM_OK)
      fail_msg("a program file cut at %zu of %zu bytes was accepted", cut, im.size);
    assert_null(m);
    assert_null(strchr(err.msg, '\n'));
    n++;
    if (cut < step) break;
  }
  print_message("%d truncated program files rejected\n", n);
  image_free(&im);
}

/* ---- Shape products that overflow 64 bits -------------------------------------------------- */

/* [2^21, 2^21, 2^22] has 2^64 elements: a product that wraps to 0 must not pass as small. */
static void test_ir_shape_overflow(void **state) {
  (void)state;
  struct npu_ir_tensor t = {
      .kind = NPU_TK_ACT, .dtype = NPU_DT_F32, .ne = {1 << 21, 1 << 21, 1 << 22}};
  assert_int_equal(npu_ir_tensor_bytes(&t), UINT64_MAX);
  t.ne[2] = 1;
  assert_int_equal(npu_ir_tensor_bytes(&t), 4ull << 42);
  t.ne[0] = INT32_MAX;
  t.ne[1] = INT32_MAX;
  t.ne[2] = INT32_MAX;
  assert_int_equal(npu_ir_tensor_bytes(&t), UINT64_MAX);

  struct image im;
  image_load(&im);
  int act = find_tensor(&im, NPU_TK_ACT, NPU_BE_NPU);
  const char *T = "npulm.graph.0.tensors";
  uint8_t *copy = malloc(im.size);
  assert_non_null(copy);
  memcpy(copy, im.data, im.size);
  int32_t dims[3] = {1 << 21, 1 << 21, 1 << 22};
  for (int d = 0; d < 3; d++)
    memcpy(copy + field_at(&im, T, TENSOR_FIELDS, act, 4 + d), &dims[d], 4);
  npulm_error err = {{0}};
  assert_int_equal(open_bytes(&im, copy, im.size, &err), NPULM_ERR_FORMAT);
  if (strstr(err.msg, "invalid") == NULL) fail_msg("'%s'", err.msg);
  free(copy);
  image_free(&im);
}

/* ---- Integer programs ----------------------------------------------------------------------- */

/* The packed weights of every matmul of 'p', and of every gather that borrows them, lie in the
 * program's block of huge pages, and every other table in [lo, hi) (lo NULL: unchecked), 64-byte
 * aligned. */
static void assert_packed_placed(const struct npu_program *p, const uint8_t *lo,
                                 const uint8_t *hi) {
  assert_non_null(p->packed_arena);
  for (int32_t i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *site = &p->qsites[i];
    if (site->packed == NULL) continue;
    const uint8_t *at = site->packed, *in = lo, *end = hi;
    if (site->op == NPU_OP_MATMUL || site->table_site >= 0) {
      in = p->packed_arena;
      end = in + p->packed_arena_size;
    }
    if (in == NULL) continue;
    assert_true(at >= in && at + site->packed_size <= end);
    assert_int_equal((uintptr_t)at % 64, 0);
  }
}

/* Replace the program of 'm' with one compiled with 'o' and quantized in 'mode' (shadow
 * threshold 'threshold' if > 0) on the built-in calibration text; it must pass verification. */
static void quantize_ok(npulm_model *m, const struct npu_compile_options *o,
                        enum npu_quant_mode mode, float threshold) {
  npulm_error err = {{0}};
  struct npu_program *p = NULL;
  struct npu_compile_options co = *o;
  co.float_ops = npu_quant_float_ops(mode, co.float_ops);
  if (npu_compile(m, &co, NULL, NULL, &p, &err) != NPULM_OK) fail_msg("compile: %s", err.msg);
  size_t len = strlen(npu_calib_default_text), cap = 4 * len + 16, n = 0;
  int32_t *ids = malloc(cap * sizeof(int32_t));
  assert_non_null(ids);
  assert_int_equal(npulm_tokenize(m, npu_calib_default_text, len, false, false, ids, cap, &n, &err),
                   NPULM_OK);
  if (n > 512) n = 512;
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  struct npu_quant_options qo;
  npu_quant_default_options(&qo);
  qo.mode = mode;
  if (threshold > 0.0f) qo.shadow_threshold = threshold;
  npulm_status st =
      npu_quantize_program(m, p, ids, n, info.add_bos ? info.bos_id : -1, &qo, NULL, NULL, &err);
  free(ids);
  if (st != NPULM_OK) fail_msg("quantize (%s): %s", npu_quant_mode_name(mode), err.msg);
  npu_program_free(m->program);
  m->program = p;
  if (npu_program_verify(m, p, &err) != NPULM_OK) {
    fail_msg("the quantizer's own program fails verification: %s", err.msg);
  }
  assert_packed_placed(p, NULL, NULL);
}

static void assert_sites_equal(const struct npu_qsite *x, const struct npu_qsite *y) {
  assert_string_equal(x->name, y->name);
  assert_int_equal(x->op, y->op);
  assert_int_equal(x->n, y->n);
  assert_int_equal(x->k, y->k);
  assert_int_equal(x->packed_size, y->packed_size);
  assert_int_equal(x->table_site, y->table_site);
  assert_int_equal(x->packed == NULL, y->packed == NULL);
  if (x->packed != NULL) assert_memory_equal(x->packed, y->packed, (size_t)x->packed_size);
  size_t n = (size_t)x->n;
  assert_int_equal(x->mult == NULL, y->mult == NULL);
  assert_int_equal(x->shift == NULL, y->shift == NULL);
  if (x->mult != NULL) assert_memory_equal(x->mult, y->mult, n * sizeof(int32_t));
  if (x->shift != NULL) assert_memory_equal(x->shift, y->shift, n * sizeof(int32_t));
  /* the kernels' parameter blocks: the same values, pointing at the site's own arrays */
  assert_int_equal(x->gemm.x_zero_point, y->gemm.x_zero_point);
  assert_int_equal(x->gemm.y_zero_point, y->gemm.y_zero_point);
  assert_int_equal(x->gather.y_zero_point, y->gather.y_zero_point);
  assert_true((x->gemm.mult == x->mult) == (y->gemm.mult == y->mult));
  assert_true((x->gemm.shift == x->shift) == (y->gemm.shift == y->shift));
  assert_true((x->gather.mult == x->mult) == (y->gather.mult == y->mult));
  assert_true((x->gather.shift == x->shift) == (y->gather.shift == y->shift));
  assert_memory_equal(&x->add, &y->add, sizeof(x->add));
  assert_memory_equal(&x->mul, &y->mul, sizeof(x->mul));
  assert_memory_equal(&x->qk, &y->qk, sizeof(x->qk));
  assert_memory_equal(&x->softmax, &y->softmax, sizeof(x->softmax));
  assert_memory_equal(&x->pv, &y->pv, sizeof(x->pv));
  assert_int_equal(x->rmsnorm.eps, y->rmsnorm.eps);
  assert_int_equal(x->rmsnorm.shift, y->rmsnorm.shift);
  assert_int_equal(x->rmsnorm.y_zero_point, y->rmsnorm.y_zero_point);
  assert_true((x->rmsnorm.mult == x->mult) == (y->rmsnorm.mult == y->mult));
  assert_memory_equal(x->lut, y->lut, sizeof(x->lut));
  assert_int_equal(x->lut_wide, y->lut_wide);
  if (x->lut_wide) assert_memory_equal(x->lut16, y->lut16, sizeof(x->lut16));
  if (x->op == NPU_OP_MATMUL) {
    assert_int_equal(x->w_bits, y->w_bits);
    assert_int_equal(x->w_block, y->w_block);
    assert_int_equal(x->gemm16.acc_shift, y->gemm16.acc_shift);
    assert_int_equal(x->gemm16.y_zero_point, y->gemm16.y_zero_point);
    assert_int_equal(x->gemm16.block, y->gemm16.block);
    assert_true(y->gemm16.mult == y->mult && y->gemm16.shift == y->shift);
  }
  assert_int_equal(x->n_outliers, y->n_outliers);
  assert_int_equal(x->outlier_dim, y->outlier_dim);
  size_t no = (size_t)x->n_outliers, dim = (size_t)x->outlier_dim;
  if (no > 0) {
    assert_memory_equal(x->outliers, y->outliers, no * sizeof(int32_t));
    assert_memory_equal(x->outlier_w, y->outlier_w, no * n * sizeof(float));
  }
  assert_int_equal(x->outlier_gate == NULL, y->outlier_gate == NULL);
  assert_int_equal(x->outlier_up == NULL, y->outlier_up == NULL);
  if (x->outlier_gate != NULL) {
    assert_memory_equal(x->outlier_gate, y->outlier_gate, no * dim * sizeof(float));
    assert_memory_equal(x->outlier_up, y->outlier_up, no * dim * sizeof(float));
  }
}

/* The integer halves of two programs: mode, options, table, sites, the graphs' links. */
static void assert_quant_equal(const struct npu_program *a, const struct npu_program *b) {
  assert_int_equal(a->quant_mode, b->quant_mode);
  assert_memory_equal(&a->smooth_alpha, &b->smooth_alpha, sizeof(float));
  assert_memory_equal(&a->shadow_threshold, &b->shadow_threshold, sizeof(float));
  assert_int_equal(a->n_qtensors, b->n_qtensors);
  for (int32_t i = 0; i < a->n_qtensors; i++) {
    assert_string_equal(a->qtensors[i].name, b->qtensors[i].name);
    assert_int_equal(a->qtensors[i].dtype, b->qtensors[i].dtype);
    assert_memory_equal(&a->qtensors[i].q.scale, &b->qtensors[i].q.scale, sizeof(float));
    assert_int_equal(a->qtensors[i].q.zero_point, b->qtensors[i].q.zero_point);
  }
  assert_int_equal(a->n_qsites, b->n_qsites);
  for (int32_t i = 0; i < a->n_qsites; i++) assert_sites_equal(&a->qsites[i], &b->qsites[i]);
  for (int32_t gi = 0; gi < a->n_graphs; gi++) {
    const struct npu_graph *x = &a->graphs[gi], *y = &b->graphs[gi];
    assert_int_equal(x->node_site == NULL, y->node_site == NULL);
    if (x->node_site != NULL) {
      assert_memory_equal(x->node_site, y->node_site, (size_t)x->n_nodes * sizeof(int32_t));
    }
  }
}

/* Logits of 'm' for a prompt evaluated as one prefill and then token by token (decode). */
static float *eval_logits(const npulm_model *m, size_t *n_out) {
  static const char *text = "Once upon a time, there was a little girl named Lily. She loved";
  int32_t ids[128];
  size_t n;
  npulm_error err = {{0}};
  assert_int_equal(npulm_tokenize(m, text, strlen(text), true, false, ids, 128, &n, &err),
                   NPULM_OK);
  if (n > 40) n = 40; /* a byte-level vocabulary needs many */
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = 64;
  sp.n_threads = 2;
  npulm_session *s = NULL;
  if (npulm_session_create(m, &sp, &s, &err) != NPULM_OK) fail_msg("session: %s", err.msg);
  size_t vocab = (size_t)info.n_vocab, split = n - 4;
  float *logits = malloc(n * vocab * sizeof(float));
  assert_non_null(logits);
  if (npulm_session_eval(s, ids, split, logits, &err) != NPULM_OK) fail_msg("eval: %s", err.msg);
  for (size_t i = split; i < n; i++) {
    if (npulm_session_eval(s, &ids[i], 1, logits + i * vocab, &err) != NPULM_OK) {
      fail_msg("eval: %s", err.msg);
    }
  }
  npulm_session_free(s);
  *n_out = n * vocab;
  return logits;
}

/* Models 'a' and 'b' give the same logits, bit for bit, prefill and decode (eval_logits). */
static void assert_same_logits(const npulm_model *a, const npulm_model *b) {
  size_t n1, n2;
  float *l1 = eval_logits(a, &n1), *l2 = eval_logits(b, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(l1, l2, n1 * sizeof(float));
  free(l1);
  free(l2);
}

/* The options of the integer round trips: two prefill sizes and two buckets, so that both kinds
 * of step run. */
static void small_options(const npulm_model *m, struct npu_compile_options *o) {
  npu_compile_default_options(&m->cfg, o);
  memset(o->chunks, 0, sizeof(o->chunks));
  memset(o->buckets, 0, sizeof(o->buckets));
  o->n_chunks = 1;
  o->chunks[0] = 16;
  o->n_buckets = 2;
  o->buckets[0] = m->cfg.n_ctx_train > 128 ? 64 : m->cfg.n_ctx_train / 2;
  o->buckets[1] = m->cfg.n_ctx_train;
}

/* Quantize 'src' in 'mode', save, open: the same program, integer data and logits; saved again,
 * the same bytes. Returns the number of outlier channels. */
static int32_t quant_round_trip(const char *src, enum npu_quant_mode mode, float threshold) {
  char *npu = tmp_path(), *npu2 = tmp_path();
  npulm_model *m = open_ok(src);
  struct npu_compile_options o;
  small_options(m, &o);
  quantize_ok(m, &o, mode, threshold);
  save_ok(m, npu);
  npulm_model *p = open_ok(npu);
  assert_programs_equal(m->program, p->program);
  assert_quant_equal(m->program, p->program);
  assert_models_equal(m, p);
  /* other gathers' tables are used in place from the mapping; the rest is the program's own */
  const struct npu_program *lp = p->program;
  assert_true(lp->qsites_mapped);
  assert_packed_placed(lp, p->gguf->base, p->gguf->base + p->gguf->size);
  int32_t outliers = 0;
  for (int32_t i = 0; i < lp->n_qsites; i++) outliers += lp->qsites[i].n_outliers;
  assert_int_equal(p->n_owned, 0);
  /* the same logits, bit for bit, prefill and decode */
  size_t n1, n2;
  float *l1 = eval_logits(m, &n1), *l2 = eval_logits(p, &n2);
  assert_int_equal(n1, n2);
  assert_memory_equal(l1, l2, n1 * sizeof(float));
  /* ... and they are the integer program's: not those of the FP32 program */
  npulm_model *f = open_ok(src);
  compile_ok(f, NULL);
  size_t n3;
  float *l3 = eval_logits(f, &n3);
  assert_int_equal(n1, n3);
  assert_true(memcmp(l1, l3, n1 * sizeof(float)) != 0);
  free(l1);
  free(l2);
  free(l3);
  npulm_model_close(f);
  /* saving the opened program file again gives the same file */
  assert_resave_identical(p, npu, npu2);
  npulm_model_close(p);
  npulm_model_close(m);
  unlink(npu);
  unlink(npu2);
  free(npu);
  free(npu2);
  return outliers;
}

static void test_round_trip_quantized(void **state) {
  (void)state;
  const char *path = test_shared_path("models/stories260K.gguf");
  TEST_REQUIRE_FILE(path);
  assert_int_equal(quant_round_trip(path, NPU_QUANT_NAIVE, 0.0f), 0);
  int32_t outliers = quant_round_trip(path, NPU_QUANT_SHADOW, 3.0f);
  print_message("stories260K, w8a8-shadow at threshold 3: %d outlier channels\n", outliers);
  assert_true(outliers > 0);
  assert_int_equal(quant_round_trip(path, NPU_QUANT_SMOOTH, 0.0f), 0);
}

/* Every precision: int16 activations, int4 weights per channel and in blocks (stories260K's FFN
 * of 172 is no multiple of the block), with and without outlier handling; each program's int4
 * matmuls are int4 but its classifier's int8. */
static void test_round_trip_precisions(void **state) {
  (void)state;
  const char *path = test_shared_path("models/stories260K.gguf");
  TEST_REQUIRE_FILE(path);
  for (int prec = NPU_PREC_W8A16; prec < NPU_PREC_COUNT; prec++) {
    quant_round_trip(path, npu_quant_mode_of((enum npu_precision)prec, NPU_OUTLIERS_NAIVE), 0.0f);
  }
  quant_round_trip(path, npu_quant_mode_of(NPU_PREC_W4A16_BLOCK, NPU_OUTLIERS_SHADOW), 3.0f);
  quant_round_trip(path, npu_quant_mode_of(NPU_PREC_W8A16, NPU_OUTLIERS_SMOOTH), 0.0f);
  struct tiny qwen2 = {.arch = "qwen2", .n_layers = 2}; /* biases in int16 units */
  char *src = tmp_path();
  write_tiny(src, &qwen2);
  quant_round_trip(src, npu_quant_mode_of(NPU_PREC_W4A16_BLOCK, NPU_OUTLIERS_SMOOTH), 0.0f);
  quant_round_trip(src, npu_quant_mode_of(NPU_PREC_W4A8, NPU_OUTLIERS_SHADOW), 2.0f);
  unlink(src);
  free(src);
}

/* The verifier holds int4 packed weights to what npu_qc4w_gemm_pack writes: a block scale above
 * 15, a non-zero padding nibble, a wrong weight sum are each refused; restored, accepted.
 * stories260K's ffn_down has k = 172: its last 32-k chunk has 20 nibbles of padding a channel. */
static void test_verify_int4_packing(void **state) {
  (void)state;
  const char *path = test_shared_path("models/stories260K.gguf");
  TEST_REQUIRE_FILE(path);
  npulm_model *m = open_ok(path);
  struct npu_compile_options o;
  small_options(m, &o);
  quantize_ok(m, &o, npu_quant_mode_of(NPU_PREC_W4A16_BLOCK, NPU_OUTLIERS_NAIVE), 0.0f);
  struct npu_qsite *s = NULL;
  for (int32_t i = 0; i < m->program->n_qsites && s == NULL; i++) {
    if (strcmp(m->program->qsites[i].name, "blk.0.ffn_down") == 0) s = &m->program->qsites[i];
  }
  assert_non_null(s);
  assert_int_equal(s->w_bits, 4);
  assert_int_equal(s->w_block, NPU_QC4W_BLOCK);
  assert_int_equal(s->k, 172);
  uint8_t *packed = s->packed;
  const size_t chunk = NPU_QS8_GEMM_NR + 4 * 64, head = 2 * NPU_QS8_GEMM_NR * sizeof(int32_t);
  struct {
    const char *what;
    size_t at;     /* byte of the packed weights */
    uint8_t value; /* set to this */
    const char *needle;
  } cases[] = {
      /* channel 0's block scale of chunk 1 */
      {"block scale 16", head + chunk, 16, "block scale"},
      /* chunk 5 holds k = 160 .. 191; pair 2 of it k = 176 .. 183, past k: byte [j 0, t 0] */
      {"padding nibble", head + 5 * chunk + NPU_QS8_GEMM_NR + 2 * 64, 0x88 ^ 0x01, "padding"},
      /* channel 3's wsum (its low byte) */
      {"weight sum", 4 * (NPU_QS8_GEMM_NR + 3), 0, "weight sum"},
  };
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    const uint8_t saved = packed[cases[c].at];
    packed[cases[c].at] = cases[c].value == saved ? (uint8_t)(saved + 1) : cases[c].value;
    npulm_error err = {{0}};
    assert_int_equal(npu_program_verify(m, m->program, &err), NPULM_ERR_FORMAT);
    if (strstr(err.msg, cases[c].needle) == NULL) fail_msg("%s: '%s'", cases[c].what, err.msg);
    packed[cases[c].at] = saved;
    assert_int_equal(npu_program_verify(m, m->program, &err), NPULM_OK);
  }
  npulm_model_close(m);
}

/* The tiny models: biases (qwen2: folded into the packed weights), an untied classifier, GQA. */
static void test_round_trip_quantized_tiny(void **state) {
  (void)state;
  struct tiny variants[] = {
      {.arch = "qwen2", .n_layers = 2},
      {.n_layers = 2, .untied = true, .rope_freqs = true},
  };
  for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
    char *src = tmp_path();
    write_tiny(src, &variants[i]);
    quant_round_trip(src, NPU_QUANT_SHADOW, 2.0f);
    quant_round_trip(src, NPU_QUANT_SMOOTH, 0.0f);
    unlink(src);
    free(src);
  }
}

/* The phases a compile reported, in order, each with its last count (npulm_phase_progress_fn). */
struct phases {
  char names[8][16];
  uint64_t done[8], total[8];
  int n;
};

static void record_phase(void *user, const char *phase, const char *unit, uint64_t done,
                         uint64_t total) {
  struct phases *ph = user;
  (void)unit;
  assert_true(done <= total);
  if (ph->n == 0 || strcmp(ph->names[ph->n - 1], phase) != 0) {
    assert_true(ph->n < 8);
    snprintf(ph->names[ph->n++], sizeof(ph->names[0]), "%s", phase);
  }
  ph->done[ph->n - 1] = done;
  ph->total[ph->n - 1] = total;
}

/* npulm_compile_file, which reads the model a block at a time and keeps the packed weights in a
 * scratch file, writes the very file that compiling in memory and saving writes: every mode, a
 * tied and an untied model, a model with biases, and block-quantized matrices; each phase ends
 * with done == total. */
static void test_compile_file_streams(void **state) {
  (void)state;
  struct tiny variants[] = {
      {.n_layers = 2},
      {.arch = "qwen2", .n_layers = 2},
      {.n_layers = 2, .untied = true, .rope_freqs = true, .mtype = NPU_GGML_Q8_0},
      {.n_layers = 2, .untied = true, .mtype = NPU_GGML_Q4_0},
  };
  const char *modes[] = {"w8a8-naive", "w8a8-shadow", "w8a8-smooth"};
  char *src = tmp_path(), *streamed = tmp_path(), *in_memory = tmp_path();
  for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
    write_tiny(src, &variants[v]);
    for (size_t k = 0; k < sizeof(modes) / sizeof(modes[0]); k++) {
      npulm_compile_params cp = npulm_compile_default_params();
      cp.quant = modes[k];
      cp.shadow_threshold = 2.0f; /* some outlier channels in the tiny model */
      struct phases ph = {0};
      cp.progress = record_phase;
      cp.progress_user = &ph;
      npulm_error err;
      if (npulm_compile_file(src, streamed, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
      assert_true(ph.n >= 2);
      assert_string_equal(ph.names[ph.n - 2], "quantize");
      assert_string_equal(ph.names[ph.n - 1], "write");
      for (int i = 0; i < ph.n; i++) assert_true(ph.done[i] == ph.total[i]);
      npulm_model *m = NULL;
      cp.progress = NULL;
      if (npulm_model_open(src, &m, &err) != NPULM_OK ||
          npulm_model_compile(m, &cp, &err) != NPULM_OK ||
          npulm_model_save_program(m, in_memory, NULL, NULL, &err) != NPULM_OK) {
        fail_msg("%s", err.msg);
      }
      npulm_model_close(m);
      size_t a_size, b_size;
      uint8_t *a = test_read_file(streamed, &a_size), *b = test_read_file(in_memory, &b_size);
      if (a_size != b_size || memcmp(a, b, a_size) != 0) {
        fail_msg("variant %zu, %s: the streamed compile wrote another file", v, modes[k]);
      }
      free(a);
      free(b);
    }
  }
  unlink(src);
  unlink(streamed);
  unlink(in_memory);
  free(src);
  free(streamed);
  free(in_memory);
}

/* What needs the float model refuses a lean program file in one line that names --keep-float. */
static void expect_no_float(npulm_status st, const npulm_error *err) {
  if (st != NPULM_ERR_UNSUPPORTED || strstr(err->msg, "no float copy") == NULL ||
      strstr(err->msg, "--keep-float") == NULL || strchr(err->msg, '\n') != NULL) {
    fail_msg("status %d, '%s' (wanted a refusal for want of float weights)", st, err->msg);
  }
}

/* The index of weight 'name' in npulm.weights of 'im'. */
static int32_t weight_index(const struct image *im, const char *name) {
  const struct npu_gguf_arr *a = &image_kv(im, "npulm.weights")->val.v.a;
  struct npu_gguf_value *v = malloc((size_t)a->n * sizeof(*v));
  assert_non_null(v);
  npu_gguf_arr_values(a, v);
  int32_t at = -1;
  for (uint64_t i = 0; i < a->n && at < 0; i++)
    at = npu_gguf_str_eq(v[i].v.s, name) ? (int32_t)i : -1;
  free(v);
  if (at < 0) fail_msg("no weight '%s' in npulm.weights", name);
  return at;
}

/* An integer program file holds the float weights the CPU reads (here w8a8-shadow's norms) and
 * not the matrices only the integer NPU reads; with keep_float (--keep-float) it holds them all.
 * Both run alike; what needs the float model refuses the lean one cleanly; and a lean file whose
 * list of held weights lies is refused. */
static void test_lean_program(void **state) {
  (void)state;
  char *src = tmp_path(), *lean = tmp_path(), *full = tmp_path();
  struct tiny t = {.n_layers = 2, .untied = true};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  struct npu_compile_options o;
  small_options(m, &o);
  quantize_ok(m, &o, NPU_QUANT_SHADOW, 2.0f);
  save_ok(m, lean);
  m->program->keep_float = true;
  save_ok(m, full);
  m->program->keep_float = false;
  npulm_model *a = open_ok(lean), *b = open_ok(full);
  assert_false(a->program->keep_float);
  assert_true(b->program->keep_float);
  assert_true(a->n_omitted > 0);
  assert_int_equal(b->n_omitted, 0);
  assert_programs_equal(m->program, a->program);
  assert_models_equal(m, a);
  assert_models_equal(b, a);
  /* the norms the CPU reads are held; the matrices are not, nor the untied classifier */
  assert_non_null(a->w.layers[0].attn_norm);
  assert_null(a->w.layers[0].wq);
  assert_null(a->w.output);
  assert_false(a->cfg.tied_output);
  size_t n_lean, n_full;
  uint8_t *bytes = test_read_file(lean, &n_lean);
  free(bytes);
  bytes = test_read_file(full, &n_full);
  free(bytes);
  assert_true(n_lean < n_full);
  /* the same logits */
  assert_same_logits(a, b);
  /* what needs the float weights refuses the lean one; the full one has them */
  npulm_error err = {{0}};
  npulm_session_params sp = npulm_session_default_params();
  sp.reference = true;
  sp.n_ctx = 16;
  npulm_session *s = NULL;
  expect_no_float(npulm_session_create(a, &sp, &s, &err), &err);
  assert_null(s);
  assert_int_equal(npulm_session_create(b, &sp, &s, &err), NPULM_OK);
  npulm_session_free(s);
  expect_no_float(npulm_model_compile(a, NULL, &err), &err);
  assert_non_null(a->program); /* the model keeps the program it had */
  npulm_diff_report *r = NULL;
  expect_no_float(npulm_diff(a, "Once upon", 9, &r, &err), &err);
  assert_null(r);
  const char *text = "Once upon a time there was a dog. Once upon a time there was a cat.";
  npulm_ppl_result pr;
  expect_no_float(npulm_perplexity_reference(a, text, strlen(text), 4, 1, NULL, NULL, &pr, &err),
                  &err);
  npulm_model_close(a);
  npulm_model_close(b);
  npulm_model_close(m);

  /* a lean file whose npulm.weights.float lies */
  struct image im = {.path = tmp_path()};
  im.data = test_read_file(lean, &im.size);
  assert_int_equal(npu_gguf_open_memory(im.data, im.size, &im.g, &err), NPULM_OK);
  const size_t flags = value_at(&im, "npulm.weights.float");
  const int32_t norm = weight_index(&im, "blk.1.attn_norm.weight");
  const int32_t wq = weight_index(&im, "blk.1.attn_q.weight");
  assert_int_equal(im.data[flags + (size_t)norm], 1);
  assert_int_equal(im.data[flags + (size_t)wq], 2);
  uint8_t *copy = malloc(im.size);
  assert_non_null(copy);
  const struct {
    const char *what;
    int32_t weight;
    uint8_t flag;
    bool rename; /* rename the weight's tensor away */
    npulm_status want;
    const char *needle;
  } cases[] = {
      /* a weight a CPU node reads, removed and listed as not held: no node may read it */
      {"needed weight left out", norm, 2, true, NPULM_ERR_FORMAT,
       "reads weight 'blk.1.attn_norm.weight' in float"},
      {"needed weight listed absent", norm, 0, true, NPULM_ERR_FORMAT,
       "missing tensor 'blk.1.attn_norm.weight'"},
      {"held weight listed not held", norm, 2, false, NPULM_ERR_FORMAT, "held in int8 only"},
      {"left-out weight listed held", wq, 1, false, NPULM_ERR_FORMAT, "blk.1.attn_q.weight"},
      {"unknown flag", wq, 3, false, NPULM_ERR_FORMAT, "npulm.weights.float"},
  };
  const struct npu_gguf_tensor *nt = npu_gguf_find_tensor(im.g, "blk.1.attn_norm.weight");
  assert_non_null(nt);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    memcpy(copy, im.data, im.size);
    copy[flags + (size_t)cases[i].weight] = cases[i].flag;
    if (cases[i].rename) copy[(const uint8_t *)nt->name.ptr - im.data] = 'X';
    npulm_status st = open_bytes(&im, copy, im.size, &err);
    if (st != cases[i].want || strstr(err.msg, cases[i].needle) == NULL) {
      fail_msg("%s: status %d, '%s' (wanted '%s')", cases[i].what, st, err.msg, cases[i].needle);
    }
  }
  free(copy);
  image_free(&im);
  unlink(src);
  unlink(lean);
  unlink(full);
  free(src);
  free(lean);
  free(full);
}

/* A small w8a8-shadow program of stories260K (one prefill size, one bucket) and where its parts
 * are: sites by kind, graph 0's nodes by kind. */
struct qimage {
  struct image im;
  int mm_gate;  /* a matmul site whose outliers are FFN channels (gate/up rows kept) */
  int mm_plain; /* a matmul site whose outliers are channels of its float input */
  int mm;       /* a matmul site without outliers */
  int gather, add8, add16, mul, silu;      /* sites; add8/add16: int8 / int16 output (-1: none) */
  int k_gate, k_plain;                     /* their k */
  int shadow_node, transfer_node, mm_node; /* nodes of graph 0 */
  int i8_tensor;                           /* an NPU I8 activation of graph 0 */
  int qt_i8;                               /* its quantization table entry */
};

static bool qimage_load(struct qimage *q) {
  const char *path = test_shared_path("models/stories260K.gguf");
  if (access(path, R_OK) != 0) return false;
  struct image *im = &q->im;
  npulm_model *m = open_ok(path);
  struct npu_compile_options o;
  npu_compile_default_options(&m->cfg, &o);
  memset(o.chunks, 0, sizeof(o.chunks));
  memset(o.buckets, 0, sizeof(o.buckets));
  o.n_chunks = 1;
  o.chunks[0] = 16;
  o.n_buckets = 1;
  o.buckets[0] = 64;
  quantize_ok(m, &o, NPU_QUANT_SHADOW, 3.0f);
  m->program->keep_float = true; /* every F32 weight, as the tests of damage expect */
  im->path = tmp_path();
  save_ok(m, im->path);
  const struct npu_program *p = m->program;
  q->mm_gate = q->mm_plain = q->mm = q->gather = q->add8 = q->add16 = q->mul = q->silu = -1;
  for (int i = 0; i < p->n_qsites; i++) {
    const struct npu_qsite *s = &p->qsites[i];
    const struct npu_qtensor *y = npu_program_qtensor(p, s->name);
    int *slot = NULL;
    switch ((enum npu_op)s->op) {
    case NPU_OP_MATMUL:
      slot = s->n_outliers == 0 ? &q->mm : s->outlier_gate != NULL ? &q->mm_gate : &q->mm_plain;
      break;
    case NPU_OP_GATHER: slot = &q->gather; break;
    case NPU_OP_ADD: slot = y != NULL && y->dtype == NPU_DT_I16 ? &q->add16 : &q->add8; break;
    case NPU_OP_MUL: slot = &q->mul; break;
    case NPU_OP_SILU: slot = &q->silu; break;
    default: break;
    }
    if (slot != NULL && *slot < 0) *slot = i;
  }
  assert_true(q->mm_gate >= 0 && q->mm_plain >= 0 && q->mm >= 0 && q->gather >= 0 &&
              q->add16 >= 0 && q->mul >= 0 && q->silu >= 0);
  q->k_gate = p->qsites[q->mm_gate].k;
  q->k_plain = p->qsites[q->mm_plain].k;
  const struct npu_graph *g = &p->graphs[0];
  q->shadow_node = q->transfer_node = q->mm_node = q->i8_tensor = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    int op = g->nodes[i].op;
    if (op == NPU_OP_SHADOW && q->shadow_node < 0) q->shadow_node = i;
    if (op == NPU_OP_TRANSFER && q->transfer_node < 0) q->transfer_node = i;
    if (op == NPU_OP_MATMUL && q->mm_node < 0) q->mm_node = i;
  }
  for (int i = 0; i < g->n_tensors && q->i8_tensor < 0; i++) {
    if (g->tensors[i].kind == NPU_TK_ACT && g->tensors[i].dtype == NPU_DT_I8) q->i8_tensor = i;
  }
  q->qt_i8 = (int)(npu_program_qtensor(p, g->tensors[q->i8_tensor].name) - p->qtensors);
  assert_true(q->shadow_node >= 0 && q->transfer_node >= 0 && q->mm_node >= 0);
  npulm_model_close(m);
  im->data = test_read_file(im->path, &im->size);
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(im->data, im->size, &im->g, &err), NPULM_OK);
  return true;
}

/* ---- Checksums ------------------------------------------------------------------------------ */

/* Collects the parts npu_program_file_damage reports (npu_damage_fn). */
struct damage_list {
  int n;
  char what[4][128];
};

static void collect_damage(void *user, const char *what, uint64_t begin, uint64_t end) {
  struct damage_list *d = user;
  assert_true(begin < end);
  if (d->n < 4) snprintf(d->what[d->n], sizeof(d->what[0]), "%s", what);
  d->n++;
}

/* The index in the image of the first tensor whose name ends with 'suffix'. */
static uint64_t tensor_ending(const struct image *im, const char *suffix) {
  for (uint64_t i = 0; i < im->g->n_tensors; i++) {
    const struct npu_gguf_str *s = &im->g->tensors[i].name;
    size_t n = strlen(suffix);
    if (s->len >= n && memcmp(s->ptr + s->len - n, suffix, n) == 0) return i;
  }
  fail_msg("no tensor ending in '%s'", suffix);
  return 0;
}

/* One flipped bit that would change results — in an F32 weight, in the low bits of a
 * requantization multiplier, in the last byte of the file, in a graph record — is refused before
 * the file is used, naming the damaged part; npu_program_file_damage lists every damaged part. */
static void test_checksum_damage(void **state) {
  (void)state;
  struct qimage q;
  if (!qimage_load(&q)) skip();
  struct image im = q.im;
  const struct npu_gguf *g = im.g;
  const uint64_t weight = tensor_ending(&im, "blk.1.attn_q.weight");
  const uint64_t mult = tensor_ending(&im, ".mult");
  const uint64_t last = g->n_tensors - 1;
  char last_name[128];
  snprintf(last_name, sizeof(last_name), "tensor '%.*s'", (int)g->tensors[last].name.len,
           g->tensors[last].name.ptr);
  const size_t data_at = (size_t)g->data_offset;
  const struct {
    const char *what;
    size_t at;
    const char *needle;
  } cases[] = {
      {"an F32 weight", data_at + (size_t)g->tensors[weight].offset + 2,
       "tensor 'blk.1.attn_q.weight'"},
      {"a multiplier's low bits", data_at + (size_t)g->tensors[mult].offset, "qsite"},
      {"the last byte", im.size - 1, last_name},
      {"a node record", value_at(&im, "npulm.graph.0.nodes") + 4 * 9, "the header"},
  };
  uint8_t *copy = malloc(im.size);
  assert_non_null(copy);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    memcpy(copy, im.data, im.size);
    copy[cases[i].at] ^= 0x01;
    npulm_error err = {{0}};
    npulm_status st = open_raw(&im, copy, im.size, &err);
    if (st != NPULM_ERR_FORMAT || strstr(err.msg, "damaged") == NULL ||
        strstr(err.msg, cases[i].needle) == NULL) {
      fail_msg("%s flipped: status %d, '%s' (wanted '%s')", cases[i].what, st, err.msg,
               cases[i].needle);
    }
  }
  /* two parts at once: both listed, and the load names the first */
  memcpy(copy, im.data, im.size);
  copy[cases[0].at] ^= 0x80;
  copy[cases[2].at] ^= 0x80;
  struct npu_gguf *cg = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(copy, im.size, &cg, &err), NPULM_OK);
  struct damage_list d = {0};
  int64_t n = -1;
  assert_int_equal(npu_program_file_damage(cg, collect_damage, &d, &n, &err), NPULM_OK);
  assert_int_equal(n, 2);
  assert_int_equal(d.n, 2);
  assert_non_null(strstr(d.what[0], "blk.1.attn_q.weight"));
  assert_string_equal(d.what[1], last_name);
  bool is_program;
  assert_int_equal(npu_program_file_check(cg, &is_program, &err), NPULM_ERR_FORMAT);
  assert_non_null(strstr(err.msg, "nor do others"));
  npu_gguf_close(cg);
  /* the untouched image has none */
  assert_int_equal(npu_program_file_damage(g, collect_damage, &d, &n, &err), NPULM_OK);
  assert_int_equal(n, 0);
  free(copy);
  image_free(&im);
}

/* The public check, for people: a sound file says so; a damaged one lists its damage. */
static void test_verify_file(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  char *out_path = tmp_path();
  FILE *out = fopen(out_path, "w+");
  assert_non_null(out);
  npulm_error err = {{0}};
  assert_int_equal(npulm_program_verify_file(im.path, out, &err), NPULM_OK);
  uint8_t *copy = malloc(im.size);
  assert_non_null(copy);
  memcpy(copy, im.data, im.size);
  copy[im.size - 1] ^= 0x10;
  write_all(im.path, copy, im.size);
  assert_int_equal(npulm_program_verify_file(im.path, out, &err), NPULM_ERR_FORMAT);
  assert_non_null(strstr(err.msg, "1 of its"));
  write_all(im.path, im.data, im.size);
  rewind(out);
  char text[4096] = {0};
  size_t got = fread(text, 1, sizeof(text) - 1, out);
  assert_true(got > 0);
  assert_non_null(strstr(text, "sound: "));
  assert_non_null(strstr(text, "damaged: tensor '"));
  assert_non_null(strstr(text, "1 of "));
  fclose(out);
  unlink(out_path);
  free(out_path);
  free(copy);
  image_free(&im);
}

/* File offset of element 'i' (of 'size' bytes) of tensor 'name''s data; of its ne0 field. */
static size_t tensor_at(const struct image *im, const char *name, size_t i, size_t size) {
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(im->g, name);
  if (t == NULL) fail_msg("the test program has no tensor '%s'", name);
  return (size_t)((const uint8_t *)t->data - im->data) + i * size;
}

static size_t tensor_ne0_at(const struct image *im, const char *name) {
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(im->g, name);
  if (t == NULL) fail_msg("the test program has no tensor '%s'", name);
  return (size_t)((const uint8_t *)t->name.ptr + t->name.len + 4 - im->data);
}

static const char *site_tensor_name(int site, const char *field) {
  static char buf[8][64];
  static int next;
  char *b = buf[next++ % 8];
  snprintf(b, 64, "npulm.qsite.%d.%s", site, field);
  return b;
}

static void test_hostile_quant(void **state) {
  (void)state;
  struct qimage q;
  if (!qimage_load(&q)) {
    print_message("missing stories260K: skipped\n");
    skip();
  }
  const struct image *im = &q.im;
  npulm_error err = {{0}};
  assert_int_equal(open_bytes(im, im->data, im->size, &err), NPULM_OK);
  const char *S = "npulm.qsites", *QT = "npulm.qtensors", *T = "npulm.graph.0.tensors",
             *N = "npulm.graph.0.nodes";
  size_t packed = tensor_at(im, site_tensor_name(q.mm, "packed"), 0, 1);
  struct {
    const char *what;
    size_t at;
    int32_t v;
    const char *needle;
  } cases[] = {
      /* sizes */
      {"packed size", tensor_ne0_at(im, site_tensor_name(q.mm, "packed")), 4096,
       "npulm.qsite.%d.packed"},
      {"site k", field_at(im, S, SITE_FIELDS, q.mm, 2), 63, "packed"},
      {"site n", field_at(im, S, SITE_FIELDS, q.mm, 1), 65, "packed"},
      {"site k above the GEMM's limit", field_at(im, S, SITE_FIELDS, q.mm, 2), 40000,
       "invalid shape"},
      {"gather rows", field_at(im, S, SITE_FIELDS, q.gather, 1), 511, "packed"},
      {"mult count", tensor_ne0_at(im, site_tensor_name(q.mm, "mult")), 63, "mult"},
      {"outlier_w shape", tensor_ne0_at(im, site_tensor_name(q.mm_plain, "outlier_w")), 1,
       "outlier_w"},
      {"more outliers than stored", field_at(im, S, SITE_FIELDS, q.mm_plain, 3), 4, "outliers"},
      {"outliers beyond k", field_at(im, S, SITE_FIELDS, q.mm_plain, 3), 1000, "outlier channels"},
      {"gate rows dropped", field_at(im, S, SITE_FIELDS, q.mm_gate, 4), 0, "maps"},
      /* outliers */
      {"outlier index = k", tensor_at(im, site_tensor_name(q.mm_plain, "outliers"), 0, 4),
       q.k_plain, "outlier 0 is channel"},
      {"outlier index negative", tensor_at(im, site_tensor_name(q.mm_gate, "outliers"), 0, 4), -1,
       "outlier 0 is channel -1"},
      {"outliers not ascending", tensor_at(im, site_tensor_name(q.mm_plain, "outliers"), 1, 4), 0,
       "outlier 1"},
      {"outlier weight NaN", tensor_at(im, site_tensor_name(q.mm_plain, "outlier_w"), 0, 4),
       0x7fc00000, "not finite"},
      /* multipliers, shifts, zero points */
      {"shift 31", tensor_at(im, site_tensor_name(q.mm, "shift"), 3, 1),
       with_i8(im, tensor_at(im, site_tensor_name(q.mm, "shift"), 3, 1), 31), "shift 31"},
      {"shift -32", tensor_at(im, site_tensor_name(q.gather, "shift"), 0, 1),
       with_i8(im, tensor_at(im, site_tensor_name(q.gather, "shift"), 0, 1), -32), "shift -32"},
      {"shift -128", tensor_at(im, site_tensor_name(q.mm, "shift"), 5, 1),
       with_i8(im, tensor_at(im, site_tensor_name(q.mm, "shift"), 5, 1), INT8_MIN), "shift -128"},
      {"shift 127", tensor_at(im, site_tensor_name(q.gather, "shift"), 2, 1),
       with_i8(im, tensor_at(im, site_tensor_name(q.gather, "shift"), 2, 1), INT8_MAX),
       "shift 127"},
      {"mult -1", tensor_at(im, site_tensor_name(q.mm, "mult"), 0, 4), -1, "multiplier -1"},
      {"add left shift 23", field_at(im, S, SITE_FIELDS, q.add16, 10), 23, "add parameters"},
      {"add left shift -1", field_at(im, S, SITE_FIELDS, q.add16, 10), -1, "add parameters"},
      {"int16 add left shift 15", field_at(im, S, SITE_FIELDS, q.add16, 10), 15, "above 14"},
      {"add input multiplier above 0.5", field_at(im, S, SITE_FIELDS, q.add16, 12), 3,
       "add parameters"},
      {"add output shift", field_at(im, S, SITE_FIELDS, q.add16, 16), 40, "add parameters"},
      {"add zero point", field_at(im, S, SITE_FIELDS, q.add16, 17), 70000, "zero points"},
      {"add zero point not the tensor's", field_at(im, S, SITE_FIELDS, q.add16, 8), 5,
       "not its tensors'"},
      {"gemm x zero point", field_at(im, S, SITE_FIELDS, q.mm, 5), 200, "zero points 200"},
      {"gemm y zero point not the tensor's", field_at(im, S, SITE_FIELDS, q.mm, 6), 7,
       "not its tensors'"},
      {"gather zero point", field_at(im, S, SITE_FIELDS, q.gather, 7), -40000, "zero point"},
      {"mul zero point", field_at(im, S, SITE_FIELDS, q.mul, 18), 300, "multiply parameters"},
      {"mul shift", field_at(im, S, SITE_FIELDS, q.mul, 21), -32, "multiply parameters"},
      /* packed weights */
      {"packed bias", packed, (1 << 30) + 1, "invalid bias"},
      {"packed -128", packed + 128, (int32_t)0x80808080u, "-128"},
      {"packed weight sum", packed + 64, 123456, "weight sum"},
      /* types: the table, the graphs, the sites agree */
      {"table dtype", field_at(im, QT, 3, q.qt_i8, 0), NPU_DT_I16, "does not match"},
      {"table dtype f32", field_at(im, QT, 3, q.qt_i8, 0), NPU_DT_F32, "dtype 0"},
      {"table scale", field_at(im, QT, 3, q.qt_i8, 1), 0, "scale"},
      {"table zero point", field_at(im, QT, 3, q.qt_i8, 2), 200, "zero point"},
      {"graph dtype", field_at(im, T, TENSOR_FIELDS, q.i8_tensor, 1), NPU_DT_I16, "does not match"},
      {"graph dtype f32", field_at(im, T, TENSOR_FIELDS, q.i8_tensor, 1), NPU_DT_F32,
       "is not I8 or I16"},
      {"graph zero point", field_at(im, T, TENSOR_FIELDS, q.i8_tensor, 11), 3, "does not match"},
      /* ops and placement */
      {"site op", field_at(im, S, SITE_FIELDS, q.mm, 0), NPU_OP_ADD, "must be 0"},
      {"site op without a kernel", field_at(im, S, SITE_FIELDS, q.add16, 0), NPU_OP_ROPE,
       "no integer kernel"},
      {"silu site as mul", field_at(im, S, SITE_FIELDS, q.silu, 0), NPU_OP_MUL, "luts"},
      {"shadow on the NPU", field_at(im, N, 9, q.shadow_node, 1), NPU_BE_NPU, "does not support"},
      {"transfer on the NPU", field_at(im, N, 9, q.transfer_node, 1), NPU_BE_NPU,
       "no integer data"},
      {"matmul on the CPU", field_at(im, N, 9, q.mm_node, 1), NPU_BE_CPU, "arena"},
      {"quant mode 16", value_at(im, "npulm.quant.mode"), 16, "mode 16"},
      /* weight formats and the narrowing of wide sums */
      {"weight bits 5", field_at(im, S, SITE_FIELDS, q.mm, SITE_W_BITS), 5, "5 bits"},
      {"int4 weights as int8's", field_at(im, S, SITE_FIELDS, q.mm, SITE_W_BITS), 4, "packed"},
      {"int8 weights in blocks", field_at(im, S, SITE_FIELDS, q.mm, SITE_W_BLOCK), 32,
       "8 bits in blocks of 32"},
      {"narrowing shift 33", field_at(im, S, SITE_FIELDS, q.mm, SITE_ACC_SHIFT), 33, "shift 33"},
      {"narrowing an int8 input", field_at(im, S, SITE_FIELDS, q.mm, SITE_ACC_SHIFT), 1, "narrows"},
      {"int16 table for int8", field_at(im, S, SITE_FIELDS, q.silu, SITE_LUT_WIDE), 1, "luts16"},
      {"wide GEMM field on a gather", field_at(im, S, SITE_FIELDS, q.gather, SITE_ACC_SHIFT), 1,
       "must be 0"},
      {"quant mode f32", value_at(im, "npulm.quant.mode"), 0, "is not F32"},
      {"quant mode naive", value_at(im, "npulm.quant.mode"), 1, NULL}, /* a label only */
  };
  int accepted = 0;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char needle[96];
    snprintf(needle, sizeof(needle), cases[i].needle != NULL ? cases[i].needle : "", q.mm);
    if (cases[i].needle == NULL) {
      npulm_error e = {{0}};
      accepted += open_patched(im, cases[i].at, cases[i].v, &e) == NPULM_OK;
      continue;
    }
    expect_patch(im, cases[i].what, cases[i].at, cases[i].v, NPULM_ERR_FORMAT, needle);
  }
  assert_int_equal(accepted, 1);

  /* keys and tensors renamed away (their last byte changed); a site renamed (no site for a node) */
  const char *keys[] = {
      "npulm.quant.mode", "npulm.quant.smooth_alpha", "npulm.qtensors",   "npulm.qtensor_names",
      "npulm.qsites",     "npulm.qsite_names",        "npulm.qsites.luts"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    const struct npu_gguf_kv *kv = image_kv(im, keys[i]);
    uint8_t *copy = malloc(im->size);
    assert_non_null(copy);
    memcpy(copy, im->data, im->size);
    copy[(const uint8_t *)kv->key.ptr + kv->key.len - 1 - im->data] ^= 0x20;
    npulm_status st = open_bytes(im, copy, im->size, &err);
    free(copy);
    if (st != NPULM_ERR_FORMAT || strstr(err.msg, keys[i]) == NULL) {
      fail_msg("renamed '%s': status %d, '%s'", keys[i], st, err.msg);
    }
  }
  const char *fields[] = {"packed",    "mult",         "shift",     "outliers",
                          "outlier_w", "outlier_gate", "outlier_up"};
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    const char *name = site_tensor_name(q.mm_gate, fields[i]);
    const struct npu_gguf_tensor *t = npu_gguf_find_tensor(im->g, name);
    assert_non_null(t);
    uint8_t *copy = malloc(im->size);
    assert_non_null(copy);
    memcpy(copy, im->data, im->size);
    copy[(const uint8_t *)t->name.ptr - im->data] = 'X';
    npulm_status st = open_bytes(im, copy, im->size, &err);
    free(copy);
    if (st != NPULM_ERR_FORMAT || strstr(err.msg, "is missing") == NULL ||
        strstr(err.msg, fields[i]) == NULL) {
      fail_msg("renamed '%s': status %d, '%s'", name, st, err.msg);
    }
  }
  /* a site renamed: the node whose data it was has none */
  const struct npu_gguf_kv *names = image_kv(im, "npulm.qsite_names");
  uint8_t *copy = malloc(im->size);
  assert_non_null(copy);
  memcpy(copy, im->data, im->size);
  copy[names->val.v.a.data - im->data + 8] ^= 0x20; /* first name's first byte */
  assert_int_equal(open_bytes(im, copy, im->size, &err), NPULM_ERR_FORMAT);
  if (strstr(err.msg, "has no integer data") == NULL) fail_msg("renamed site: '%s'", err.msg);
  free(copy);
  image_free(&q.im);
}

/* Every i32 of some sites' records, of the quantization table's first entries and of a shadowed
 * matmul's small arrays, set to edge values: each file opens or fails with one line; none crashes
 * or reads out of bounds (SAN=1); an accepted one runs (open_patched evaluates it). */
static void test_hostile_quant_sweep(void **state) {
  (void)state;
  struct qimage q;
  if (!qimage_load(&q)) {
    print_message("missing stories260K: skipped\n");
    skip();
  }
  const struct image *im = &q.im;
  struct {
    size_t base, n_words;
    bool i8; /* I8 values (the shifts): each byte set, not each i32 */
  } ranges[16] = {{0}};
  int n = 0;
  int sites[] = {q.mm_gate, q.mm_plain, q.gather, q.add16, q.mul, q.silu};
  for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
    ranges[n].base = field_at(im, "npulm.qsites", SITE_FIELDS, sites[i], 0);
    ranges[n++].n_words = SITE_FIELDS;
  }
  ranges[n].base = value_at(im, "npulm.qtensors");
  ranges[n++].n_words = 3 * 8;
  const char *fields[] = {"outliers", "mult", "shift"};
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
    ranges[n].base = tensor_at(im, site_tensor_name(q.mm_plain, fields[i]), 0, 4);
    ranges[n].i8 = i == 2;
    ranges[n++].n_words = i == 0 ? 3 : 8;
  }
  ranges[n].base = tensor_ne0_at(im, site_tensor_name(q.mm_gate, "outlier_gate"));
  ranges[n++].n_words = 4; /* ne0 and ne1 of the gate rows */
  int accepted = 0, rejected = 0;
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < ranges[r].n_words; i++) {
      const bool i8 = ranges[r].i8;
      size_t at = ranges[r].base + (i8 ? 1 : 4) * i;
      int32_t old = i8 ? (int8_t)im->data[at] : read_i32(im, at);
      int32_t values[] = {
          -1, old + 1, old - 1, i8 ? INT8_MAX : INT32_MAX, i8 ? INT8_MIN : INT32_MIN, 64};
      for (size_t j = 0; j < sizeof(values) / sizeof(values[0]); j++) {
        if (values[j] == old) continue;
        if (i8) values[j] = with_i8(im, at, (int8_t)values[j]);
        npulm_error err = {{0}};
        if (open_patched(im, at, values[j], &err) == NPULM_OK) accepted++;
        else rejected++;
      }
    }
  }
  print_message("integer data sweep: %d tampered files rejected, %d accepted (and run)\n", rejected,
                accepted);
  assert_true(rejected > 4 * accepted);
  image_free(&q.im);
}

/* Attention on the integer NPU (w8a8-smooth, float_ops "none"): QK, SOFTMAX and PV with their
 * parameters and the int8 copies of the caches survive the program file (the same program, the
 * same logits bit for bit); tampered attention records, and those of the integer RMSNorm and
 * row copy that w8a8-smooth puts on the NPU, are one-line errors, and what the verifier lets
 * through of a sweep of them runs in bounds (SAN=1). */
static void test_attention_on_npu(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  npulm_compile_params cp = npulm_compile_default_params();
  cp.n_chunks = 1;
  cp.chunks[0] = 16;
  cp.n_buckets = 1;
  cp.buckets[0] = 64;
  cp.quant = "w8a8-smooth";
  cp.float_ops = "none";
  compile_ok(m, &cp);
  const struct npu_program *p = m->program;
  int site[5] = {-1, -1, -1, -1, -1}; /* QK, SOFTMAX, PV; and RMSNORM, LAST_ROW */
  for (int i = 0; i < p->n_qsites; i++) {
    static const int ops[5] = {NPU_OP_QK, NPU_OP_SOFTMAX, NPU_OP_PV, NPU_OP_RMSNORM,
                               NPU_OP_LAST_ROW};
    for (int k = 0; k < 5; k++) {
      if (p->qsites[i].op == ops[k] && site[k] < 0) site[k] = i;
    }
  }
  for (int k = 0; k < 5; k++) assert_true(site[k] >= 0);
  /* graph 0 (decode, ctx 64): layer 1's QK on the NPU and the TRANSFER that fills its K copy;
   * layer 0's K copy; layer 1's F32 K and V caches */
  const struct npu_graph *g = &p->graphs[0];
  int qk1 = -1, copy_k1 = -1, k_copy0 = -1, k_cache1 = -1, v_cache1 = -1;
  for (int i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    if (n->op == NPU_OP_QK && n->backend == NPU_BE_NPU && n->layer == 1 && qk1 < 0) qk1 = i;
  }
  assert_true(qk1 >= 0);
  for (int i = 0; i < qk1; i++) {
    if (g->nodes[i].out == g->nodes[qk1].in[1]) copy_k1 = i;
  }
  assert_true(copy_k1 >= 0 && g->nodes[copy_k1].op == NPU_OP_TRANSFER);
  for (int t = 0; t < g->n_tensors; t++) {
    const struct npu_ir_tensor *x = &g->tensors[t];
    if (strcmp(x->name, "blk.0.k_cache") == 0 && x->kind == NPU_TK_ACT) k_copy0 = t;
    if (x->kind == NPU_TK_KV && x->ref == 1) *(x->kv_is_value ? &v_cache1 : &k_cache1) = t;
  }
  assert_true(k_copy0 >= 0 && k_cache1 >= 0 && v_cache1 >= 0);
  assert_int_equal(g->tensors[k_copy0].dtype, NPU_DT_I8);

  /* the round trip */
  char *npu = tmp_path();
  save_ok(m, npu);
  npulm_model *l = open_ok(npu);
  assert_programs_equal(m->program, l->program);
  assert_quant_equal(m->program, l->program);
  assert_same_logits(m, l);
  npulm_model_close(l);
  const struct npu_qsite qk = p->qsites[site[0]], pv = p->qsites[site[2]];
  const struct npu_qsite norm = p->qsites[site[3]];
  npulm_model_close(m);

  /* tampering */
  struct image im = {.path = npu};
  im.data = test_read_file(npu, &im.size);
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(im.data, im.size, &im.g, &err), NPULM_OK);
  const char *S = "npulm.qsites", *N = "npulm.graph.0.nodes";
  struct {
    const char *what;
    size_t at;
    int32_t v;
    const char *needle;
  } cases[] = {
      {"qk multiplier -1", field_at(&im, S, SITE_FIELDS, site[0], SITE_QK + 2), -1,
       "score parameters out of range"},
      {"softmax shift 31", field_at(&im, S, SITE_FIELDS, site[1], SITE_SOFTMAX + 1), 31,
       "softmax parameters out of range"},
      {"pv shift -32", field_at(&im, S, SITE_FIELDS, site[2], SITE_PV + 2), -32,
       "weighted-value parameters out of range"},
      {"qk k zero point not the tensor's", field_at(&im, S, SITE_FIELDS, site[0], SITE_QK + 1),
       qk.qk.k_zero_point > 0 ? qk.qk.k_zero_point - 1 : qk.qk.k_zero_point + 1,
       "score zero points that are not its tensors'"},
      {"pv y zero point not the tensor's", field_at(&im, S, SITE_FIELDS, site[2], SITE_PV + 3),
       pv.pv.y_zero_point > 0 ? pv.pv.y_zero_point - 1 : pv.pv.y_zero_point + 1,
       "weighted-value zero points that are not its tensors'"},
      {"qk with a pv field", field_at(&im, S, SITE_FIELDS, site[0], SITE_PV), 1, "must be 0"},
      /* the norm and the row copy */
      {"norm shift 47", field_at(&im, S, SITE_FIELDS, site[3], SITE_RMSNORM + 2), 47,
       "norm parameters out of range"},
      {"norm shift -17", field_at(&im, S, SITE_FIELDS, site[3], SITE_RMSNORM + 2), -17,
       "norm parameters out of range"},
      {"norm eps negative", field_at(&im, S, SITE_FIELDS, site[3], SITE_RMSNORM + 1), INT32_MIN,
       "norm parameters out of range"},
      {"norm eps above 2^62", field_at(&im, S, SITE_FIELDS, site[3], SITE_RMSNORM + 1),
       (1 << 30) + 1, "norm parameters out of range"},
      {"norm zero point 128", field_at(&im, S, SITE_FIELDS, site[3], SITE_RMSNORM + 3), 128,
       "norm parameters out of range"},
      {"norm zero point not the tensor's", field_at(&im, S, SITE_FIELDS, site[3], SITE_RMSNORM + 3),
       norm.rmsnorm.y_zero_point > 0 ? norm.rmsnorm.y_zero_point - 1
                                     : norm.rmsnorm.y_zero_point + 1,
       "output zero point not its tensor's"},
      {"norm width", field_at(&im, S, SITE_FIELDS, site[3], 1), norm.n + 1, "mult"},
      {"norm with a k", field_at(&im, S, SITE_FIELDS, site[3], 2), 1, "must be 0"},
      {"row copy with a width", field_at(&im, S, SITE_FIELDS, site[4], 1), 64, "must be 0"},
      {"qk reads another layer's K copy", field_at(&im, N, 9, qk1, 4), k_copy0,
       "not a transfer of its layer's cache"},
      {"qk reads the F32 cache", field_at(&im, N, 9, qk1, 4), k_cache1,
       "does not read an NPU I8 [ctx, kv_dim] copy"},
      {"K copy made from the V cache", field_at(&im, N, 9, copy_k1, 3), v_cache1,
       "copies a cache into anything but an NPU I8 copy of it"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    expect_patch(&im, cases[i].what, cases[i].at, cases[i].v, NPULM_ERR_FORMAT, cases[i].needle);
  }
  /* every field of the five sites' records set to edge values */
  int accepted = 0, rejected = 0;
  for (int k = 0; k < 5; k++) {
    for (int f = 0; f < SITE_FIELDS; f++) {
      size_t at = field_at(&im, S, SITE_FIELDS, site[k], f);
      int32_t old = read_i32(&im, at);
      int32_t values[] = {-1, old + 1, old - 1, INT32_MAX, INT32_MIN, 64};
      for (size_t j = 0; j < sizeof(values) / sizeof(values[0]); j++) {
        if (values[j] == old) continue;
        if (open_patched(&im, at, values[j], &err) == NPULM_OK) accepted++;
        else rejected++;
      }
    }
  }
  print_message("attention sweep: %d tampered files rejected, %d accepted (and run)\n", rejected,
                accepted);
  assert_true(rejected > 4 * accepted);
  image_free(&im);
}

/* The node after 'from' of graph 0 running 'op'. */
static int find_node_after(const struct image *im, int op, int from) {
  const struct npu_gguf_kv *kv = image_kv(im, "npulm.graph.0.nodes");
  for (int i = from + 1; (uint64_t)(i + 1) * 9 <= kv->val.v.a.n; i++) {
    if (read_i32(im, field_at(im, "npulm.graph.0.nodes", 9, i, 0)) == op) return i;
  }
  fail_msg("no node running op %d after node %d", op, from);
  return -1;
}

/* Attention all in float (the default policy) is one fused ATTN node per layer on the CPU, with no
 * [heads, rows, ctx] tensors; tampered ATTN records are one-line errors. */
static void test_fused_attention_records(void **state) {
  (void)state;
  struct image im;
  image_load(&im);
  const char *N = "npulm.graph.0.nodes";
  const struct npu_gguf_kv *nodes = image_kv(&im, N);
  for (int i = 0; (uint64_t)(i + 1) * 9 <= nodes->val.v.a.n; i++) {
    int op = read_i32(&im, field_at(&im, N, 9, i, 0));
    assert_true(op != NPU_OP_QK && op != NPU_OP_SOFTMAX && op != NPU_OP_PV);
  }
  int attn0 = find_node(&im, NPU_OP_ATTN), attn1 = find_node_after(&im, NPU_OP_ATTN, attn0);
  assert_int_equal(read_i32(&im, field_at(&im, N, 9, attn0, 1)), NPU_BE_CPU);
  assert_int_equal(read_i32(&im, field_at(&im, N, 9, attn0, 7)), 0);
  assert_int_equal(read_i32(&im, field_at(&im, N, 9, attn1, 7)), 1);
  int32_t k0 = read_i32(&im, field_at(&im, N, 9, attn0, 4));
  int32_t v0 = read_i32(&im, field_at(&im, N, 9, attn0, 5));
  int32_t k1 = read_i32(&im, field_at(&im, N, 9, attn1, 4));
  /* k after RoPE: what layer 0 writes to its K cache, [rows, kv_dim] where q is [rows, q_dim] */
  int32_t k_rope = read_i32(&im, field_at(&im, N, 9, find_node(&im, NPU_OP_KV_WRITE), 3));
  struct {
    const char *what;
    size_t at;
    int32_t v;
    const char *needle;
  } cases[] = {
      {"attn on the NPU", field_at(&im, N, 9, attn0, 1), NPU_BE_NPU, "does not support"},
      {"attn reads V as K", field_at(&im, N, 9, attn0, 4), v0, "operands"},
      {"attn reads K as V", field_at(&im, N, 9, attn0, 5), k0, "operands"},
      {"attn without V", field_at(&im, N, 9, attn0, 5), -1, "operands"},
      {"attn with K of another layer", field_at(&im, N, 9, attn0, 4), k1, "operands"},
      {"attn of another layer's caches", field_at(&im, N, 9, attn0, 7), 1, "own layer"},
      {"attn of k as q", field_at(&im, N, 9, attn0, 3), k_rope, "shape"},
      {"attn scale NaN", field_at(&im, N, 9, attn0, 8), 0x7fc00000, "not finite"},
      {"attn op as pv", field_at(&im, N, 9, attn0, 0), NPU_OP_PV, "graph 0"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    expect_patch(&im, cases[i].what, cases[i].at, cases[i].v, NPULM_ERR_FORMAT, cases[i].needle);
  }
  image_free(&im);
}

/* A program whose float attention is QK, SOFTMAX and PV on the CPU (as programs were compiled
 * before the fused op) is still a valid program: it saves, loads and runs, and its logits agree
 * with the fused program's to rounding. */
static void test_three_op_attention_program(void **state) {
  (void)state;
  char *src = tmp_path(), *npu = tmp_path();
  struct tiny t = {.n_layers = 2};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  compile_ok(m, NULL);
  size_t n_fused;
  float *fused = eval_logits(m, &n_fused);
  /* rebuild every graph in the three-op form (a policy that lets none of them off the CPU would
   * be needed to make it; build it directly) and place it under the program's own policy */
  struct npu_program *p = m->program;
  npulm_error err = {{0}};
  for (int32_t i = 0; i < p->n_graphs; i++) {
    struct npu_graph g;
    const struct npu_graph *old = &p->graphs[i];
    bool for_generation = npu_graph_logit_rows(old) != old->rows;
    assert_int_equal(npu_build_graph(m, p->weights, p->n_weights, old->rows, old->ctx, 0,
                                     for_generation, &g, &err),
                     NPULM_OK);
    assert_int_equal(npu_partition(&g, p->opts.float_ops, &err), NPULM_OK);
    assert_int_equal(npu_plan(&g, &err), NPULM_OK);
    npu_graph_free(&p->graphs[i]);
    p->graphs[i] = g;
  }
  assert_int_equal(npu_program_verify(m, p, &err), NPULM_OK);
  save_ok(m, npu);
  npulm_model *l = open_ok(npu);
  const struct npu_graph *g = &l->program->graphs[0];
  int32_t ops[NPU_OP_COUNT] = {0};
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    ops[n->op]++;
    if (n->op == NPU_OP_QK || n->op == NPU_OP_SOFTMAX || n->op == NPU_OP_PV) {
      assert_int_equal(n->backend, NPU_BE_CPU);
    }
  }
  assert_int_equal(ops[NPU_OP_ATTN], 0);
  assert_int_equal(ops[NPU_OP_QK], 2);
  assert_int_equal(ops[NPU_OP_SOFTMAX], 2);
  assert_int_equal(ops[NPU_OP_PV], 2);
  size_t n_split;
  float *split = eval_logits(l, &n_split);
  assert_int_equal(n_split, n_fused);
  double diff = 0.0, mag = 1e-30;
  for (size_t i = 0; i < n_fused; i++) {
    diff = fmax(diff, fabs((double)split[i] - fused[i]));
    mag = fmax(mag, fabs((double)fused[i]));
  }
  assert_true(diff <= 1e-5 * mag);
  free(fused);
  free(split);
  npulm_model_close(l);
  npulm_model_close(m);
  unlink(src);
  unlink(npu);
  free(src);
  free(npu);
}

/* A tied embedding is stored once: the gather reads its rows out of the classifier's packed
 * weights, the file holds no table for it, and a file that points a gather elsewhere is refused.
 * An untied classifier keeps its own table. */
static void test_tied_table(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  struct npu_compile_options o;
  small_options(m, &o);
  quantize_ok(m, &o, NPU_QUANT_NAIVE, 0.0f);
  const struct npu_program *p = m->program;
  int gather = -1, mm = -1, add = -1;
  for (int i = 0; i < p->n_qsites; i++) {
    if (p->qsites[i].op == NPU_OP_GATHER) gather = i;
    if (p->qsites[i].op == NPU_OP_ADD && add < 0) add = i;
  }
  assert_true(gather >= 0 && add >= 0);
  mm = p->qsites[gather].table_site;
  assert_true(mm >= 0);
  assert_int_equal(p->qsites[mm].op, NPU_OP_MATMUL);
  assert_ptr_equal(p->qsites[gather].packed, p->qsites[mm].packed);
  struct image im = {.path = tmp_path()};
  save_ok(m, im.path);
  im.data = test_read_file(im.path, &im.size);
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(im.data, im.size, &im.g, &err), NPULM_OK);
  assert_null(npu_gguf_find_tensor(im.g, site_tensor_name(gather, "packed")));
  assert_non_null(npu_gguf_find_tensor(im.g, site_tensor_name(mm, "packed")));
  const char *T = "npulm.qsites.tables";
  expect_patch(&im, "table from an add", field_at(&im, T, 1, gather, 0), add, NPULM_ERR_FORMAT,
               "not a [n");
  expect_patch(&im, "table from itself", field_at(&im, T, 1, gather, 0), gather, NPULM_ERR_FORMAT,
               "reads its table from site");
  expect_patch(&im, "table beyond the sites", field_at(&im, T, 1, gather, 0), 100000,
               NPULM_ERR_FORMAT, "reads its table from site");
  expect_patch(&im, "own table missing", field_at(&im, T, 1, gather, 0), -1, NPULM_ERR_FORMAT,
               "packed");
  expect_patch(&im, "an add with a table", field_at(&im, T, 1, add, 0), mm, NPULM_ERR_FORMAT,
               "reads a table from site");
  image_free(&im);
  npulm_model_close(m);
  /* an untied classifier: its own weights, the gather its own table */
  char *src = tmp_path();
  struct tiny t = {.untied = true};
  write_tiny(src, &t);
  npulm_model *u = open_ok(src);
  small_options(u, &o);
  quantize_ok(u, &o, NPU_QUANT_NAIVE, 0.0f);
  for (int i = 0; i < u->program->n_qsites; i++)
    assert_int_equal(u->program->qsites[i].table_site, -1);
  npulm_model_close(u);
  unlink(src);
  free(src);
}

/* Program files store their small tensors (the norms the CPU reads at run time) ahead of every
 * large one, so that touching them maps no page-cache folio of a big F32 matrix. */
static void test_small_tensors_first(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  struct npu_compile_options o;
  small_options(m, &o);
  quantize_ok(m, &o, NPU_QUANT_NAIVE, 0.0f);
  m->program->keep_float = true; /* so that the file holds large F32 matrices */
  char *path = tmp_path();
  save_ok(m, path);
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  enum { SMALL = 64 << 10 }; /* program_save.c's SMALL_TENSOR_BYTES */
  uint64_t last_small = 0, first_large = UINT64_MAX;
  int n_small = 0, n_large = 0;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const struct npu_gguf_tensor *t = &g->tensors[i];
    if (t->nbytes < SMALL) {
      n_small++;
      if (t->offset > last_small) last_small = t->offset;
    } else {
      n_large++;
      if (t->offset < first_large) first_large = t->offset;
    }
  }
  assert_true(n_small > 10 && n_large > 0);
  assert_true(last_small < first_large);
  npu_gguf_close(g);
  npulm_model_close(m);
  unlink(path);
  free(path);
}

/* Last logits of evaluating the first 'n' of 'ids' in one call, with or without asking for every
 * row's logits (without: the graphs for generation run). */
static void last_logits(const npulm_model *m, const int32_t *ids, size_t n, bool all_rows,
                        float *out, size_t vocab) {
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = 64;
  npulm_session *s = NULL;
  npulm_error err = {{0}};
  if (npulm_session_create(m, &sp, &s, &err) != NPULM_OK) fail_msg("session: %s", err.msg);
  float *rows = all_rows ? malloc(n * vocab * sizeof(float)) : NULL;
  if (npulm_session_eval(s, ids, n, rows, &err) != NPULM_OK) fail_msg("eval: %s", err.msg);
  memcpy(out, npulm_session_logits(s), vocab * sizeof(float));
  if (rows != NULL) assert_memory_equal(out, rows + (n - 1) * vocab, vocab * sizeof(float));
  free(rows);
  npulm_session_free(s);
}

/* Graphs for generation compute only the last real row's logits, with the same bits as the row
 * of a graph that computes all; the verifier keeps their row copy (on the NPU, with the norm and
 * head after it) in its backend's arena; a program without them (as written before they existed)
 * still verifies and runs. */
static void test_generation_graphs(void **state) {
  (void)state;
  char *src = tmp_path();
  struct tiny t = {.n_layers = 2};
  write_tiny(src, &t);
  npulm_model *m = open_ok(src);
  compile_ok(m, NULL);
  struct npu_program *p = m->program;
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  size_t vocab = (size_t)info.n_vocab;
  int32_t ids[40];
  for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 7 + 3) % info.n_vocab);
  float *all = malloc(vocab * sizeof(float)), *last = malloc(vocab * sizeof(float));
  int32_t n_gen = 0;
  for (int32_t i = 0; i < p->n_graphs; i++) n_gen += npu_graph_logit_rows(&p->graphs[i]) == 1;
  assert_true(n_gen > 1); /* decode and at least one chunk */
  /* 3 tokens (a padded 16-row chunk), 16 (a full one), 17 (chunk then decode), 40 (64 padded) */
  static const size_t lens[] = {3, 16, 17, 40};
  for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
    last_logits(m, ids, lens[k], true, all, vocab);
    last_logits(m, ids, lens[k], false, last, vocab);
    assert_memory_equal(all, last, vocab * sizeof(float));
  }
  /* the row copy moved to the CPU, its tensors still in the NPU's arena: refused */
  npulm_error err = {{0}};
  struct npu_graph *gen = NULL;
  for (int32_t i = 0; i < p->n_graphs && gen == NULL; i++) {
    if (p->graphs[i].rows > 1 && npu_graph_logit_rows(&p->graphs[i]) == 1) gen = &p->graphs[i];
  }
  assert_non_null(gen);
  struct npu_ir_node *copy = NULL;
  for (int32_t i = 0; i < gen->n_nodes; i++) {
    if (gen->nodes[i].op == NPU_OP_LAST_ROW) copy = &gen->nodes[i];
  }
  assert_non_null(copy);
  assert_int_equal(copy->backend, NPU_BE_NPU);
  copy->backend = NPU_BE_CPU;
  assert_int_equal(npu_program_verify(m, p, &err), NPULM_ERR_FORMAT);
  copy->backend = NPU_BE_NPU;
  assert_int_equal(npu_program_verify(m, p, &err), NPULM_OK);
  /* without the graphs for generation: every row's logits, the same last row */
  int32_t kept = 0;
  for (int32_t i = 0; i < p->n_graphs; i++) {
    struct npu_graph *g = &p->graphs[i];
    if (g->rows > 1 && npu_graph_logit_rows(g) == 1) {
      npu_graph_free(g);
    } else {
      p->graphs[kept++] = *g;
    }
  }
  p->n_graphs = kept;
  assert_int_equal(npu_program_verify(m, p, &err), NPULM_OK);
  for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
    last_logits(m, ids, lens[k], false, last, vocab);
    last_logits(m, ids, lens[k], true, all, vocab);
    assert_memory_equal(all, last, vocab * sizeof(float));
  }
  free(all);
  free(last);
  npulm_model_close(m);
  unlink(src);
  free(src);
}

/* The MAC statistics: an FP32 program runs nothing in int8; an integer one every weight matmul
 * but the shadowed channels' share; attention stays in float. */
static void test_mac_stats(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  struct npu_compile_options o;
  small_options(m, &o);
  const struct npu_config *c = &m->cfg;
  compile_ok(m, NULL);
  struct npu_mac_stats st;
  const struct npu_graph *g = npu_program_find(m->program, 1, 64, false);
  assert_non_null(g);
  npu_program_mac_stats(m->program, g, &st);
  uint64_t per_layer = (uint64_t)c->dim * (uint64_t)(c->n_heads * c->head_dim) * 2 +
                       (uint64_t)c->dim * (uint64_t)(c->n_kv_heads * c->head_dim) * 2 +
                       3ull * (uint64_t)c->dim * (uint64_t)c->ffn_dim;
  uint64_t want = per_layer * (uint64_t)c->n_layers + (uint64_t)c->dim * (uint64_t)c->n_vocab;
  assert_int_equal(st.matmul, want);
  assert_int_equal(st.matmul_npu, want);
  assert_int_equal(st.matmul_int8, 0);
  assert_int_equal(st.attention, 2ull * (uint64_t)c->n_layers * (uint64_t)c->n_heads *
                                     (uint64_t)g->ctx * (uint64_t)c->head_dim);
  assert_int_equal(st.attention_npu, 0);

  quantize_ok(m, &o, NPU_QUANT_SHADOW, 3.0f);
  g = npu_program_find(m->program, 16, 64, false);
  assert_non_null(g);
  npu_program_mac_stats(m->program, g, &st);
  assert_int_equal(st.matmul, 16 * want);
  assert_int_equal(st.matmul_int8 + st.matmul_shadow, st.matmul);
  assert_true(st.matmul_shadow > 0 && st.n_outliers > 0 && st.n_shadowed > 0);
  assert_true(st.shadow_extra > 0); /* an FFN down projection has outliers */
  assert_int_equal(st.attention_int8, 0);

  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  npulm_error err = {{0}};
  assert_int_equal(npulm_model_print_program(m, f, &err), NPULM_OK);
  fclose(f);
  const char *needles[] = {"quantization: w8a8-shadow",
                           "I8",
                           "I16",
                           "outlier channels: ",
                           "quantization table",
                           "MACs per step",
                           "decode",
                           "prefill"};
  for (size_t i = 0; i < sizeof(needles) / sizeof(needles[0]); i++) {
    if (strstr(text, needles[i]) == NULL) fail_msg("description lacks '%s':\n%s", needles[i], text);
  }
  free(text);
  npulm_model_close(m);
}

/* The operator table (ir/ops.inc) holds together: one name per op, an op with integer data or
 * cut into rows runs on the NPU, and every group of a site's data (up to the last bit,
 * NPU_SITE_RMSNORM) belongs to an op. */
static void test_op_table(void **state) {
  (void)state;
  uint32_t groups = 0;
  for (int op = 0; op < NPU_OP_COUNT; op++) {
    const struct npu_op_info *info = npu_op_info((enum npu_op)op);
    assert_string_equal(npu_op_name((enum npu_op)op), info->name);
    for (int other = 0; other < op; other++) {
      assert_string_not_equal(info->name, npu_op_name((enum npu_op)other));
    }
    if (info->sites != 0 || info->rowwise) assert_true(info->on_npu);
    groups |= info->sites;
  }
  assert_int_equal(groups, ((uint32_t)NPU_SITE_RMSNORM << 1) - 1);
  assert_string_equal(npu_op_name(NPU_OP_COUNT), "?");
}

int main(void) {
  /* clang-format off */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_tiny),
      cmocka_unit_test(test_round_trip_stories),
      cmocka_unit_test(test_compile_file_streams),
      cmocka_unit_test(test_compile_params),
      cmocka_unit_test(test_session_compiles_short_context),
      cmocka_unit_test(test_api_errors),
      cmocka_unit_test(test_progress_and_print),
      cmocka_unit_test(test_verify_aliasing),
      cmocka_unit_test(test_hostile_version_and_keys),
      cmocka_unit_test(test_hostile_weights),
      cmocka_unit_test(test_hostile_records),
      cmocka_unit_test(test_hostile_sweep),
      cmocka_unit_test(test_hostile_truncated),
      cmocka_unit_test(test_checksum_damage),
      cmocka_unit_test(test_verify_file),
      cmocka_unit_test(test_ir_shape_overflow),
      cmocka_unit_test(test_round_trip_quantized),
      cmocka_unit_test(test_round_trip_quantized_tiny),
      cmocka_unit_test(test_round_trip_precisions),
      cmocka_unit_test(test_verify_int4_packing),
      cmocka_unit_test(test_lean_program),
      cmocka_unit_test(test_hostile_quant),
      cmocka_unit_test(test_hostile_quant_sweep),
      cmocka_unit_test(test_attention_on_npu),
      cmocka_unit_test(test_fused_attention_records),
      cmocka_unit_test(test_three_op_attention_program),
      cmocka_unit_test(test_generation_graphs),
      cmocka_unit_test(test_tied_table),
      cmocka_unit_test(test_small_tensors_first),
      cmocka_unit_test(test_mac_stats),
      cmocka_unit_test(test_op_table),
  };
  /* clang-format on */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
