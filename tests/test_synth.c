/* Synthetic model tests: the files have the real shapes' metadata and tensors, parse with the
 * GGUF reader, are byte-identical for one seed, and report progress. Only small shapes are made. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "io/gguf.h"
#include "io/gguf_write.h"
#include "model/synth.h"
#include "npulm.h"
#include "npulm_bench.h"

static void tmp_path(char *buf, size_t cap, const char *name) {
  const char *d = getenv("TMPDIR");
  snprintf(buf, cap, "%s/npulm-test-synth-%ld-%s", d != NULL && d[0] ? d : "/tmp", (long)getpid(),
           name);
}

static void synth_ok(const char *shape, uint64_t seed, const char *type, const char *path) {
  npulm_error err = {{0}};
  npulm_status st = npulm_synth(shape, seed, type, path, NULL, NULL, &err);
  if (st != NPULM_OK) fail_msg("synth %s %s: %s", shape, type, err.msg);
}

/* The whole file, malloc'd. */
static uint8_t *slurp(const char *path, size_t *size_out) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = malloc((size_t)n + 1);
  assert_non_null(p);
  assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size_out = (size_t)n;
  return p;
}

static uint32_t get_u32(const struct npu_gguf *g, const char *key) {
  uint32_t v = 0;
  npulm_error err = {{0}};
  if (npu_gguf_get_u32(g, key, &v, &err) != NPULM_OK) fail_msg("%s", err.msg);
  return v;
}

static float get_f32(const struct npu_gguf *g, const char *key) {
  float v = 0;
  npulm_error err = {{0}};
  if (npu_gguf_get_f32(g, key, &v, &err) != NPULM_OK) fail_msg("%s", err.msg);
  return v;
}

static void expect_str(const struct npu_gguf *g, const char *key, const char *want) {
  struct npu_gguf_str s;
  npulm_error err = {{0}};
  if (npu_gguf_get_str(g, key, &s, &err) != NPULM_OK) fail_msg("%s", err.msg);
  if (!npu_gguf_str_eq(s, want)) fail_msg("%s is '%.*s', want '%s'", key, (int)s.len, s.ptr, want);
}

static void expect_tensor(const struct npu_gguf *g, const char *name, uint32_t type, uint64_t ne0,
                          uint64_t ne1) {
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
  if (t == NULL) fail_msg("tensor %s is missing", name);
  if (t->type != type || t->ne[0] != ne0 || t->ne[1] != ne1 || t->n_dims != (ne1 > 1 ? 2u : 1u)) {
    fail_msg("tensor %s: type %u ne {%llu, %llu}, want type %u {%llu, %llu}", name, t->type,
             (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], type,
             (unsigned long long)ne0, (unsigned long long)ne1);
  }
}

/* Mean and standard deviation of a tensor's values. */
static void tensor_stats(const struct npu_gguf *g, const char *name, double *mean, double *sd) {
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
  assert_non_null(t);
  float *x = malloc((size_t)t->n_elems * sizeof(float));
  assert_non_null(x);
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_tensor_to_f32(t, x, &err), NPULM_OK);
  double s = 0, s2 = 0;
  for (uint64_t i = 0; i < t->n_elems; i++) {
    assert_true(isfinite(x[i]));
    s += x[i];
    s2 += (double)x[i] * x[i];
  }
  *mean = s / (double)t->n_elems;
  *sd = sqrt(s2 / (double)t->n_elems - *mean * *mean);
  free(x);
}

