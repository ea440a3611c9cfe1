/* GGUF block formats: every tensor of every file in ../shared/data/quant (written by llama.cpp's
 * llama-quantize) dequantized by npulm must hash to llama.cpp's own dequantization, bit for bit
 * (expected.json: SHA-256 of the F32 bytes, first values, sum); every type npulm writes quantizes
 * the golden F32 model to llama-quantize's bytes; the llama.cpp mixes open as models
 * and run; hostile block tensors and unsupported types are one-line errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <nettle/sha2.h>

#include "test_util.h"

#include "io/ggml_blocks.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "model/synth.h"

#define QUANT_DIR "data/quant/"

/* expected.json, parsed (skipping the test when the shared data is absent). */
static json_t *load_expected(void) {
  const char *path = test_shared_path(QUANT_DIR "expected.json");
  TEST_REQUIRE_FILE(path);
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  if (root == NULL) fail_msg("%s:%d: %s", path, jerr.line, jerr.text);
  assert_true(json_is_object(root));
  return root;
}

static void sha256_hex(const float *x, size_t n, char hex[65]) {
  struct sha256_ctx ctx;
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_init(&ctx);
  sha256_update(&ctx, n * sizeof(float), (const uint8_t *)x); /* little-endian host */
  sha256_digest(&ctx, sizeof(digest), digest);
  for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof(a)) == 0; }

/* Check tensor 'want' (an expected.json entry) of 'g' ('file' for messages); return the number of
 * mismatches, each printed. '*type_seen' gets the type's bit. */
static int check_tensor(const struct npu_gguf *g, const char *file, json_t *want,
                        uint64_t *types_seen) {
  const char *name = json_string_value(json_object_get(want, "name"));
  const char *type = json_string_value(json_object_get(want, "type"));
  const char *sha = json_string_value(json_object_get(want, "sha256_f32"));
  json_t *ne = json_object_get(want, "ne"), *first = json_object_get(want, "first");
  assert_non_null(name);
  assert_non_null(type);
  assert_non_null(sha);
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
  if (t == NULL) {
    print_message("%s: no tensor %s\n", file, name);
    return 1;
  }
  if (strcmp(npu_ggml_type_name(t->type), type) != 0) {
    print_message("%s: %s is %s, expected %s\n", file, name, npu_ggml_type_name(t->type), type);
    return 1;
  }
  *types_seen |= 1ull << t->type;
  assert_int_equal(json_array_size(ne), t->n_dims);
  for (size_t d = 0; d < t->n_dims; d++) {
    assert_int_equal((uint64_t)json_integer_value(json_array_get(ne, d)), t->ne[d]);
  }
  float *out = malloc((size_t)t->n_elems * sizeof(float));
  assert_non_null(out);
  npulm_error err = {{0}};
  if (npu_gguf_tensor_to_f32(t, out, &err) != NPULM_OK) {
    print_message("%s: %s: %s\n", file, name, err.msg);
    free(out);
    return 1;
  }
  int bad = 0;
  char hex[65];
  sha256_hex(out, (size_t)t->n_elems, hex);
  if (strcmp(hex, sha) != 0) {
    print_message("%s: %s (%s): SHA-256 %s, llama.cpp's %s\n", file, name, type, hex, sha);
    bad++;
  }
  for (size_t i = 0; i < json_array_size(first) && i < t->n_elems; i++) {
    float w = (float)json_number_value(json_array_get(first, i));
    if (!same_bits(out[i], w)) {
      print_message("%s: %s (%s): value %zu is %.9g, llama.cpp's %.9g\n", file, name, type, i,
                    (double)out[i], (double)w);
      bad++;
      break;
    }
  }
  double sum = 0, sum_abs = 0;
  for (uint64_t i = 0; i < t->n_elems; i++) {
    sum += out[i];
    sum_abs += fabs(out[i]);
  }
  double want_sum = json_number_value(json_object_get(want, "sum"));
  if (fabs(sum - want_sum) > 1e-9 * (1 + sum_abs)) { /* summation order may differ */
    print_message("%s: %s (%s): sum %.17g, llama.cpp's %.17g\n", file, name, type, sum, want_sum);
    bad++;
  }
  free(out);
  return bad;
}

/* Every tensor of every file of expected.json; all 17 readable types must occur. */
static void test_golden_digests(void **state) {
  (void)state;
  json_t *root = load_expected();
  const char *file;
  json_t *tensors;
  int bad = 0, n_tensors = 0, n_files = 0;
  uint64_t seen = 0;
  json_object_foreach(root, file, tensors) {
    char rel[256];
    snprintf(rel, sizeof(rel), QUANT_DIR "%s", file);
    const char *path = test_shared_path(rel);
    struct npu_gguf *g = NULL;
    npulm_error err = {{0}};
    if (npu_gguf_open(path, &g, &err) != NPULM_OK) fail_msg("%s: %s", path, err.msg);
    size_t i;
    json_t *want;
    json_array_foreach(tensors, i, want) {
      bad += check_tensor(g, file, want, &seen);
      n_tensors++;
    }
    npu_gguf_close(g);
    n_files++;
  }
  json_decref(root);
  print_message("%d tensors of %d files checked, %d mismatches\n", n_tensors, n_files, bad);
  assert_int_equal(bad, 0);
  for (uint32_t t = 0; t < 64; t++) {
    if (npu_ggml_type_to_f32(t) != NULL && !(seen & (1ull << t)))
      fail_msg("no golden tensor of type %s", npu_ggml_type_name(t));
  }
}

/* Every type npulm writes: each tensor llama-quantize stored in that type in golden-TYPE.gguf is
 * the golden F32 model's tensor quantized by npulm, byte for byte (llama.cpp's quantize_row_*_ref,
 * which llama-quantize uses without an importance matrix). */
static void test_golden_quantize(void **state) {
  (void)state;
  struct npu_gguf *f32 = NULL;
  npulm_error err = {{0}};
  const char *path = test_shared_path(QUANT_DIR "golden-f32.gguf");
  TEST_REQUIRE_FILE(path);
  if (npu_gguf_open(path, &f32, &err) != NPULM_OK) fail_msg("%s: %s", path, err.msg);
  int n_types = 0;
  for (uint32_t type = 0; type < 64; type++) {
    const npu_ggml_from_f32_fn quantize = npu_ggml_type_from_f32(type);
    if (quantize == NULL || type == NPU_GGML_F32) continue;
    uint32_t block, block_bytes;
    assert_true(npu_ggml_type_size(type, &block, &block_bytes));
    char rel[256];
    snprintf(rel, sizeof(rel), QUANT_DIR "golden-%s.gguf", npu_ggml_type_name(type));
    struct npu_gguf *g = NULL;
    path = test_shared_path(rel);
    if (npu_gguf_open(path, &g, &err) != NPULM_OK) fail_msg("%s: %s", path, err.msg);
    size_t n_checked = 0, bad_tensors = 0;
    for (uint64_t i = 0; i < f32->n_tensors; i++) {
      const struct npu_gguf_tensor *src = &f32->tensors[i];
      assert_int_equal(src->type, NPU_GGML_F32);
      char name[128];
      snprintf(name, sizeof(name), "%.*s", (int)src->name.len, src->name.ptr);
      const struct npu_gguf_tensor *want = npu_gguf_find_tensor(g, name);
      if (want == NULL) fail_msg("%s: no tensor %s", rel, name);
      if (src->n_dims < 2) { /* norms stay F32 */
        assert_int_equal(want->type, NPU_GGML_F32);
        continue;
      }
      if (want->type != type) fail_msg("%s: %s is not %s", rel, name, npu_ggml_type_name(type));
      assert_int_equal(want->n_elems, src->n_elems);
      assert_int_equal(src->n_elems % block, 0);
      const size_t n_blocks = (size_t)(src->n_elems / block);
      assert_int_equal(want->nbytes, n_blocks * block_bytes);
      uint8_t *got = malloc(n_blocks * block_bytes);
      assert_non_null(got);
      quantize(src->data, got, n_blocks);
      const uint8_t *ref = want->data;
      size_t bad_blocks = 0, first_bad = 0;
      for (size_t b = 0; b < n_blocks; b++) {
        if (memcmp(got + b * block_bytes, ref + b * block_bytes, block_bytes) != 0) {
          if (bad_blocks++ == 0) first_bad = b;
        }
      }
      if (bad_blocks > 0) {
        print_message("%s: %s: %zu of %zu blocks differ from llama-quantize's, first %zu\n", rel,
                      name, bad_blocks, n_blocks, first_bad);
        bad_tensors++;
      }
      free(got);
      n_checked++;
    }
    print_message("%s: %zu matrices quantized, %zu differ\n", rel, n_checked, bad_tensors);
    assert_true(n_checked > 0);
    assert_int_equal(bad_tensors, 0);
    npu_gguf_close(g);
    n_types++;
  }
  npu_gguf_close(f32);
  assert_true(n_types >= 2); /* at least Q4_0 and Q8_0 */
}