static void test_shape_names(void **state) {
  (void)state;
  const char *const *names = npulm_synth_shapes();
  const char *required[] = {"stories15M",   "stories110M",  "smollm2-135m",
                            "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b",
                            "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"};
  for (size_t r = 0; r < sizeof(required) / sizeof(required[0]); r++) {
    bool found = false;
    for (size_t i = 0; names[i] != NULL; i++) found = found || strcmp(names[i], required[r]) == 0;
    if (!found) fail_msg("shape %s is missing", required[r]);
  }
  char path[512];
  tmp_path(path, sizeof(path), "bad.gguf");
  npulm_error err = {{0}};
  assert_int_equal(npulm_synth("stories16M", 1, "f32", path, NULL, NULL, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "stories16M"));
  assert_non_null(strstr(err.msg, "stories15M"));
  assert_non_null(strstr(err.msg, "llama-3.2-1b"));
  memset(err.msg, 0, sizeof(err.msg));
  assert_int_equal(npulm_synth("tiny", 1, "q5_k", path, NULL, NULL, &err), NPULM_ERR_ARG);
  assert_null(strchr(err.msg, '\n'));
  const char *accepted[] = {"'q5_k'", "f32", "f16", "bf16", "q4_0", "q8_0", "q4_k", "q6_k"};
  for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
    if (strstr(err.msg, accepted[i]) == NULL) fail_msg("'%s' lacks %s", err.msg, accepted[i]);
  }
  memset(err.msg, 0, sizeof(err.msg)); /* Q4_K's blocks are 256 values, tiny's rows 64 */
  assert_int_equal(npulm_synth("tiny", 1, "q4_k", path, NULL, NULL, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "256"));
  assert_int_not_equal(access(path, F_OK), 0);
  char bad[600];
  snprintf(bad, sizeof(bad), "%s.missing-dir/x.gguf", path);
  memset(err.msg, 0, sizeof(err.msg));
  assert_int_equal(npulm_synth("tiny", 1, "f32", bad, NULL, NULL, &err), NPULM_ERR_IO);
  assert_non_null(strstr(err.msg, bad));
}

/* The real shapes' parameter counts (every tensor synth writes, rope_freqs included) are within
 * 1% of the published ones (the model cards' "Number of Parameters"; Hugging Face's count of the
 * safetensors). Only the table is read: the big shapes take minutes and gigabytes to write. */
static void test_shape_table(void **state) {
  (void)state;
  const struct {
    const char *name;
    double params;
  } published[] = {
      {"stories15M", 15.2e6},   {"stories110M", 110e6},   {"smollm2-135m", 135e6},
      {"qwen2.5-0.5b", 0.49e9}, {"qwen2.5-1.5b", 1.54e9}, {"qwen2.5-7b", 7.61e9},
      {"llama-3.2-1b", 1.24e9}, {"llama-3.2-3b", 3.21e9}, {"llama-3.1-8b", 8.03e9},
  };
  for (size_t i = 0; i < sizeof(published) / sizeof(published[0]); i++) {
    const struct npu_synth_shape *sh = npu_synth_shape_find(published[i].name);
    if (sh == NULL) fail_msg("shape %s is missing", published[i].name);
    const double n = (double)npu_synth_n_params(sh);
    print_message("%-14s %14.0f parameters\n", published[i].name, n);
    if (fabs(n / published[i].params - 1.0) > 0.01) {
      fail_msg("%s: %.0f parameters, published %.3g", published[i].name, n, published[i].params);
    }
  }
  /* Every listed name has a table row. */
  for (const char *const *s = npulm_synth_shapes(); *s != NULL; s++) {
    if (npu_synth_shape_find(*s) == NULL) fail_msg("listed shape %s has no row", *s);
  }
}

static void test_tiny_llama_q8_0(void **state) {
  (void)state;
  char path[512];
  tmp_path(path, sizeof(path), "tiny-q8_0.gguf");
  synth_ok("tiny", 7, "q8_0", path);
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  expect_str(g, "general.architecture", "llama");
  expect_str(g, "tokenizer.ggml.model", "llama");
  assert_int_equal(get_u32(g, "general.alignment"), 32);
  assert_int_equal(get_u32(g, "general.file_type"), 7);
  assert_int_equal(get_u32(g, "llama.embedding_length"), 64);
  assert_int_equal(get_u32(g, "llama.block_count"), 2);
  assert_int_equal(get_u32(g, "llama.feed_forward_length"), 160);
  assert_int_equal(get_u32(g, "llama.attention.head_count"), 4);
  assert_int_equal(get_u32(g, "llama.attention.head_count_kv"), 2);
  assert_int_equal(get_u32(g, "llama.rope.dimension_count"), 16);
  assert_int_equal(get_u32(g, "llama.vocab_size"), 512);
  assert_int_equal(get_u32(g, "llama.context_length"), 256);
  assert_true(get_f32(g, "llama.rope.freq_base") == 10000.0f);
  assert_true(get_f32(g, "llama.attention.layer_norm_rms_epsilon") == 1e-5f);
  assert_int_equal(get_u32(g, "tokenizer.ggml.bos_token_id"), 1);
  assert_int_equal(get_u32(g, "tokenizer.ggml.eos_token_id"), 2);
  bool add_bos = false;
  assert_int_equal(npu_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, &err), NPULM_OK);
  assert_true(add_bos);

  /* Tensors: 2-D weights Q8_0, 1-D norms F32, separate output. */
  expect_tensor(g, "token_embd.weight", NPU_GGML_Q8_0, 64, 512);
  expect_tensor(g, "blk.0.attn_norm.weight", NPU_GGML_F32, 64, 1);
  expect_tensor(g, "blk.1.attn_q.weight", NPU_GGML_Q8_0, 64, 64);
  expect_tensor(g, "blk.1.attn_k.weight", NPU_GGML_Q8_0, 64, 32);
  expect_tensor(g, "blk.1.attn_v.weight", NPU_GGML_Q8_0, 64, 32);
  expect_tensor(g, "blk.1.attn_output.weight", NPU_GGML_Q8_0, 64, 64);
  expect_tensor(g, "blk.1.ffn_norm.weight", NPU_GGML_F32, 64, 1);
  expect_tensor(g, "blk.1.ffn_gate.weight", NPU_GGML_Q8_0, 64, 160);
  expect_tensor(g, "blk.1.ffn_up.weight", NPU_GGML_Q8_0, 64, 160);
  expect_tensor(g, "blk.1.ffn_down.weight", NPU_GGML_Q8_0, 160, 64);
  expect_tensor(g, "output_norm.weight", NPU_GGML_F32, 64, 1);
  expect_tensor(g, "output.weight", NPU_GGML_Q8_0, 64, 512);
  assert_null(npu_gguf_find_tensor(g, "blk.2.attn_q.weight"));
  assert_null(npu_gguf_find_tensor(g, "blk.0.attn_q.bias"));
  assert_int_equal(g->n_tensors, 3 + 2 * 9);

  /* Weights of realistic scale: matrices ~ N(0, 1/fan_in), norms ~ 1. */
  double mean, sd;
  tensor_stats(g, "blk.0.ffn_down.weight", &mean, &sd);
  assert_true(fabs(mean) < 0.01 && fabs(sd - 1.0 / sqrt(160.0)) < 0.01);
  tensor_stats(g, "token_embd.weight", &mean, &sd);
  assert_true(fabs(mean) < 0.01 && fabs(sd - 0.125) < 0.01);
  tensor_stats(g, "blk.1.attn_norm.weight", &mean, &sd);
  assert_true(fabs(mean - 1.0) < 0.01 && sd > 0.005 && sd < 0.05);

  /* The vocabulary: specials, bytes, then unique normal pieces. */
  struct npu_gguf_arr tokens, types, scores;
  assert_int_equal(npu_gguf_get_arr(g, "tokenizer.ggml.tokens", NPU_GGUF_STR, &tokens, &err),
                   NPULM_OK);
  assert_int_equal(npu_gguf_get_arr(g, "tokenizer.ggml.token_type", NPU_GGUF_I32, &types, &err),
                   NPULM_OK);
  assert_int_equal(npu_gguf_get_arr(g, "tokenizer.ggml.scores", NPU_GGUF_F32, &scores, &err),
                   NPULM_OK);
  assert_int_equal(tokens.n, 512);
  assert_int_equal(types.n, 512);
  assert_int_equal(scores.n, 512);
  struct npu_gguf_value *tok = calloc(512, sizeof(*tok));
  assert_non_null(tok);
  npu_gguf_arr_values(&tokens, tok);
  assert_true(npu_gguf_str_eq(tok[0].v.s, "<unk>") && npu_gguf_arr_num(&types, 0) == 2);
  assert_true(npu_gguf_str_eq(tok[1].v.s, "<s>") && npu_gguf_arr_num(&types, 1) == 3);
  assert_true(npu_gguf_str_eq(tok[2].v.s, "</s>") && npu_gguf_arr_num(&types, 2) == 3);
  assert_true(npu_gguf_str_eq(tok[3 + 0x0A].v.s, "<0x0A>") && npu_gguf_arr_num(&types, 13) == 6);
  assert_true(npu_gguf_str_eq(tok[258].v.s, "<0xFF>"));
  assert_true(npu_gguf_str_eq(tok[259].v.s, "\xe2\x96\x81"));
  for (uint64_t i = 259; i < 512; i++) {
    assert_true(npu_gguf_arr_num(&types, i) == 1);
    assert_true(tok[i].v.s.len > 0);
    if (i > 259) assert_true(npu_gguf_arr_num(&scores, i) < npu_gguf_arr_num(&scores, i - 1));
    for (uint64_t j = 0; j < i; j++) {
      if (tok[i].v.s.len == tok[j].v.s.len &&
          memcmp(tok[i].v.s.ptr, tok[j].v.s.ptr, tok[i].v.s.len) == 0) {
        fail_msg("token %llu duplicates token %llu", (unsigned long long)i, (unsigned long long)j);
      }
    }
  }
  free(tok);
  npu_gguf_close(g);
  unlink(path);
}