/* synth's q4_0 is llama-quantize's Q4_0 mix: on the golden model's shape (rows of 256 and 512, the
 * embedding tied), every tensor has the type it has in mixed-Q4_0.gguf (the embedding Q6_K). */
static void test_synth_q4_0_is_the_mix(void **state) {
  (void)state;
  const char *path = test_shared_path(QUANT_DIR "mixed-Q4_0.gguf");
  TEST_REQUIRE_FILE(path);
  struct npu_gguf *mix = NULL, *g = NULL;
  npulm_error err = {{0}};
  if (npu_gguf_open(path, &mix, &err) != NPULM_OK) fail_msg("%s: %s", path, err.msg);
  const struct npu_synth_shape sh = {.arch = "llama",
                                     .title = "golden",
                                     .dim = 256,
                                     .n_layers = 1,
                                     .n_heads = 4,
                                     .n_kv_heads = 4,
                                     .ffn_dim = 512,
                                     .n_vocab = 512,
                                     .n_ctx = 64,
                                     .rope_base = 10000.0f,
                                     .rms_eps = 1e-5f,
                                     .tied = true};
  const struct npu_synth_options o = {.type2d = NPU_GGML_Q4_0};
  struct npu_gguf_writer *w = NULL;
  void *image;
  size_t size;
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  assert_int_equal(npu_synth_write(w, &sh, &o, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_take_memory(w, &image, &size, &err), NPULM_OK);
  npu_gguf_writer_free(w);
  assert_int_equal(npu_gguf_open_memory(image, size, &g, &err), NPULM_OK);
  assert_int_equal(g->n_tensors, mix->n_tensors);
  for (uint64_t i = 0; i < mix->n_tensors; i++) {
    const struct npu_gguf_tensor *want = &mix->tensors[i];
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)want->name.len, want->name.ptr);
    const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
    if (t == NULL) fail_msg("synth wrote no %s", name);
    if (t->type != want->type) {
      fail_msg("%s: synth's %s, llama-quantize's %s", name, npu_ggml_type_name(t->type),
               npu_ggml_type_name(want->type));
    }
  }
  npu_gguf_close(g);
  free(image);
  npu_gguf_close(mix);
}

/* Edge cases the golden model may not reach. Q4_0: the value of largest magnitude sets the sign of
 * d and lands on -8 (nibble 0); its opposite number would be +8, which is capped at nibble 15; a
 * block of zeros has d = -0 (0 / -8, as in llama.cpp) and nibbles 8. Q8_0: q = roundf(x * (1/d))
 * as llama.cpp computes it, which differs from roundf(x / d) on the value below (5.5 against
 * 5.49999952). */
static void test_quantize_edges(void **state) {
  (void)state;
  float x[64] = {0};
  x[0] = 4.0f;   /* largest magnitude, positive: d = -0.5 */
  x[1] = -4.0f;  /* -4 * (1 / -0.5) + 8.5 = 16.5: capped at 15 */
  x[17] = 1.0f;  /* 1 * -2 + 8.5 = 6.5: 6 */
  x[18] = -0.3f; /* 0.6 + 8.5 = 9.1: 9 */
  uint8_t q[2 * 18];
  npu_ggml_q4_0_from_f32(x, q, 2);
  assert_int_equal(q[0] | q[1] << 8, npu_f32_to_f16(-0.5f));
  assert_int_equal(q[2 + 0], 0x80);             /* values 0 (nibble 0) and 16 (zero: 8) */
  assert_int_equal(q[2 + 1], 0x6f);             /* values 1 (capped 15) and 17 (6) */
  assert_int_equal(q[2 + 2], 0x98);             /* values 2 (zero: 8) and 18 (9) */
  assert_int_equal(q[18] | q[19] << 8, 0x8000); /* the zero block: d = -0 */
  for (int j = 0; j < 16; j++) assert_int_equal(q[20 + j], 0x88);

  const uint32_t a_bits = 0x3f9e442cu, x_bits = 0x3d5b5464u; /* 1.23645544, 0.053547278 */
  float y[32] = {0};
  memcpy(&y[0], &a_bits, 4);
  memcpy(&y[1], &x_bits, 4);
  y[2] = -y[1];
  uint8_t q8[NPU_Q8_0_BLOCK_BYTES];
  npu_ggml_q8_0_from_f32(y, q8, 1);
  assert_int_equal((int8_t)q8[2], 127);
  assert_int_equal((int8_t)q8[3], 6); /* x * (1/d) = 5.5 rounds away from zero; x / d gives 5 */
  assert_int_equal((int8_t)q8[4], -6);
}

/* The logits (n_vocab, malloc'd) after 'n' tokens of 'm' in a session of the reference forward
 * or of the compiled FP32 graphs. */
static float *eval_logits(const npulm_model *m, bool reference, const int32_t *tokens, size_t n,
                          const char *file) {
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = 8;
  sp.n_threads = 2;
  sp.reference = reference;
  npulm_session *s = NULL;
  npulm_error err = {{0}};
  if (npulm_session_create(m, &sp, &s, &err) != NPULM_OK) fail_msg("%s: %s", file, err.msg);
  if (npulm_session_eval(s, tokens, n, NULL, &err) != NPULM_OK) fail_msg("%s: %s", file, err.msg);
  float *logits = malloc((size_t)info.n_vocab * sizeof(float));
  assert_non_null(logits);
  memcpy(logits, npulm_session_logits(s), (size_t)info.n_vocab * sizeof(float));
  npulm_session_free(s);
  return logits;
}

/* Every half through the row converter (F16C where the CPU has it, at any alignment and tail)
 * equals the scalar conversion bit for bit; a NaN stays a NaN of the same sign and payload (a
 * signalling one may come out quiet, as from llama.cpp's F16C build). */
static void test_f16_rows_exact(void **state) {
  (void)state;
  enum { N = 65536 };
  uint16_t *h = malloc((N + 1) * sizeof(uint16_t));
  float *out = malloc(N * sizeof(float));
  assert_non_null(h);
  assert_non_null(out);
  for (int start = 0; start < 2; start++) {
    for (uint32_t i = 0; i < N; i++) h[start + i] = (uint16_t)i;
    size_t n = N - (size_t)start * 3; /* second pass: 2-byte offset, a tail of 5 */
    npu_ggml_f16_to_f32((const uint8_t *)(h + start), out, n);
    for (size_t i = 0; i < n; i++) {
      const float want = npu_f16_to_f32(h[start + i]);
      uint32_t a, b;
      memcpy(&a, &out[i], 4);
      memcpy(&b, &want, 4);
      if (isnan(want) ? !isnan(out[i]) || ((a ^ b) & ~0x00400000u) != 0 : a != b) {
        fail_msg("half 0x%04x: 0x%08x, scalar 0x%08x", h[start + i], a, b);
      }
    }
  }
  free(h);
  free(out);
}

/* llama.cpp's default mixes (Q6_K embedding, Q4_K/Q5_K/Q4_0 matrices, F32 norms) open as models;
 * the FP32 reference runs a few tokens to finite logits, and the compiled FP32 graphs agree. */