static void test_tiny_qwen2_f16(void **state) {
  (void)state;
  char path[512];
  tmp_path(path, sizeof(path), "tiny-qwen2-f16.gguf");
  synth_ok("tiny-qwen2", 3, "f16", path);
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  expect_str(g, "general.architecture", "qwen2");
  assert_int_equal(get_u32(g, "general.file_type"), 1);
  assert_int_equal(get_u32(g, "qwen2.embedding_length"), 64);
  assert_int_equal(get_u32(g, "qwen2.attention.head_count_kv"), 1);
  assert_true(get_f32(g, "qwen2.rope.freq_base") == 1e6f);
  assert_true(get_f32(g, "qwen2.attention.layer_norm_rms_epsilon") == 1e-6f);
  assert_null(npu_gguf_find(g, "qwen2.vocab_size")); /* the converter writes it for llama only */
  expect_tensor(g, "token_embd.weight", NPU_GGML_F16, 64, 640);
  expect_tensor(g, "blk.0.attn_q.weight", NPU_GGML_F16, 64, 64);
  expect_tensor(g, "blk.0.attn_q.bias", NPU_GGML_F32, 64, 1);
  expect_tensor(g, "blk.0.attn_k.bias", NPU_GGML_F32, 16, 1);
  expect_tensor(g, "blk.1.attn_v.bias", NPU_GGML_F32, 16, 1);
  assert_null(npu_gguf_find_tensor(g, "output.weight")); /* tied */
  double mean, sd;
  tensor_stats(g, "blk.0.attn_q.bias", &mean, &sd);
  assert_true(sd > 0.005 && sd < 0.05);
  npu_gguf_close(g);
  unlink(path);
}

/* Tensor 't' holds the F32 tensor 'r' through the quantizer of its type. */
static void expect_quantized(const struct npu_gguf_tensor *t, const struct npu_gguf_tensor *r) {
  uint32_t block, block_bytes;
  assert_true(npu_ggml_type_size(t->type, &block, &block_bytes));
  assert_int_equal(r->type, NPU_GGML_F32);
  assert_int_equal(t->n_elems, r->n_elems);
  const size_t n_blocks = (size_t)(t->n_elems / block), nbytes = n_blocks * block_bytes;
  assert_int_equal(t->nbytes, nbytes);
  uint8_t *want = malloc(nbytes);
  assert_non_null(want);
  npu_ggml_type_from_f32(t->type)(r->data, want, n_blocks);
  assert_memory_equal(t->data, want, nbytes);
  free(want);
}

/* Q4_0, Q8_0 (the type named in capitals) and BF16 matrices: the file says so, the norms and biases
 * stay the F32 file's, and every matrix is the F32 file's (same seed) through the type's quantizer
 * (tests/test_dequant.c checks those against llama-quantize); Q4_0 as llama-quantize's Q4_0 mix,
 * the classifier (here the tied embedding, rows of 64) in Q8_0. */
static void test_tiny_block_types(void **state) {
  (void)state;
  char ref_path[512], path[512];
  tmp_path(ref_path, sizeof(ref_path), "tiny-f32.gguf");
  synth_ok("tiny-qwen2", 5, "f32", ref_path);
  struct npu_gguf *ref = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open(ref_path, &ref, &err), NPULM_OK);
  const struct {
    const char *name;
    uint32_t type, file_type, classifier_type; /* the tied token_embd: Q4_0's mix makes it Q8_0 */
  } types[] = {{"q4_0", NPU_GGML_Q4_0, 2, NPU_GGML_Q8_0},
               {"Q8_0", NPU_GGML_Q8_0, 7, NPU_GGML_Q8_0},
               {"bf16", NPU_GGML_BF16, 32, NPU_GGML_BF16}};
  for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
    tmp_path(path, sizeof(path), types[k].name);
    synth_ok("tiny-qwen2", 5, types[k].name, path);
    struct npu_gguf *g = NULL;
    assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
    assert_int_equal(get_u32(g, "general.file_type"), types[k].file_type);
    assert_int_equal(g->n_tensors, ref->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
      const struct npu_gguf_tensor *t = &g->tensors[i], *r = &ref->tensors[i];
      assert_true(t->n_elems == r->n_elems && t->n_dims == r->n_dims);
      if (t->n_dims == 1) {
        assert_int_equal(t->type, NPU_GGML_F32);
        assert_memory_equal(t->data, r->data, (size_t)t->nbytes);
        continue;
      }
      const bool classifier = npu_gguf_str_eq(t->name, "token_embd.weight");
      assert_int_equal(t->type, classifier ? types[k].classifier_type : types[k].type);
      expect_quantized(t, r);
    }
    npu_gguf_close(g);
    unlink(path);
  }
  npu_gguf_close(ref);
  unlink(ref_path);
}

/* The K types, and Q4_0's mix, on a shape whose rows are whole 256-value blocks (written in
 * memory): the matrices are the F32 image's (same seed) through the type's quantizer, Q4_0's
 * classifier (output.weight) in Q6_K; general.file_type is llama.cpp's (Q4_K_M for Q4_K, as
 * llama-quantize --pure Q4_K_M writes). */
static void test_k_types_custom_shape(void **state) {
  (void)state;
  const struct npu_synth_shape sh = {.arch = "llama",
                                     .title = "k-types",
                                     .dim = 256,
                                     .n_layers = 1,
                                     .n_heads = 4,
                                     .n_kv_heads = 2,
                                     .ffn_dim = 512,
                                     .n_vocab = 300,
                                     .n_ctx = 64,
                                     .rope_base = 10000.0f,
                                     .rms_eps = 1e-5f};
  const struct {
    uint32_t type, file_type, classifier_type; /* output.weight: Q4_0's mix makes it Q6_K */
  } types[] = {{NPU_GGML_F32, 0, NPU_GGML_F32},
               {NPU_GGML_Q4_K, 15, NPU_GGML_Q4_K},
               {NPU_GGML_Q6_K, 18, NPU_GGML_Q6_K},
               {NPU_GGML_Q4_0, 2, NPU_GGML_Q6_K}};
  enum { N = sizeof(types) / sizeof(types[0]) };
  void *image[N];
  struct npu_gguf *g[N];
  npulm_error err = {{0}};
  for (int k = 0; k < N; k++) {
    const struct npu_synth_options o = {.type2d = types[k].type, .seed = 9};
    struct npu_gguf_writer *w = NULL;
    size_t size;
    assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
    assert_int_equal(npu_synth_write(w, &sh, &o, &err), NPULM_OK);
    assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
    assert_int_equal(npu_gguf_writer_take_memory(w, &image[k], &size, &err), NPULM_OK);
    npu_gguf_writer_free(w);
    assert_int_equal(npu_gguf_open_memory(image[k], size, &g[k], &err), NPULM_OK);
    assert_int_equal(get_u32(g[k], "general.file_type"), types[k].file_type);
  }
  for (int k = 1; k < N; k++) {
    for (uint64_t i = 0; i < g[k]->n_tensors; i++) {
      const struct npu_gguf_tensor *t = &g[k]->tensors[i], *r = &g[0]->tensors[i];
      if (t->n_dims == 1) continue;
      const bool classifier = npu_gguf_str_eq(t->name, "output.weight");
      assert_int_equal(t->type, classifier ? types[k].classifier_type : types[k].type);
      expect_quantized(t, r);
    }
  }
  for (int k = 0; k < N; k++) {
    npu_gguf_close(g[k]);
    free(image[k]);
  }
}