static void test_mixed_models_run(void **state) {
  (void)state;
  const char *files[] = {"mixed-Q4_K_M.gguf", "mixed-Q5_K_M.gguf", "mixed-Q4_0.gguf"};
  for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
    char rel[256];
    snprintf(rel, sizeof(rel), QUANT_DIR "%s", files[f]);
    npulm_model *m = test_open_shared(rel);
    npulm_model_info info;
    npulm_model_get_info(m, &info);
    /* every tensor of the file is a weight the model reads, counted once */
    struct npu_gguf *g = NULL;
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_open(test_shared_path(rel), &g, &err), NPULM_OK);
    uint64_t n_params = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) n_params += g->tensors[i].n_elems;
    npu_gguf_close(g);
    assert_int_equal(info.n_params, n_params);
    const int32_t tokens[4] = {1, 17, 200, 3};
    float *ref = eval_logits(m, true, tokens, 4, files[f]);
    float *compiled = eval_logits(m, false, tokens, 4, files[f]);
    double max_diff = 0, max_abs = 0;
    for (int i = 0; i < info.n_vocab; i++) {
      if (!isfinite(ref[i])) fail_msg("%s: logit %d is %g", files[f], i, (double)ref[i]);
      max_diff = fmax(max_diff, fabs((double)ref[i] - compiled[i]));
      max_abs = fmax(max_abs, fabs((double)ref[i]));
    }
    print_message("%s: max |logit| %.3g, compiled - reference %.3g\n", files[f], max_abs, max_diff);
    if (max_diff > 1e-4 * (1 + max_abs)) {
      fail_msg("%s: compiled logits differ from the reference by %g", files[f], max_diff);
    }
    free(ref);
    free(compiled);
    npulm_model_close(m);
  }
}

/* A hand-made file of one tensor 't' of 'type' with row length 'ne0' and 'data_bytes' of data. */
static void one_tensor_image(struct npu_gguf_buf *b, uint32_t type, uint64_t ne0, uint64_t ne1,
                             size_t data_bytes) {
  npu_gguf_buf_put_u32(b, 0x46554747u); /* "GGUF" */
  npu_gguf_buf_put_u32(b, 3);
  npu_gguf_buf_put_u64(b, 1); /* tensors */
  npu_gguf_buf_put_u64(b, 0); /* metadata */
  npu_gguf_buf_put_str(b, "t");
  npu_gguf_buf_put_u32(b, 2);
  npu_gguf_buf_put_u64(b, ne0);
  npu_gguf_buf_put_u64(b, ne1);
  npu_gguf_buf_put_u32(b, type);
  npu_gguf_buf_put_u64(b, 0); /* offset */
  npu_gguf_buf_put_zeros(b, (32 - b->size % 32) % 32);
  npu_gguf_buf_put_zeros(b, data_bytes);
  assert_false(b->failed);
}

/* Open 'b' expecting NPULM_ERR_FORMAT with a one-line message naming the tensor and 'needle'. */
static void expect_format_error(struct npu_gguf_buf *b, const char *needle) {
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(b->data, b->size, &g, &err), NPULM_ERR_FORMAT);
  assert_null(g);
  if (strstr(err.msg, "'t'") == NULL || strstr(err.msg, needle) == NULL)
    fail_msg("message '%s' lacks 't' or '%s'", err.msg, needle);
  assert_null(strchr(err.msg, '\n'));
  npu_gguf_buf_free(b);
}

/* Every block type: a row that is not a whole number of blocks, and data that stops short of
 * what the type needs, are one-line format errors naming the tensor; the exact size opens and
 * dequantizes (all-zero blocks give zeros). */
static void test_hostile_block_tensors(void **state) {
  (void)state;
  for (uint32_t type = 0; type < 64; type++) {
    uint32_t block, nbytes;
    if (npu_ggml_type_to_f32(type) == NULL || !npu_ggml_type_size(type, &block, &nbytes)) continue;
    const uint64_t rows = 3;
    struct npu_gguf_buf b = {0};
    if (block > 1) {
      one_tensor_image(&b, type, block + block / 2, rows, 4 * nbytes * rows);
      expect_format_error(&b, "not a multiple");
      one_tensor_image(&b, type, 8, rows, 4 * nbytes * rows);
      expect_format_error(&b, "not a multiple");
    }
    one_tensor_image(&b, type, 2 * block, rows, 2 * nbytes * rows - 1);
    expect_format_error(&b, "outside");
    one_tensor_image(&b, type, 2 * block, rows, 2 * nbytes * rows);
    struct npu_gguf *g = NULL;
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_open_memory(b.data, b.size, &g, &err), NPULM_OK);
    assert_int_equal(g->tensors[0].nbytes, 2 * nbytes * rows);
    float *out = malloc(2 * block * rows * sizeof(float));
    assert_non_null(out);
    assert_int_equal(npu_gguf_tensor_to_f32(&g->tensors[0], out, &err), NPULM_OK);
    for (uint64_t i = 0; i < 2 * block * rows; i++) assert_true(out[i] == 0.0f);
    free(out);
    npu_gguf_close(g);
    npu_gguf_buf_free(&b);
  }
}

/* Set the type id of tensor 'name' in the file image 'data' (its info lies in the header). */
static void patch_type(uint8_t *data, size_t size, const char *name, uint32_t type) {
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open_memory(data, size, &g, &err), NPULM_OK);
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, name);
  assert_non_null(t);
  size_t at =
      (size_t)((const uint8_t *)t->name.ptr - data) + (size_t)t->name.len + 4 + 8 * t->n_dims;
  npu_gguf_close(g);
  memcpy(data + at, &type, 4);
}

/* Two F16 tensors from the writer, one relabelled F32 (twice the bytes): the first then runs into
 * the second's data, the second past the end of the file; each a one-line format error naming
 * the tensor and the type. */
static void test_type_disagrees_with_data(void **state) {
  (void)state;
  const char *names[] = {"a", "b"};
  const char *want[] = {"runs into tensor 'b'", "lies outside"};
  for (int k = 0; k < 2; k++) {
    struct npu_gguf_writer *w = NULL;
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
    const uint64_t ne[1] = {64};
    uint16_t half[64] = {0};
    npu_gguf_writer_add_tensor(w, "a", NPU_GGML_F16, 1, ne, NULL);
    npu_gguf_writer_add_tensor(w, "b", NPU_GGML_F16, 1, ne, NULL);
    npu_gguf_writer_write_tensor(w, 0, half, &err);
    npu_gguf_writer_write_tensor(w, 1, half, &err);
    assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
    void *image;
    size_t size;
    assert_int_equal(npu_gguf_writer_take_memory(w, &image, &size, &err), NPULM_OK);
    npu_gguf_writer_free(w);
    patch_type(image, size, names[k], NPU_GGML_F32);
    struct npu_gguf *g = NULL;
    assert_int_equal(npu_gguf_open_memory(image, size, &g, &err), NPULM_ERR_FORMAT);
    assert_null(g);
    char tname[8];
    snprintf(tname, sizeof(tname), "'%s'", names[k]);
    if (strstr(err.msg, tname) == NULL || strstr(err.msg, "F32") == NULL ||
        strstr(err.msg, want[k]) == NULL) {
      fail_msg("'%s' lacks %s, F32 or '%s'", err.msg, tname, want[k]);
    }
    assert_null(strchr(err.msg, '\n'));
    free(image);
  }
}

/* A model whose matrices have types npulm does not read: one line naming every one of them, with
 * its type, not just the first. */