struct progress_log {
  int calls;
  uint64_t last_done;
  uint64_t total;
  bool monotone;
};

static void on_progress(void *user, uint64_t done, uint64_t total) {
  struct progress_log *p = user;
  if (done < p->last_done || (p->calls > 0 && total != p->total)) p->monotone = false;
  p->calls++;
  p->last_done = done;
  p->total = total;
}

static void test_deterministic(void **state) {
  (void)state;
  char a[512], b[512], c[512];
  tmp_path(a, sizeof(a), "det-a.gguf");
  tmp_path(b, sizeof(b), "det-b.gguf");
  tmp_path(c, sizeof(c), "det-c.gguf");
  struct progress_log log = {.monotone = true};
  npulm_error err = {{0}};
  assert_int_equal(npulm_synth("tiny", 42, "f32", a, on_progress, &log, &err), NPULM_OK);
  synth_ok("tiny", 42, "f32", b);
  synth_ok("tiny", 43, "f32", c);
  size_t na, nb, nc;
  uint8_t *pa = slurp(a, &na), *pb = slurp(b, &nb), *pc = slurp(c, &nc);
  assert_int_equal(na, nb);
  assert_memory_equal(pa, pb, na);
  assert_int_equal(na, nc);
  assert_true(memcmp(pa, pc, na) != 0);
  assert_true(log.calls > 0 && log.monotone);
  assert_int_equal(log.last_done, log.total);
  assert_true(log.total > 0 && log.total < na);
  free(pa);
  free(pb);
  free(pc);
  unlink(a);
  unlink(b);
  unlink(c);
}

/* A real shape end to end: stories15M (about 25 MB in Q8_0). */
static void test_stories15m(void **state) {
  (void)state;
  char path[512];
  tmp_path(path, sizeof(path), "stories15M-q8_0.gguf");
  synth_ok("stories15M", 1, "q8_0", path);
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  assert_int_equal(get_u32(g, "llama.embedding_length"), 288);
  assert_int_equal(get_u32(g, "llama.block_count"), 6);
  assert_int_equal(get_u32(g, "llama.attention.head_count"), 6);
  assert_int_equal(get_u32(g, "llama.attention.head_count_kv"), 6);
  assert_int_equal(get_u32(g, "llama.feed_forward_length"), 768);
  assert_int_equal(get_u32(g, "llama.context_length"), 256);
  assert_int_equal(get_u32(g, "llama.vocab_size"), 32000);
  expect_tensor(g, "token_embd.weight", NPU_GGML_Q8_0, 288, 32000);
  expect_tensor(g, "blk.5.ffn_down.weight", NPU_GGML_Q8_0, 768, 288);
  assert_null(npu_gguf_find_tensor(g, "output.weight")); /* llama2.c shares the classifier */
  struct npu_gguf_arr tokens;
  assert_int_equal(npu_gguf_get_arr(g, "tokenizer.ggml.tokens", NPU_GGUF_STR, &tokens, &err),
                   NPULM_OK);
  assert_int_equal(tokens.n, 32000);
  uint64_t n_params = 0;
  for (uint64_t i = 0; i < g->n_tensors; i++) n_params += g->tensors[i].n_elems;
  assert_int_equal(n_params, 15191712); /* stories15M's 15.2M parameters */
  npu_gguf_close(g);
  unlink(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shape_names),      cmocka_unit_test(test_shape_table),
      cmocka_unit_test(test_tiny_llama_q8_0),  cmocka_unit_test(test_tiny_qwen2_f16),
      cmocka_unit_test(test_tiny_block_types), cmocka_unit_test(test_k_types_custom_shape),
      cmocka_unit_test(test_deterministic),    cmocka_unit_test(test_stories15m),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