static void test_unsupported_types_named(void **state) {
  (void)state;
  const struct npu_synth_shape sh = {.arch = "llama",
                                     .title = "unread",
                                     .dim = 64,
                                     .n_layers = 2,
                                     .n_heads = 2,
                                     .n_kv_heads = 2,
                                     .ffn_dim = 128,
                                     .n_vocab = 264,
                                     .n_ctx = 64,
                                     .rope_base = 10000.0f,
                                     .rms_eps = 1e-5f,
                                     .tied = true};
  const uint32_t types[] = {39 /* MXFP4 */, 9 /* Q8_1 */};
  for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
    char path[] = "/tmp/npulm-test-dequant-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    const struct npu_synth_options o = {.type2d = types[k]};
    struct npu_gguf_writer *w = NULL;
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
    assert_int_equal(npu_synth_write(w, &sh, &o, &err), NPULM_OK);
    assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
    npu_gguf_writer_free(w);
    npulm_model *m = NULL;
    npulm_status st = npulm_model_open(path, &m, &err);
    unlink(path);
    assert_int_equal(st, NPULM_ERR_UNSUPPORTED);
    assert_null(m);
    assert_null(strchr(err.msg, '\n'));
    const char *tname = npu_ggml_type_name(types[k]);
    /* the first, one of the second layer, and the count of those that did not fit */
    char want[64];
    snprintf(want, sizeof(want), "token_embd.weight (%s)", tname);
    if (strstr(err.msg, want) == NULL) fail_msg("'%s' lacks '%s'", err.msg, want);
    snprintf(want, sizeof(want), "blk.0.attn_q.weight (%s)", tname);
    if (strstr(err.msg, want) == NULL) fail_msg("'%s' lacks '%s'", err.msg, want);
    /* 1 + 2 layers x 7 matrices = 15 tensors: every one listed or counted */
    int listed = 0;
    for (const char *p = err.msg; (p = strstr(p, tname)) != NULL; p++) listed++;
    const char *more = strstr(err.msg, " and ");
    int counted = more != NULL ? atoi(more + 5) : 0;
    if (listed + counted != 15)
      fail_msg("'%s' names %d + %d tensors, not 15", err.msg, listed, counted);
  }
}

/* A Q8_0 model with two matrices of types npulm does not read (smaller than Q8_0, so their data
 * still lies in the file): the one-line error names both, with their types, and nothing else. */
static void test_two_unsupported_named(void **state) {
  (void)state;
  const struct npu_synth_shape sh = {.arch = "llama",
                                     .title = "two",
                                     .dim = 256,
                                     .n_layers = 2,
                                     .n_heads = 2,
                                     .n_kv_heads = 2,
                                     .ffn_dim = 256,
                                     .n_vocab = 264,
                                     .n_ctx = 64,
                                     .rope_base = 10000.0f,
                                     .rms_eps = 1e-5f,
                                     .tied = true};
  const struct npu_synth_options o = {.type2d = NPU_GGML_Q8_0};
  struct npu_gguf_writer *w = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  assert_int_equal(npu_synth_write(w, &sh, &o, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  void *image;
  size_t size;
  assert_int_equal(npu_gguf_writer_take_memory(w, &image, &size, &err), NPULM_OK);
  npu_gguf_writer_free(w);
  patch_type(image, size, "blk.0.attn_q.weight", 16 /* IQ2_XXS */);
  patch_type(image, size, "blk.1.ffn_down.weight", 39 /* MXFP4 */);
  char path[] = "/tmp/npulm-test-dequant-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, image, size), (ssize_t)size);
  close(fd);
  free(image);
  npulm_model *m = NULL;
  npulm_status st = npulm_model_open(path, &m, &err);
  unlink(path);
  if (st != NPULM_ERR_UNSUPPORTED) fail_msg("status %d: %s", st, err.msg);
  assert_null(m);
  assert_null(strchr(err.msg, '\n'));
  const char *want[] = {"tensors of types npulm does not read: ", "blk.0.attn_q.weight (IQ2_XXS)",
                        "blk.1.ffn_down.weight (MXFP4)"};
  for (size_t i = 0; i < 3; i++) {
    if (strstr(err.msg, want[i]) == NULL) fail_msg("'%s' lacks '%s'", err.msg, want[i]);
  }
  assert_null(strstr(err.msg, " more"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_golden_digests),
      cmocka_unit_test(test_golden_quantize),
      cmocka_unit_test(test_quantize_edges),
      cmocka_unit_test(test_synth_q4_0_is_the_mix),
      cmocka_unit_test(test_f16_rows_exact),
      cmocka_unit_test(test_mixed_models_run),
      cmocka_unit_test(test_hostile_block_tensors),
      cmocka_unit_test(test_type_disagrees_with_data),
      cmocka_unit_test(test_unsupported_types_named),
      cmocka_unit_test(test_two_unsupported_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
