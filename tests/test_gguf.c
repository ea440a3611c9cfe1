/* GGUF reader and writer tests: round trips of every metadata type, tensor conversions, and
 * hostile files (truncated, absurd counts and lengths, bad shapes, types, offsets, alignment).
 * Every rejected file must give a non-OK status with a message and leak nothing (run under SAN=1).
 */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "test_util.h"

#include "io/gguf.h"
#include "io/gguf_checksum.h"
#include "io/gguf_write.h"

/* ---- Helpers -------------------------------------------------------------------------------- */

/* Open a copy of 'size' bytes of 'data' in a buffer of exactly that size (so that AddressSanitizer
 * sees any read past the end) and expect failure with a message; if 'want' is not NULL the
 * message must contain it. Returns the status. */
static npulm_status expect_fail(const void *data, size_t size, const char *want) {
  uint8_t *copy = malloc(size ? size : 1);
  assert_non_null(copy);
  if (size) memcpy(copy, data, size);
  struct npu_gguf *g = (struct npu_gguf *)1;
  npulm_error err = {{0}};
  npulm_status st = npu_gguf_open_memory(copy, size, &g, &err);
  if (st == NPULM_OK) {
    npu_gguf_close(g);
    free(copy);
    fail_msg("a hostile file was accepted (expected an error containing '%s')", want ? want : "");
  }
  assert_null(g);
  assert_true(strlen(err.msg) > 0);
  if (want != NULL && strstr(err.msg, want) == NULL) {
    free(copy);
    fail_msg("error '%s' does not mention '%s'", err.msg, want);
  }
  free(copy);
  return st;
}

static void expect_fail_buf(struct npu_gguf_buf *b, const char *want) {
  assert_false(b->failed);
  expect_fail(b->data, b->size, want);
  npu_gguf_buf_free(b);
}

/* Open 'b' and expect success; the caller closes the result. 'b' must outlive it. */
static struct npu_gguf *expect_ok(const struct npu_gguf_buf *b) {
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  npulm_status st = npu_gguf_open_memory(b->data, b->size, &g, &err);
  if (st != NPULM_OK) fail_msg("valid file rejected: %s", err.msg);
  return g;
}

/* Hand-made files: header, key-values and tensor infos written field by field. */
static void put_header(struct npu_gguf_buf *b, uint32_t version, uint64_t n_tensors,
                       uint64_t n_kv) {
  npu_gguf_buf_put_u32(b, 0x46554747u);
  npu_gguf_buf_put_u32(b, version);
  npu_gguf_buf_put_u64(b, n_tensors);
  npu_gguf_buf_put_u64(b, n_kv);
}

static void put_kv_u32(struct npu_gguf_buf *b, const char *key, uint32_t v) {
  npu_gguf_buf_put_str(b, key);
  npu_gguf_buf_put_u32(b, NPU_GGUF_U32);
  npu_gguf_buf_put_u32(b, v);
}

static void put_tinfo(struct npu_gguf_buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                      uint32_t type, uint64_t offset) {
  npu_gguf_buf_put_str(b, name);
  npu_gguf_buf_put_u32(b, n_dims);
  for (uint32_t i = 0; i < n_dims && i < 5; i++)
    npu_gguf_buf_put_u64(b, ne[i]); /* hostile n_dims */
  npu_gguf_buf_put_u32(b, type);
  npu_gguf_buf_put_u64(b, offset);
}

static void pad_to(struct npu_gguf_buf *b, size_t align) {
  npu_gguf_buf_put_zeros(b, (align - b->size % align) % align);
}

/* A file with one tensor of shape 'ne' ('n_dims' dims), type 'type', data offset 'offset' and
 * 'data_bytes' bytes of data after the aligned header. */
static void one_tensor_file(struct npu_gguf_buf *b, uint32_t n_dims, const uint64_t *ne,
                            uint32_t type, uint64_t offset, size_t data_bytes) {
  put_header(b, 3, 1, 1);
  put_kv_u32(b, "general.alignment", 32);
  put_tinfo(b, "t", n_dims, ne, type, offset);
  pad_to(b, 32);
  npu_gguf_buf_put_zeros(b, data_bytes);
}

/* Build a small valid image with the writer: a few metadata values and three tensors, the last
 * one followed by 28 bytes of padding that a reader may do without. '*end_out' is the offset of the
 * last tensor byte + 1. */
static void small_valid_file(void **data_out, size_t *size_out, size_t *end_out) {
  struct npu_gguf_writer *w = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  const int32_t arr[3] = {1, -2, 3};
  const char *strs[2] = {"a", "bc"};
  npu_gguf_writer_add_str(w, "general.architecture", "llama");
  npu_gguf_writer_add_u32(w, "llama.block_count", 2);
  npu_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f);
  npu_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
  npu_gguf_writer_add_arr(w, "x.ints", NPU_GGUF_I32, arr, 3);
  npu_gguf_writer_add_arr_str(w, "x.strs", strs, 2);
  const uint64_t ne_a[2] = {4, 3}, ne_b[1] = {32}, ne_c[2] = {32, 2};
  npu_gguf_writer_add_tensor(w, "a", NPU_GGML_F32, 2, ne_a, NULL);
  npu_gguf_writer_add_tensor(w, "b", NPU_GGML_F16, 1, ne_b, NULL);
  npu_gguf_writer_add_tensor(w, "c", NPU_GGML_Q8_0, 2, ne_c, NULL);
  float fa[12];
  for (int i = 0; i < 12; i++) fa[i] = (float)i - 5.5f;
  uint16_t fb[32];
  for (int i = 0; i < 32; i++) fb[i] = npu_f32_to_f16((float)i / 8.0f);
  float fc[64];
  for (int i = 0; i < 64; i++) fc[i] = sinf((float)i);
  uint8_t qc[2 * NPU_Q8_0_BLOCK_BYTES];
  npu_ggml_q8_0_from_f32(fc, qc, 2);
  npu_gguf_writer_write_tensor(w, 0, fa, &err);
  npu_gguf_writer_write_tensor(w, 1, fb, &err);
  assert_int_equal(npu_gguf_writer_write_tensor(w, 2, qc, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_take_memory(w, data_out, size_out, &err), NPULM_OK);
  npu_gguf_writer_free(w);
  assert_int_equal(*size_out % 32, 0); /* the Q8_0 tensor is 68 bytes: 28 bytes of tail padding */
  *end_out = *size_out - 28;
}

/* Read every value and convert every supported tensor of an accepted file (ASan watches). */
static void touch_everything(const struct npu_gguf *g) {
  for (uint64_t i = 0; i < g->n_kv; i++) {
    const struct npu_gguf_value *v = &g->kv[i].val;
    if (v->type != NPU_GGUF_ARR || v->v.a.n > 100000) continue;
    struct npu_gguf_value *vals = calloc(v->v.a.n ? v->v.a.n : 1, sizeof(*vals));
    assert_non_null(vals);
    npu_gguf_arr_values(&v->v.a, vals);
    if (v->v.a.type != NPU_GGUF_STR && v->v.a.type != NPU_GGUF_ARR) {
      for (uint64_t j = 0; j < v->v.a.n; j++) (void)npu_gguf_arr_num(&v->v.a, j);
    }
    free(vals);
  }
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    const struct npu_gguf_tensor *t = &g->tensors[i];
    if (t->n_elems > (1u << 20)) continue;
    float *dst = malloc((size_t)t->n_elems * sizeof(float));
    assert_non_null(dst);
    npulm_error err = {{0}};
    npulm_status st = npu_gguf_tensor_to_f32(t, dst, &err);
    assert_true(st == NPULM_OK || strlen(err.msg) > 0);
    free(dst);
  }
}

/* ---- Writer and round trips ----------------------------------------------------------------- */

static void test_roundtrip_every_type(void **state) {
  (void)state;
  struct npu_gguf_writer *w = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_u8(w, "v.u8", 200);
  npu_gguf_writer_add_i8(w, "v.i8", -100);
  npu_gguf_writer_add_u16(w, "v.u16", 65000);
  npu_gguf_writer_add_i16(w, "v.i16", -32000);
  npu_gguf_writer_add_u32(w, "v.u32", 4000000000u);
  npu_gguf_writer_add_i32(w, "v.i32", -2000000000);
  npu_gguf_writer_add_u64(w, "v.u64", 0xFFFFFFFFFFFFFFF0ull);
  npu_gguf_writer_add_i64(w, "v.i64", INT64_MIN);
  npu_gguf_writer_add_f32(w, "v.f32", 1.5f);
  npu_gguf_writer_add_f64(w, "v.f64", -2.25e300);
  npu_gguf_writer_add_bool(w, "v.bool", true);
  npu_gguf_writer_add_bool(w, "v.false", false);
  npu_gguf_writer_add_str(w, "v.str", "h\xc3\xa9llo");
  npu_gguf_writer_add_str(w, "v.empty", "");
  const uint8_t a_u8[3] = {1, 2, 255};
  const int8_t a_i8[2] = {-128, 127};
  const uint16_t a_u16[2] = {0, 65535};
  const int16_t a_i16[2] = {-32768, 32767};
  const uint32_t a_u32[2] = {0, 4294967295u};
  const int32_t a_i32[2] = {INT32_MIN, INT32_MAX};
  const uint64_t a_u64[2] = {1, 1ull << 53};
  const int64_t a_i64[2] = {-(1ll << 53), 7};
  const float a_f32[3] = {0.5f, -1e30f, 3.0f};
  const double a_f64[2] = {1e-300, -0.125};
  const uint8_t a_bool[3] = {1, 0, 1};
  npu_gguf_writer_add_arr(w, "a.u8", NPU_GGUF_U8, a_u8, 3);
  npu_gguf_writer_add_arr(w, "a.i8", NPU_GGUF_I8, a_i8, 2);
  npu_gguf_writer_add_arr(w, "a.u16", NPU_GGUF_U16, a_u16, 2);
  npu_gguf_writer_add_arr(w, "a.i16", NPU_GGUF_I16, a_i16, 2);
  npu_gguf_writer_add_arr(w, "a.u32", NPU_GGUF_U32, a_u32, 2);
  npu_gguf_writer_add_arr(w, "a.i32", NPU_GGUF_I32, a_i32, 2);
  npu_gguf_writer_add_arr(w, "a.u64", NPU_GGUF_U64, a_u64, 2);
  npu_gguf_writer_add_arr(w, "a.i64", NPU_GGUF_I64, a_i64, 2);
  npu_gguf_writer_add_arr(w, "a.f32", NPU_GGUF_F32, a_f32, 3);
  npu_gguf_writer_add_arr(w, "a.f64", NPU_GGUF_F64, a_f64, 2);
  npu_gguf_writer_add_arr(w, "a.bool", NPU_GGUF_BOOL, a_bool, 3);
  npu_gguf_writer_add_arr(w, "a.empty", NPU_GGUF_U32, NULL, 0);
  const char *strs[3] = {"x", "", "\xe2\x96\x81the"};
  npu_gguf_writer_add_arr_str(w, "a.str", strs, 3);
  /* Nested: [[1, 2, 3], []] of i32, and [["p", "q"]] of strings inside an array of arrays. */
  struct npu_gguf_buf nb = {0};
  npu_gguf_buf_put_u32(&nb, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&nb, 2);
  npu_gguf_buf_put_u32(&nb, NPU_GGUF_I32);
  npu_gguf_buf_put_u64(&nb, 3);
  for (int32_t i = 1; i <= 3; i++) npu_gguf_buf_put_u32(&nb, (uint32_t)i);
  npu_gguf_buf_put_u32(&nb, NPU_GGUF_I32);
  npu_gguf_buf_put_u64(&nb, 0);
  npu_gguf_writer_add_raw(w, "a.nested", NPU_GGUF_ARR, nb.data, nb.size);
  npu_gguf_buf_free(&nb);
  npu_gguf_buf_put_u32(&nb, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&nb, 1);
  npu_gguf_buf_put_u32(&nb, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&nb, 1);
  npu_gguf_buf_put_u32(&nb, NPU_GGUF_STR);
  npu_gguf_buf_put_u64(&nb, 2);
  npu_gguf_buf_put_str(&nb, "p");
  npu_gguf_buf_put_str(&nb, "q");
  assert_false(nb.failed);
  assert_int_equal(npu_gguf_writer_add_raw(w, "a.deep", NPU_GGUF_ARR, nb.data, nb.size), NPULM_OK);
  npu_gguf_buf_free(&nb);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  void *data;
  size_t size;
  assert_int_equal(npu_gguf_writer_take_memory(w, &data, &size, &err), NPULM_OK);
  npu_gguf_writer_free(w);

  struct npu_gguf *g = NULL;
  assert_int_equal(npu_gguf_open_memory(data, size, &g, &err), NPULM_OK);
  assert_int_equal(g->version, 3);
  assert_int_equal(g->n_tensors, 0);
  assert_int_equal(g->n_kv, 29);
  const struct npu_gguf_kv *kv;
  assert_non_null(kv = npu_gguf_find(g, "v.u8"));
  assert_int_equal(kv->val.type, NPU_GGUF_U8);
  assert_int_equal(kv->val.v.u, 200);
  assert_int_equal(npu_gguf_find(g, "v.i8")->val.v.i, -100);
  assert_int_equal(npu_gguf_find(g, "v.u16")->val.v.u, 65000);
  assert_int_equal(npu_gguf_find(g, "v.i16")->val.v.i, -32000);
  assert_int_equal(npu_gguf_find(g, "v.u32")->val.v.u, 4000000000u);
  assert_int_equal(npu_gguf_find(g, "v.i32")->val.v.i, -2000000000);
  assert_true(npu_gguf_find(g, "v.u64")->val.v.u == 0xFFFFFFFFFFFFFFF0ull);
  assert_true(npu_gguf_find(g, "v.i64")->val.v.i == INT64_MIN);
  assert_true(npu_gguf_find(g, "v.f32")->val.v.f == 1.5);
  assert_true(npu_gguf_find(g, "v.f64")->val.v.f == -2.25e300);
  assert_int_equal(npu_gguf_find(g, "v.f64")->val.type, NPU_GGUF_F64);
  assert_null(npu_gguf_find(g, "v.nope"));

  /* Typed getters: integers convert when they fit; errors name the key. */
  uint32_t u;
  float f;
  bool b;
  struct npu_gguf_str s;
  assert_int_equal(npu_gguf_get_u32(g, "v.u8", &u, &err), NPULM_OK);
  assert_int_equal(u, 200);
  assert_int_equal(npu_gguf_get_u32(g, "v.u16", &u, &err), NPULM_OK);
  assert_int_equal(u, 65000);
  assert_int_equal(npu_gguf_get_u32(g, "v.u32", &u, &err), NPULM_OK);
  assert_int_equal(u, 4000000000u);
  assert_int_not_equal(npu_gguf_get_u32(g, "v.i32", &u, &err), NPULM_OK);
  assert_non_null(strstr(err.msg, "v.i32"));
  assert_int_not_equal(npu_gguf_get_u32(g, "v.u64", &u, &err), NPULM_OK);
  assert_non_null(strstr(err.msg, "v.u64"));
  assert_int_not_equal(npu_gguf_get_u32(g, "v.str", &u, &err), NPULM_OK);
  assert_non_null(strstr(err.msg, "v.str"));
  assert_int_not_equal(npu_gguf_get_u32(g, "missing.key", &u, &err), NPULM_OK);
  assert_non_null(strstr(err.msg, "missing.key"));
  assert_int_equal(npu_gguf_get_f32(g, "v.f32", &f, &err), NPULM_OK);
  assert_true(f == 1.5f);
  assert_int_equal(npu_gguf_get_f32(g, "v.u8", &f, &err), NPULM_OK);
  assert_true(f == 200.0f);
  assert_int_not_equal(npu_gguf_get_f32(g, "v.f64", &f, &err), NPULM_OK); /* -inf as a float */
  assert_int_equal(npu_gguf_get_bool(g, "v.bool", &b, &err), NPULM_OK);
  assert_true(b);
  assert_int_equal(npu_gguf_get_bool(g, "v.false", &b, &err), NPULM_OK);
  assert_false(b);
  assert_int_not_equal(npu_gguf_get_bool(g, "v.u8", &b, &err), NPULM_OK);
  assert_int_equal(npu_gguf_get_str(g, "v.str", &s, &err), NPULM_OK);
  assert_true(npu_gguf_str_eq(s, "h\xc3\xa9llo"));
  assert_int_equal(npu_gguf_get_str(g, "v.empty", &s, &err), NPULM_OK);
  assert_int_equal(s.len, 0);

  /* Numeric arrays. */
  struct {
    const char *key;
    uint32_t type;
    uint64_t n;
    double v[3];
  } arrs[] = {
      {"a.u8", NPU_GGUF_U8, 3, {1, 2, 255}},
      {"a.i8", NPU_GGUF_I8, 2, {-128, 127}},
      {"a.u16", NPU_GGUF_U16, 2, {0, 65535}},
      {"a.i16", NPU_GGUF_I16, 2, {-32768, 32767}},
      {"a.u32", NPU_GGUF_U32, 2, {0, 4294967295.0}},
      {"a.i32", NPU_GGUF_I32, 2, {INT32_MIN, INT32_MAX}},
      {"a.u64", NPU_GGUF_U64, 2, {1, 9007199254740992.0}},
      {"a.i64", NPU_GGUF_I64, 2, {-9007199254740992.0, 7}},
      {"a.f32", NPU_GGUF_F32, 3, {0.5, (double)-1e30f, 3}},
      {"a.f64", NPU_GGUF_F64, 2, {1e-300, -0.125}},
      {"a.bool", NPU_GGUF_BOOL, 3, {1, 0, 1}},
      {"a.empty", NPU_GGUF_U32, 0, {0}},
  };
  for (size_t i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) {
    struct npu_gguf_arr a;
    assert_int_equal(npu_gguf_get_arr(g, arrs[i].key, (int)arrs[i].type, &a, &err), NPULM_OK);
    assert_int_equal(a.n, arrs[i].n);
    struct npu_gguf_value vals[3];
    npu_gguf_arr_values(&a, vals);
    for (uint64_t j = 0; j < a.n; j++) {
      assert_true(npu_gguf_arr_num(&a, j) == arrs[i].v[j]);
      assert_int_equal(vals[j].type, arrs[i].type);
    }
  }
  struct npu_gguf_arr a;
  assert_int_not_equal(npu_gguf_get_arr(g, "a.u8", NPU_GGUF_I32, &a, &err), NPULM_OK);
  assert_non_null(strstr(err.msg, "a.u8"));
  assert_int_equal(npu_gguf_get_arr(g, "a.str", NPU_GGUF_STR, &a, &err), NPULM_OK);
  struct npu_gguf_value sv[3];
  npu_gguf_arr_values(&a, sv);
  assert_true(npu_gguf_str_eq(sv[0].v.s, "x"));
  assert_true(npu_gguf_str_eq(sv[1].v.s, ""));
  assert_true(npu_gguf_str_eq(sv[2].v.s, "\xe2\x96\x81the"));

  /* Nested arrays. */
  assert_int_equal(npu_gguf_get_arr(g, "a.nested", NPU_GGUF_ARR, &a, &err), NPULM_OK);
  assert_int_equal(a.n, 2);
  struct npu_gguf_value outer[2];
  npu_gguf_arr_values(&a, outer);
  assert_int_equal(outer[0].v.a.type, NPU_GGUF_I32);
  assert_int_equal(outer[0].v.a.n, 3);
  assert_true(npu_gguf_arr_num(&outer[0].v.a, 2) == 3.0);
  assert_int_equal(outer[1].v.a.n, 0);
  assert_int_equal(npu_gguf_get_arr(g, "a.deep", NPU_GGUF_ARR, &a, &err), NPULM_OK);
  struct npu_gguf_value l1, l2[2];
  npu_gguf_arr_values(&a, &l1);
  assert_int_equal(l1.v.a.type, NPU_GGUF_ARR);
  struct npu_gguf_value l1b;
  npu_gguf_arr_values(&l1.v.a, &l1b);
  assert_int_equal(l1b.v.a.type, NPU_GGUF_STR);
  npu_gguf_arr_values(&l1b.v.a, l2);
  assert_true(npu_gguf_str_eq(l2[1].v.s, "q"));

  npu_gguf_close(g);
  free(data);
}

static void test_versions_2_and_3(void **state) {
  (void)state;
  for (uint32_t version = 2; version <= 3; version++) {
    struct npu_gguf_writer *w = NULL;
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
    npu_gguf_writer_set_version(w, version);
    npu_gguf_writer_add_str(w, "general.architecture", "llama");
    const uint64_t ne[1] = {8};
    const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    npu_gguf_writer_add_tensor(w, "x", NPU_GGML_F32, 1, ne, NULL);
    npu_gguf_writer_write_tensor(w, 0, x, &err);
    assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
    void *data;
    size_t size;
    assert_int_equal(npu_gguf_writer_take_memory(w, &data, &size, &err), NPULM_OK);
    npu_gguf_writer_free(w);
    struct npu_gguf *g = NULL;
    assert_int_equal(npu_gguf_open_memory(data, size, &g, &err), NPULM_OK);
    assert_int_equal(g->version, version);
    const struct npu_gguf_tensor *t = npu_gguf_find_tensor(g, "x");
    assert_non_null(t);
    assert_memory_equal(t->data, x, sizeof(x));
    npu_gguf_close(g);
    free(data);
  }
}

static void test_tensor_layout(void **state) {
  (void)state;
  for (uint32_t align = 1; align <= 256; align *= 4) {
    struct npu_gguf_writer *w = NULL;
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
    assert_int_equal(npu_gguf_writer_add_u32(w, "general.alignment", align), NPULM_OK);
    const uint64_t ne_a[1] = {3}, ne_b[4] = {2, 3, 4, 5}, ne_c[1] = {7};
    npu_gguf_writer_add_tensor(w, "blk.0.a", NPU_GGML_F32, 1, ne_a, NULL);
    npu_gguf_writer_add_tensor(w, "blk.0.b", NPU_GGML_F16, 4, ne_b, NULL);
    size_t ic = 99;
    npu_gguf_writer_add_tensor(w, "blk.0.c", NPU_GGML_BF16, 1, ne_c, &ic);
    assert_int_equal(ic, 2);
    uint16_t bdata[120];
    for (int i = 0; i < 120; i++) bdata[i] = npu_f32_to_f16((float)i);
    const float adata[3] = {1, 2, 3};
    const uint16_t cdata[7] = {0x3f80, 0xc000, 0, 0x8000, 0x7f80, 0x4049, 0x3e80};
    /* Stream in odd chunks that span tensor boundaries. */
    struct npu_gguf_buf all = {0};
    npu_gguf_buf_put(&all, adata, sizeof(adata));
    npu_gguf_buf_put(&all, bdata, sizeof(bdata));
    npu_gguf_buf_put(&all, cdata, sizeof(cdata));
    for (size_t off = 0; off < all.size; off += 5) {
      size_t n = all.size - off < 5 ? all.size - off : 5;
      assert_int_equal(npu_gguf_writer_write_data(w, all.data + off, n, &err), NPULM_OK);
    }
    npu_gguf_buf_free(&all);
    uint64_t declared = npu_gguf_writer_file_size(w);
    assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
    void *data;
    size_t size;
    assert_int_equal(npu_gguf_writer_take_memory(w, &data, &size, &err), NPULM_OK);
    assert_int_equal(size, declared);
    npu_gguf_writer_free(w);
    struct npu_gguf *g = NULL;
    assert_int_equal(npu_gguf_open_memory(data, size, &g, &err), NPULM_OK);
    assert_int_equal(g->alignment, align);
    assert_int_equal(g->data_offset % align, 0);
    assert_int_equal(g->n_tensors, 3);
    for (uint64_t i = 0; i < 3; i++) {
      const struct npu_gguf_tensor *t = &g->tensors[i];
      assert_int_equal(((const uint8_t *)t->data - g->base) % align, 0);
      assert_int_equal(t->offset % align, 0);
    }
    const struct npu_gguf_tensor *b = npu_gguf_find_tensor(g, "blk.0.b");
    assert_non_null(b);
    assert_int_equal(b->n_dims, 4);
    assert_int_equal(b->ne[3], 5);
    assert_int_equal(b->n_elems, 120);
    assert_int_equal(b->nbytes, 240);
    float out[120];
    assert_int_equal(npu_gguf_tensor_to_f32(b, out, &err), NPULM_OK);
    for (int i = 0; i < 120; i++) assert_true(out[i] == (float)i);
    const struct npu_gguf_tensor *c = npu_gguf_find_tensor(g, "blk.0.c");
    assert_int_equal(c->ne[1], 1);
    assert_int_equal(npu_gguf_tensor_to_f32(c, out, &err), NPULM_OK);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.0f && signbit(out[3]));
    assert_true(isinf(out[4]) && out[5] == 3.140625f && out[6] == 0.25f);
    assert_null(npu_gguf_find_tensor(g, "blk.0"));
    npu_gguf_close(g);
    free(data);
  }
}

/* ---- Conversions ---------------------------------------------------------------------------- */

static void test_f16_conversions(void **state) {
  (void)state;
  /* Every half round-trips through float (NaNs stay NaN). */
  for (uint32_t h = 0; h < 65536; h++) {
    float f = npu_f16_to_f32((uint16_t)h);
    if (isnan(f)) {
      assert_true(isnan(npu_f16_to_f32(npu_f32_to_f16(f))));
    } else if (npu_f32_to_f16(f) != h) {
      fail_msg("half 0x%04x -> %g -> 0x%04x", h, (double)f, npu_f32_to_f16(f));
    }
  }
  assert_int_equal(npu_f32_to_f16(1.0f), 0x3c00);
  assert_int_equal(npu_f32_to_f16(-2.0f), 0xc000);
  assert_int_equal(npu_f32_to_f16(65504.0f), 0x7bff);
  assert_int_equal(npu_f32_to_f16(65520.0f), 0x7c00); /* rounds up to inf */
  assert_int_equal(npu_f32_to_f16(65519.0f), 0x7bff);
  assert_int_equal(npu_f32_to_f16(1e10f), 0x7c00);
  assert_int_equal(npu_f32_to_f16(-INFINITY), 0xfc00);
  assert_true((npu_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (npu_f32_to_f16(NAN) & 0x3ff) != 0);
  assert_int_equal(npu_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);        /* smallest subnormal */
  assert_int_equal(npu_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);        /* tie to even: zero */
  assert_int_equal(npu_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);        /* above the tie */
  assert_int_equal(npu_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);        /* tie 1.5 ulp -> even 2 */
  assert_int_equal(npu_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);        /* smallest normal */
  assert_int_equal(npu_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400);     /* subnormal rounds up */
  assert_int_equal(npu_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie to even */
  assert_int_equal(npu_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02);
  assert_int_equal(npu_f32_to_f16(-0.0f), 0x8000);
  assert_true(npu_bf16_to_f32(0x3f80) == 1.0f);
  assert_true(npu_bf16_to_f32(0xc0a0) == -5.0f);
  /* Random floats: relative error at most 2^-11 in the normal range. */
  uint64_t rs = 42;
  for (int i = 0; i < 100000; i++) {
    float x = ((float)(test_rand(&rs) >> 40) / (float)(1 << 24) - 0.5f) * 1000.0f;
    if (fabsf(x) < 1e-4f) continue;
    float y = npu_f16_to_f32(npu_f32_to_f16(x));
    assert_true(fabsf(y - x) <= fabsf(x) * 0x1p-11f);
  }
}

static void test_q8_0_quantize(void **state) {
  (void)state;
  float x[64] = {0};
  for (int i = 0; i < 32; i++) x[i] = (float)(i - 16) * 0.25f; /* amax = 4 at i = 0 */
  uint8_t q[2 * NPU_Q8_0_BLOCK_BYTES];
  npu_ggml_q8_0_from_f32(x, q, 2);
  uint16_t h;
  memcpy(&h, q, 2);
  assert_int_equal(h, npu_f32_to_f16(4.0f / 127.0f));
  assert_int_equal((int8_t)q[2], -127);
  assert_int_equal((int8_t)q[2 + 16], 0);
  assert_int_equal((int8_t)q[2 + 31], 119); /* 3.75 / (4/127) = 119.06 */
  /* The all-zero second block: d = 0, q = 0. */
  memcpy(&h, q + NPU_Q8_0_BLOCK_BYTES, 2);
  assert_int_equal(h, 0);
  for (int j = 0; j < 32; j++) assert_int_equal(q[NPU_Q8_0_BLOCK_BYTES + 2 + j], 0);
}

/* Write F32 reference values and their F16, BF16 and Q8_0 encodings; read all back as floats. */
static void test_tensor_to_f32_accuracy(void **state) {
  (void)state;
  enum { N = 4096 };
  float *ref = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
  uint16_t *f16 = malloc(N * 2), *bf16 = malloc(N * 2);
  uint8_t *q8 = malloc(N / 32 * NPU_Q8_0_BLOCK_BYTES);
  assert_true(ref && out && f16 && bf16 && q8);
  uint64_t rs = 7;
  for (int i = 0; i < N; i++) {
    float u = (float)(test_rand(&rs) >> 40) / (float)(1 << 24) - 0.5f;
    ref[i] = u * (i % 64 == 0 ? 50.0f : 2.0f); /* outliers in some blocks */
    f16[i] = npu_f32_to_f16(ref[i]);
    uint32_t bits;
    memcpy(&bits, &ref[i], 4);
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even */
    bf16[i] = (uint16_t)(bits >> 16);
  }
  npu_ggml_q8_0_from_f32(ref, q8, N / NPU_Q8_0_BLOCK);
  struct npu_gguf_writer *w = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  const uint64_t ne[2] = {256, N / 256};
  npu_gguf_writer_add_tensor(w, "f32", NPU_GGML_F32, 2, ne, NULL);
  npu_gguf_writer_add_tensor(w, "f16", NPU_GGML_F16, 2, ne, NULL);
  npu_gguf_writer_add_tensor(w, "bf16", NPU_GGML_BF16, 2, ne, NULL);
  npu_gguf_writer_add_tensor(w, "q8_0", NPU_GGML_Q8_0, 2, ne, NULL);
  npu_gguf_writer_add_tensor(w, "iq2_xxs", 16 /* IQ2_XXS: not read */, 2, ne, NULL);
  assert_int_equal(npu_gguf_writer_tensor_nbytes(w, 3), N / 32 * 34);
  assert_int_equal(npu_gguf_writer_tensor_nbytes(w, 4), N / 256 * 66);
  npu_gguf_writer_write_tensor(w, 0, ref, &err);
  npu_gguf_writer_write_tensor(w, 1, f16, &err);
  npu_gguf_writer_write_tensor(w, 2, bf16, &err);
  npu_gguf_writer_write_tensor(w, 3, q8, &err);
  uint8_t *iq2 = calloc(N / 256, 66);
  assert_non_null(iq2);
  npu_gguf_writer_write_tensor(w, 4, iq2, &err);
  free(iq2);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  void *data;
  size_t size;
  assert_int_equal(npu_gguf_writer_take_memory(w, &data, &size, &err), NPULM_OK);
  npu_gguf_writer_free(w);
  struct npu_gguf *g = NULL;
  assert_int_equal(npu_gguf_open_memory(data, size, &g, &err), NPULM_OK);

  assert_int_equal(npu_gguf_tensor_to_f32(npu_gguf_find_tensor(g, "f32"), out, &err), NPULM_OK);
  assert_memory_equal(out, ref, N * sizeof(float));
  assert_int_equal(npu_gguf_tensor_to_f32(npu_gguf_find_tensor(g, "f16"), out, &err), NPULM_OK);
  for (int i = 0; i < N; i++)
    assert_true(fabsf(out[i] - ref[i]) <= fabsf(ref[i]) * 0x1p-11f + 0x1p-24f);
  assert_int_equal(npu_gguf_tensor_to_f32(npu_gguf_find_tensor(g, "bf16"), out, &err), NPULM_OK);
  for (int i = 0; i < N; i++) assert_true(fabsf(out[i] - ref[i]) <= fabsf(ref[i]) * 0x1p-8f);
  assert_int_equal(npu_gguf_tensor_to_f32(npu_gguf_find_tensor(g, "q8_0"), out, &err), NPULM_OK);
  for (int b = 0; b < N / 32; b++) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(ref[b * 32 + j]));
    float d = amax / 127.0f;
    for (int j = 0; j < 32; j++) {
      float e = fabsf(out[b * 32 + j] - ref[b * 32 + j]);
      if (e > 0.57f * d + 1e-7f)
        fail_msg("q8_0 error %g > %g at %d", (double)e, (double)d, b * 32 + j);
    }
  }
  const struct npu_gguf_tensor *iq2t = npu_gguf_find_tensor(g, "iq2_xxs");
  assert_non_null(iq2t);
  assert_string_equal(npu_ggml_type_name(iq2t->type), "IQ2_XXS");
  memset(err.msg, 0, sizeof(err.msg));
  assert_int_equal(npu_gguf_tensor_to_f32(iq2t, out, &err), NPULM_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "IQ2_XXS"));
  assert_non_null(strstr(err.msg, "'iq2_xxs'"));
  npu_gguf_close(g);
  free(data);
  free(ref);
  free(out);
  free(f16);
  free(bf16);
  free(q8);
}

/* ---- Writer errors and files ---------------------------------------------------------------- */

static void test_writer_errors(void **state) {
  (void)state;
  npulm_error err = {{0}};
  struct npu_gguf_writer *w = NULL;
  const uint64_t ne[1] = {32}, bad_ne[1] = {33}, zero_ne[1] = {0};

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_add_u32(w, "k", 1), NPULM_OK);
  assert_int_equal(npu_gguf_writer_add_str(w, "k", "again"), NPULM_ERR_ARG);
  assert_int_equal(npu_gguf_writer_status(w, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "'k'"));
  memset(err.msg, 0, sizeof(err.msg));
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_ERR_ARG); /* the first error sticks */
  assert_non_null(strstr(err.msg, "duplicate metadata key 'k'"));
  npu_gguf_writer_free(w);

  struct {
    const char *what;
    uint32_t type;
    const uint64_t *ne;
    uint32_t n_dims;
  } bad[] = {{"Q8_0 row of 33", NPU_GGML_Q8_0, bad_ne, 1},
             {"zero dim", NPU_GGML_F32, zero_ne, 1},
             {"five dims", NPU_GGML_F32, ne, 5},
             {"type 4", 4, ne, 1}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
    assert_int_equal(
        npu_gguf_writer_add_tensor(w, "t", bad[i].type, bad[i].n_dims, bad[i].ne, NULL),
        NPULM_ERR_ARG);
    npu_gguf_writer_free(w);
  }

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_add_u32(w, "general.alignment", 48), NPULM_ERR_ARG);
  npu_gguf_writer_free(w);

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL);
  assert_int_equal(npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL), NPULM_ERR_ARG);
  npu_gguf_writer_free(w);

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL);
  assert_int_equal(npu_gguf_writer_add_u32(w, "general.alignment", 64), NPULM_ERR_ARG);
  npu_gguf_writer_free(w);

  /* Data: too much, missing, out of order, after finish. */
  float data[40] = {0};
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL);
  assert_int_equal(npu_gguf_writer_write_data(w, data, sizeof(data), &err), NPULM_ERR_ARG);
  assert_true(strlen(err.msg) > 0);
  npu_gguf_writer_free(w);

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL);
  npu_gguf_writer_add_tensor(w, "u", NPU_GGML_F32, 1, ne, NULL);
  assert_int_equal(npu_gguf_writer_write_tensor(w, 1, data, &err), NPULM_ERR_ARG);
  npu_gguf_writer_free(w);

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL);
  npu_gguf_writer_add_tensor(w, "u", NPU_GGML_F32, 1, ne, NULL);
  assert_int_equal(npu_gguf_writer_write_tensor(w, 0, data, &err), NPULM_OK);
  assert_int_equal(npu_gguf_writer_add_u32(w, "late", 1), NPULM_ERR_ARG);
  npu_gguf_writer_free(w);

  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "t", NPU_GGML_F32, 1, ne, NULL);
  npu_gguf_writer_add_tensor(w, "u", NPU_GGML_F32, 1, ne, NULL);
  npu_gguf_writer_write_tensor(w, 0, data, &err);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "'u'"));
  void *mem;
  size_t size;
  assert_int_equal(npu_gguf_writer_take_memory(w, &mem, &size, &err), NPULM_ERR_ARG);
  assert_null(mem);
  npu_gguf_writer_free(w);
}

static const char *tmp_dir(void) {
  const char *d = getenv("TMPDIR");
  return d != NULL && d[0] != '\0' ? d : "/tmp";
}

static void test_writer_files(void **state) {
  (void)state;
  npulm_error err = {{0}};
  struct npu_gguf_writer *w = NULL;
  char path[512];
  snprintf(path, sizeof(path), "%s/npulm-test-gguf-%ld.gguf", tmp_dir(), (long)getpid());

  /* A file round trip. */
  assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
  npu_gguf_writer_add_str(w, "general.name", "file test");
  const uint64_t ne[2] = {32, 3};
  float x[96];
  for (int i = 0; i < 96; i++) x[i] = (float)i;
  npu_gguf_writer_add_tensor(w, "x", NPU_GGML_F32, 2, ne, NULL);
  npu_gguf_writer_write_tensor(w, 0, x, &err);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  npu_gguf_writer_free(w);
  struct npu_gguf *g = NULL;
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  struct npu_gguf_str s;
  assert_int_equal(npu_gguf_get_str(g, "general.name", &s, &err), NPULM_OK);
  assert_true(npu_gguf_str_eq(s, "file test"));
  assert_memory_equal(npu_gguf_find_tensor(g, "x")->data, x, sizeof(x));
  npu_gguf_close(g);

  /* An unfinished writer leaves the file as it was (test_writer_atomic checks more). */
  size_t before_size, after_size;
  uint8_t *before = test_read_file(path, &before_size);
  assert_int_equal(npu_gguf_writer_open_file(path, &w, &err), NPULM_OK);
  npu_gguf_writer_add_tensor(w, "x", NPU_GGML_F32, 2, ne, NULL);
  npu_gguf_writer_write_data(w, x, 10, &err);
  npu_gguf_writer_free(w);
  uint8_t *after = test_read_file(path, &after_size);
  assert_int_equal(after_size, before_size);
  assert_memory_equal(after, before, before_size);
  free(before);
  free(after);
  unlink(path);

  /* Reading a file that is not there, or is too short, or is a directory. */
  memset(err.msg, 0, sizeof(err.msg));
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_ERR_IO);
  assert_null(g);
  assert_non_null(strstr(err.msg, path));
  assert_int_not_equal(npu_gguf_open(tmp_dir(), &g, &err), NPULM_OK);
  assert_true(strlen(err.msg) > 0);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fwrite("GGU", 1, 3, f);
  fclose(f);
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_ERR_FORMAT);
  unlink(path);

  /* Creating a file in a directory that does not exist. */
  char bad[600];
  snprintf(bad, sizeof(bad), "%s/npulm-no-such-dir-%ld/x.gguf", tmp_dir(), (long)getpid());
  memset(err.msg, 0, sizeof(err.msg));
  assert_int_equal(npu_gguf_writer_open_file(bad, &w, &err), NPULM_ERR_IO);
  assert_null(w);
  assert_non_null(strstr(err.msg, bad));

  /* A device that refuses writes: the failure surfaces by finish, naming the path. */
  struct stat sb;
  if (stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode)) {
    assert_int_equal(npu_gguf_writer_open_file("/dev/full", &w, &err), NPULM_OK);
    const uint64_t big[1] = {1 << 20};
    npu_gguf_writer_add_tensor(w, "x", NPU_GGML_F32, 1, big, NULL);
    float *zeros = calloc(1 << 20, sizeof(float));
    assert_non_null(zeros);
    npulm_status st = npu_gguf_writer_write_tensor(w, 0, zeros, &err);
    if (st == NPULM_OK) st = npu_gguf_writer_finish(w, &err);
    free(zeros);
    assert_int_equal(st, NPULM_ERR_IO);
    assert_non_null(strstr(err.msg, "/dev/full"));
    npu_gguf_writer_free(w);
    assert_int_equal(stat("/dev/full", &sb), 0); /* never unlinks what it did not create */
  }
}

/* ---- Whole or nothing ------------------------------------------------------------------------ */

/* A fresh folder for one test's files (remove with rm_dir). */
static char *make_dir(void) {
  char *dir = malloc(512);
  assert_non_null(dir);
  snprintf(dir, 512, "%s/npulm-test-atomic-XXXXXX", tmp_dir());
  assert_non_null(mkdtemp(dir));
  return dir;
}

/* The number of entries in 'dir' besides . and .. */
static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  }
  closedir(d);
  return n;
}

/* Write a GGUF of one F32 tensor of 'n' copies of 'v' to 'path'; return the status. */
static npulm_status write_filled(const char *path, uint64_t n, float v, npulm_error *err) {
  struct npu_gguf_writer *w = NULL;
  npulm_status st = npu_gguf_writer_open_file(path, &w, err);
  if (st != NPULM_OK) return st;
  npu_gguf_writer_add_tensor(w, "x", NPU_GGML_F32, 1, &n, NULL);
  float chunk[1024];
  for (int i = 0; i < 1024; i++) chunk[i] = v;
  for (uint64_t done = 0; done < n && st == NPULM_OK; done += 1024) {
    st = npu_gguf_writer_write_data(w, chunk, (size_t)(n - done < 1024 ? n - done : 1024) * 4, err);
  }
  if (st == NPULM_OK) st = npu_gguf_writer_finish(w, err);
  npu_gguf_writer_free(w);
  return st;
}

/* The first value of the tensor of a file write_filled made. */
static float filled_value(const char *path) {
  struct npu_gguf *g = NULL;
  npulm_error err = {{0}};
  assert_int_equal(npu_gguf_open(path, &g, &err), NPULM_OK);
  float v;
  memcpy(&v, g->tensors[0].data, sizeof(v));
  npu_gguf_close(g);
  return v;
}

/* A file is replaced whole or not at all: by a finished writer, through a link, and never by a
 * writer that fails (a file size limit: EFBIG, as a full disk gives ENOSPC) or whose process is
 * killed midway (the same limit's SIGXFSZ); neither leaves a temporary file behind. */
static void test_writer_atomic(void **state) {
  (void)state;
  npulm_error err = {{0}};
  char *dir = make_dir();
  char path[600], link[600];
  snprintf(path, sizeof(path), "%s/m.gguf", dir);
  snprintf(link, sizeof(link), "%s/link.gguf", dir);
  assert_int_equal(write_filled(path, 1000, 1.0f, &err), NPULM_OK);
  assert_true(filled_value(path) == 1.0f);
  assert_int_equal(write_filled(path, 1000, 2.0f, &err), NPULM_OK);
  assert_true(filled_value(path) == 2.0f);
  assert_int_equal(dir_entries(dir), 1);

  /* through a link: the file it points to is replaced, the link stays */
  assert_int_equal(symlink("m.gguf", link), 0);
  assert_int_equal(write_filled(link, 1000, 3.0f, &err), NPULM_OK);
  struct stat sb;
  assert_int_equal(lstat(link, &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_true(filled_value(path) == 3.0f);
  assert_int_equal(unlink(link), 0);

  /* a write that fails: one error naming the file; the old file intact, nothing else left */
  struct rlimit old_limit, limit;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  limit = old_limit;
  limit.rlim_cur = 64 << 10;
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &limit), 0);
  npulm_status st = write_filled(path, 1 << 20, 4.0f, &err);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);
  assert_int_equal(st, NPULM_ERR_IO);
  assert_non_null(strstr(err.msg, "m.gguf"));
  assert_true(filled_value(path) == 3.0f);
  assert_int_equal(dir_entries(dir), 1);

  /* killed midway, over the old file and as a new one */
  const char *targets[2] = {path, "new.gguf"};
  for (int i = 0; i < 2; i++) {
    char target[600];
    snprintf(target, sizeof(target), "%s/%s", dir, i == 0 ? "m.gguf" : targets[i]);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      struct rlimit no_core = {0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      signal(SIGXFSZ, SIG_DFL);
      setrlimit(RLIMIT_FSIZE, &limit);
      write_filled(target, 1 << 20, 5.0f, &err);
      _exit(0); /* not reached: the limit's signal ends the process */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ);
    assert_true(filled_value(path) == 3.0f);
    assert_int_equal(dir_entries(dir), 1);
  }
  unlink(path);
  assert_int_equal(rmdir(dir), 0);
  free(dir);
}

/* Checksums cover every byte: each region's stored value is XXH3-64 of its bytes as documented
 * (the header's with the stored values read as zero), a flip of any one byte of the file makes
 * it fail to parse or fails the checksum of the region that holds the byte, and resealing makes
 * the flipped file whole again. */
static void test_writer_checksums(void **state) {
  (void)state;
  npulm_error err = {{0}};
  struct npu_gguf_writer *w = NULL;
  assert_int_equal(npu_gguf_writer_open_memory(&w, &err), NPULM_OK);
  npu_gguf_writer_add_str(w, "general.name", "checksums");
  assert_int_equal(npu_gguf_writer_add_checksums(w, "x.sums"), NPULM_OK);
  npu_gguf_writer_add_u32(w, "x.after", 7); /* keys after the call still precede the checksums */
  const uint64_t ne_a[1] = {3}, ne_b[2] = {16, 5};
  npu_gguf_writer_add_tensor(w, "a", NPU_GGML_F32, 1, ne_a, NULL);
  npu_gguf_writer_add_tensor(w, "b", NPU_GGML_F32, 2, ne_b, NULL);
  float a[3] = {1, 2, 3}, b[80];
  for (int i = 0; i < 80; i++) b[i] = (float)i * 0.25f;
  assert_int_equal(npu_gguf_writer_file_size(w) % 32, 0);
  const uint64_t declared = npu_gguf_writer_file_size(w);
  npu_gguf_writer_write_tensor(w, 0, a, &err);
  npu_gguf_writer_write_tensor(w, 1, b, &err);
  assert_int_equal(npu_gguf_writer_finish(w, &err), NPULM_OK);
  void *mem;
  size_t size;
  assert_int_equal(npu_gguf_writer_take_memory(w, &mem, &size, &err), NPULM_OK);
  npu_gguf_writer_free(w);
  assert_int_equal(size, declared);
  uint8_t *image = mem;

  struct npu_gguf *g = NULL;
  struct npu_gguf_arr sums;
  assert_int_equal(npu_gguf_open_memory(image, size, &g, &err), NPULM_OK);
  assert_int_equal(npu_gguf_checksums_find(g, "x.sums", &sums, &err), NPULM_OK);
  assert_int_equal(sums.n, 3);
  /* the stored values, recomputed here from the documented layout */
  const size_t sums_at = (size_t)(sums.data - image);
  uint8_t *zeroed = malloc(size);
  assert_non_null(zeroed);
  memcpy(zeroed, image, size);
  memset(zeroed + sums_at, 0, 24);
  assert_true(npu_gguf_checksum_stored(&sums, 0) == XXH3_64bits(zeroed, g->data_offset));
  for (uint64_t r = 1; r < 3; r++) {
    uint64_t begin, end;
    npu_gguf_region_bounds(g, r, &begin, &end);
    assert_int_equal(end - begin, 32 * ((g->tensors[r - 1].nbytes + 31) / 32));
    assert_true(npu_gguf_checksum_stored(&sums, r) == XXH3_64bits(image + begin, end - begin));
  }
  free(zeroed);
  for (uint64_t r = 0; r < 3; r++) {
    assert_true(npu_gguf_checksum_compute(g, &sums, r) == npu_gguf_checksum_stored(&sums, r));
  }
  npu_gguf_close(g);

  /* every byte of the file is covered */
  for (size_t at = 0; at < size; at++) {
    uint8_t *copy = malloc(size);
    assert_non_null(copy);
    memcpy(copy, image, size);
    copy[at] ^= 0x01;
    bool caught = true;
    if (npu_gguf_open_memory(copy, size, &g, &err) == NPULM_OK) {
      if (npu_gguf_checksums_find(g, "x.sums", &sums, &err) == NPULM_OK) {
        caught = false;
        for (uint64_t r = 0; r < sums.n; r++) {
          uint64_t begin, end;
          npu_gguf_region_bounds(g, r, &begin, &end);
          bool mismatch =
              npu_gguf_checksum_compute(g, &sums, r) != npu_gguf_checksum_stored(&sums, r);
          caught = caught || mismatch;
          /* outside the stored values, exactly the region holding the byte fails */
          if (at < sums_at || at >= sums_at + 24)
            assert_true(mismatch == (at >= begin && at < end));
        }
      }
      npu_gguf_close(g);
    }
    if (!caught) fail_msg("a flip of byte %zu of %zu went unnoticed", at, size);
    /* resealed, the flipped file checks out again (where it still parses) */
    if (npu_gguf_checksums_reseal(copy, size, "x.sums", &err) == NPULM_OK) {
      assert_int_equal(npu_gguf_open_memory(copy, size, &g, &err), NPULM_OK);
      assert_int_equal(npu_gguf_checksums_find(g, "x.sums", &sums, &err), NPULM_OK);
      for (uint64_t r = 0; r < sums.n; r++) {
        assert_true(npu_gguf_checksum_compute(g, &sums, r) == npu_gguf_checksum_stored(&sums, r));
      }
      npu_gguf_close(g);
    }
    free(copy);
  }

  /* bytes appended or cut: the regions no longer cover the file exactly */
  uint8_t *longer = calloc(size + 32, 1);
  assert_non_null(longer);
  memcpy(longer, image, size);
  assert_int_equal(npu_gguf_open_memory(longer, size + 32, &g, &err), NPULM_OK);
  assert_int_equal(npu_gguf_checksums_find(g, "x.sums", &sums, &err), NPULM_ERR_FORMAT);
  assert_non_null(strstr(err.msg, "appended"));
  npu_gguf_close(g);
  free(longer);
  free(image);
}

/* ---- Hostile files -------------------------------------------------------------------------- */

static void test_every_prefix(void **state) {
  (void)state;
  void *data;
  size_t size, end;
  small_valid_file(&data, &size, &end);
  for (size_t len = 0; len < end; len++) expect_fail(data, len, NULL);
  for (size_t len = end; len <= size; len++) {
    struct npu_gguf *g = NULL;
    npulm_error err = {{0}};
    uint8_t *copy = malloc(len);
    assert_non_null(copy);
    memcpy(copy, data, len);
    assert_int_equal(npu_gguf_open_memory(copy, len, &g, &err), NPULM_OK);
    touch_everything(g);
    npu_gguf_close(g);
    free(copy);
  }
  free(data);
}

/* Random byte corruption of a valid file: accepted or rejected, never a crash or a leak. */
static void test_random_corruption(void **state) {
  (void)state;
  void *data;
  size_t size, end;
  small_valid_file(&data, &size, &end);
  uint8_t *copy = malloc(size);
  assert_non_null(copy);
  uint64_t rs = 1234;
  for (int iter = 0; iter < 20000; iter++) {
    memcpy(copy, data, size);
    int flips = 1 + (int)(test_rand(&rs) % 4);
    for (int k = 0; k < flips; k++) {
      size_t pos = (size_t)(test_rand(&rs) % size);
      uint64_t r = test_rand(&rs);
      copy[pos] = (r & 1) ? (uint8_t)(r >> 8) : (uint8_t)(copy[pos] ^ (1u << ((r >> 8) % 8)));
    }
    struct npu_gguf *g = NULL;
    npulm_error err = {{0}};
    if (npu_gguf_open_memory(copy, size, &g, &err) == NPULM_OK) {
      touch_everything(g);
      npu_gguf_close(g);
    } else {
      assert_null(g);
      assert_true(strlen(err.msg) > 0);
    }
  }
  free(copy);
  free(data);
}

static void test_bad_magic_and_version(void **state) {
  (void)state;
  void *data;
  size_t size, end;
  small_valid_file(&data, &size, &end);
  uint8_t *p = data;
  p[0] = 'X';
  expect_fail(data, size, "magic");
  p[0] = 'G';
  const uint32_t versions[] = {0, 1, 4, 0x03000000u /* big-endian v3 */, 0xFFFFFFFFu};
  for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
    memcpy(p + 4, &versions[i], 4);
    expect_fail(data, size, i == 2 ? "4" : NULL);
  }
  free(data);
  expect_fail("", 0, NULL);
  expect_fail("GGUF", 4, NULL);
}

static void test_absurd_counts(void **state) {
  (void)state;
  const uint64_t counts[] = {UINT64_MAX, 1ull << 63, 1ull << 40, 0x0FFFFFFFFFFFFFFFull, 3};
  for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
    struct npu_gguf_buf b = {0};
    put_header(&b, 3, 0, counts[i]); /* claims many key-values, has two */
    put_kv_u32(&b, "a.b", 1);
    put_kv_u32(&b, "a.c", 2);
    expect_fail_buf(&b, NULL);
    put_header(&b, 3, counts[i], 0); /* claims many tensors, has one */
    const uint64_t ne[1] = {8};
    put_tinfo(&b, "t", 1, ne, NPU_GGML_F32, 0);
    pad_to(&b, 32);
    npu_gguf_buf_put_zeros(&b, 32);
    expect_fail_buf(&b, NULL);
  }
}

static void test_absurd_strings(void **state) {
  (void)state;
  const uint64_t lens[] = {UINT64_MAX, 1ull << 63, (1ull << 32) + 3, 1000};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    struct npu_gguf_buf b = {0};
    put_header(&b, 3, 0, 1); /* key length */
    npu_gguf_buf_put_u64(&b, lens[i]);
    npu_gguf_buf_put(&b, "abcdefgh", 8);
    npu_gguf_buf_put_zeros(&b, 64);
    expect_fail_buf(&b, NULL);
    put_header(&b, 3, 0, 1); /* string value length */
    npu_gguf_buf_put_str(&b, "k.s");
    npu_gguf_buf_put_u32(&b, NPU_GGUF_STR);
    npu_gguf_buf_put_u64(&b, lens[i]);
    npu_gguf_buf_put_zeros(&b, 64);
    expect_fail_buf(&b, "k.s");
    put_header(&b, 3, 1, 0); /* tensor name length */
    npu_gguf_buf_put_u64(&b, lens[i]);
    npu_gguf_buf_put_zeros(&b, 64);
    expect_fail_buf(&b, NULL);
    put_header(&b, 3, 0, 1); /* a string inside an array */
    npu_gguf_buf_put_str(&b, "k.arr");
    npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
    npu_gguf_buf_put_u32(&b, NPU_GGUF_STR);
    npu_gguf_buf_put_u64(&b, 2);
    npu_gguf_buf_put_str(&b, "ok");
    npu_gguf_buf_put_u64(&b, lens[i]);
    npu_gguf_buf_put_zeros(&b, 64);
    expect_fail_buf(&b, "k.arr");
  }
  /* Empty and over-long keys, and an empty tensor name. */
  struct npu_gguf_buf b = {0};
  put_header(&b, 3, 0, 1);
  put_kv_u32(&b, "", 1);
  expect_fail_buf(&b, NULL);
  char *longkey = malloc(70000);
  assert_non_null(longkey);
  memset(longkey, 'k', 69999);
  longkey[69999] = '\0';
  put_header(&b, 3, 0, 1);
  put_kv_u32(&b, longkey, 1);
  free(longkey);
  expect_fail_buf(&b, NULL);
  const uint64_t ne[1] = {8};
  put_header(&b, 3, 1, 0);
  put_tinfo(&b, "", 1, ne, NPU_GGML_F32, 0);
  pad_to(&b, 32);
  npu_gguf_buf_put_zeros(&b, 32);
  expect_fail_buf(&b, NULL);
}

static void test_array_counts(void **state) {
  (void)state;
  /* Counts whose byte size overflows 64 bits (n * 8 wraps to 0 or to a small number). */
  const struct {
    uint32_t type;
    uint64_t n;
  } cases[] = {
      {NPU_GGUF_U64, 1ull << 61}, {NPU_GGUF_U64, (1ull << 61) + 1},
      {NPU_GGUF_F64, UINT64_MAX}, {NPU_GGUF_U32, 1ull << 62},
      {NPU_GGUF_U16, 1ull << 63}, {NPU_GGUF_U8, UINT64_MAX},
      {NPU_GGUF_STR, UINT64_MAX}, {NPU_GGUF_STR, 1ull << 61},
      {NPU_GGUF_ARR, UINT64_MAX}, {NPU_GGUF_ARR, 0x1555555555555556ull /* * 12 wraps */},
      {NPU_GGUF_U8, 17},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct npu_gguf_buf b = {0};
    put_header(&b, 3, 0, 1);
    npu_gguf_buf_put_str(&b, "k.arr");
    npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
    npu_gguf_buf_put_u32(&b, cases[i].type);
    npu_gguf_buf_put_u64(&b, cases[i].n);
    npu_gguf_buf_put_zeros(&b, 16);
    expect_fail_buf(&b, "k.arr");
  }
  /* An inner array whose count overflows. */
  struct npu_gguf_buf b = {0};
  put_header(&b, 3, 0, 1);
  npu_gguf_buf_put_str(&b, "k.nest");
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u64(&b, 1);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_I64);
  npu_gguf_buf_put_u64(&b, 1ull << 61);
  npu_gguf_buf_put_zeros(&b, 16);
  expect_fail_buf(&b, "k.nest");
}

/* 'depth' arrays nested in one another, the innermost an array of one u8. */
static void nested_file(struct npu_gguf_buf *b, int depth) {
  put_header(b, 3, 0, 1);
  npu_gguf_buf_put_str(b, "k.deep");
  npu_gguf_buf_put_u32(b, NPU_GGUF_ARR);
  for (int i = 1; i < depth; i++) {
    npu_gguf_buf_put_u32(b, NPU_GGUF_ARR);
    npu_gguf_buf_put_u64(b, 1);
  }
  npu_gguf_buf_put_u32(b, NPU_GGUF_U8);
  npu_gguf_buf_put_u64(b, 1);
  npu_gguf_buf_put_u8(b, 7);
}

static void test_nested_depth(void **state) {
  (void)state;
  struct npu_gguf_buf b = {0};
  nested_file(&b, 4); /* moderate nesting is valid */
  struct npu_gguf *g = expect_ok(&b);
  touch_everything(g);
  npu_gguf_close(g);
  npu_gguf_buf_free(&b);
  nested_file(&b, 64);
  expect_fail_buf(&b, "k.deep");
  nested_file(&b, 200000); /* would overflow the stack of a naive recursive parser */
  expect_fail_buf(&b, "k.deep");
}

static void test_bad_value_types(void **state) {
  (void)state;
  const uint32_t types[] = {13, 14, 255, 0x80000000u, UINT32_MAX};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    struct npu_gguf_buf b = {0};
    put_header(&b, 3, 0, 1);
    npu_gguf_buf_put_str(&b, "k.t");
    npu_gguf_buf_put_u32(&b, types[i]);
    npu_gguf_buf_put_zeros(&b, 16);
    expect_fail_buf(&b, "k.t");
    put_header(&b, 3, 0, 1); /* as an array element type */
    npu_gguf_buf_put_str(&b, "k.a");
    npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
    npu_gguf_buf_put_u32(&b, types[i]);
    npu_gguf_buf_put_u64(&b, 1);
    npu_gguf_buf_put_zeros(&b, 16);
    expect_fail_buf(&b, "k.a");
  }
  struct npu_gguf_buf b = {0}; /* a bool that is neither 0 nor 1 */
  put_header(&b, 3, 0, 1);
  npu_gguf_buf_put_str(&b, "k.b");
  npu_gguf_buf_put_u32(&b, NPU_GGUF_BOOL);
  npu_gguf_buf_put_u8(&b, 2);
  expect_fail_buf(&b, "k.b");
  put_header(&b, 3, 0, 1); /* a bool array with an element that is neither 0 nor 1 */
  npu_gguf_buf_put_str(&b, "k.ba");
  npu_gguf_buf_put_u32(&b, NPU_GGUF_ARR);
  npu_gguf_buf_put_u32(&b, NPU_GGUF_BOOL);
  npu_gguf_buf_put_u64(&b, 3);
  npu_gguf_buf_put_u8(&b, 1);
  npu_gguf_buf_put_u8(&b, 7);
  npu_gguf_buf_put_u8(&b, 0);
  expect_fail_buf(&b, "k.ba");
}

static void test_bad_shapes(void **state) {
  (void)state;
  struct npu_gguf_buf b = {0};
  const uint64_t ne4[5] = {8, 1, 1, 1, 1};
  one_tensor_file(&b, 5, ne4, NPU_GGML_F32, 0, 64);
  expect_fail_buf(&b, NULL);
  one_tensor_file(&b, UINT32_MAX, ne4, NPU_GGML_F32, 0, 64);
  expect_fail_buf(&b, NULL);
  one_tensor_file(&b, 0, ne4, NPU_GGML_F32, 0, 64);
  expect_fail_buf(&b, NULL);
  const uint64_t shapes[][4] = {
      {0, 1, 1, 1},
      {8, 0, 1, 1},
      {8, 1, 1, 0},
      {1ull << 32, 1ull << 32, 1, 1}, /* product wraps to 0 */
      {1ull << 62, 4, 1, 1},
      {UINT64_MAX, 1, 1, 1},
      {1ull << 63, 1, 1, 1},
      {1ull << 31, 1ull << 31, 1ull << 31, 1}, /* 2^93 */
      {1ull << 40, 1ull << 20, 1, 1},          /* 2^60 elements: far beyond the file */
      {(1ull << 61) + 1, 1, 1, 1},
  };
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
    one_tensor_file(&b, 4, shapes[i], NPU_GGML_F32, 0, 64);
    expect_fail_buf(&b, "'t'");
  }
  /* A Q8_0 row that is not a whole number of blocks. */
  const uint64_t odd[1] = {48};
  one_tensor_file(&b, 1, odd, NPU_GGML_Q8_0, 0, 64);
  expect_fail_buf(&b, "'t'");
}

static void test_bad_offsets(void **state) {
  (void)state;
  struct npu_gguf_buf b = {0};
  const uint64_t ne[1] = {8};                      /* 32 bytes of F32 */
  one_tensor_file(&b, 1, ne, NPU_GGML_F32, 0, 32); /* the valid baseline */
  struct npu_gguf *g = expect_ok(&b);
  npu_gguf_close(g);
  npu_gguf_buf_free(&b);
  one_tensor_file(&b, 1, ne, NPU_GGML_F32, 0, 31); /* one byte short */
  expect_fail_buf(&b, "'t'");
  one_tensor_file(&b, 1, ne, NPU_GGML_F32, 32, 32); /* starts at the end */
  expect_fail_buf(&b, "'t'");
  const uint64_t offsets[] = {1ull << 40, UINT64_MAX & ~31ull, (UINT64_MAX & ~31ull) - 32,
                              1ull << 63};
  for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); i++) {
    one_tensor_file(&b, 1, ne, NPU_GGML_F32, offsets[i], 64);
    expect_fail_buf(&b, "'t'");
  }
  const uint64_t unaligned[] = {1, 4, 16, 31};
  for (size_t i = 0; i < sizeof(unaligned) / sizeof(unaligned[0]); i++) {
    one_tensor_file(&b, 1, ne, NPU_GGML_F32, unaligned[i], 96);
    expect_fail_buf(&b, "'t'");
  }
}

static void test_duplicates(void **state) {
  (void)state;
  struct npu_gguf_buf b = {0};
  put_header(&b, 3, 0, 3);
  put_kv_u32(&b, "a.x", 1);
  put_kv_u32(&b, "a.y", 2);
  put_kv_u32(&b, "a.x", 3);
  expect_fail_buf(&b, "a.x");
  const uint64_t ne[1] = {8};
  put_header(&b, 3, 3, 0);
  put_tinfo(&b, "blk.0.w", 1, ne, NPU_GGML_F32, 0);
  put_tinfo(&b, "blk.1.w", 1, ne, NPU_GGML_F32, 32);
  put_tinfo(&b, "blk.0.w", 1, ne, NPU_GGML_F32, 64);
  pad_to(&b, 32);
  npu_gguf_buf_put_zeros(&b, 96);
  expect_fail_buf(&b, "blk.0.w");
}

static void test_bad_alignment(void **state) {
  (void)state;
  const uint32_t aligns[] = {0, 3, 48, 1000, 1u << 31, UINT32_MAX};
  for (size_t i = 0; i < sizeof(aligns) / sizeof(aligns[0]); i++) {
    struct npu_gguf_buf b = {0};
    put_header(&b, 3, 0, 1);
    put_kv_u32(&b, "general.alignment", aligns[i]);
    expect_fail_buf(&b, "alignment");
  }
  struct npu_gguf_buf b = {0}; /* the right value with the wrong type */
  put_header(&b, 3, 0, 1);
  npu_gguf_buf_put_str(&b, "general.alignment");
  npu_gguf_buf_put_u32(&b, NPU_GGUF_U64);
  npu_gguf_buf_put_u64(&b, 32);
  expect_fail_buf(&b, "alignment");
}

static void test_bad_tensor_types(void **state) {
  (void)state;
  const uint32_t types[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 1000, UINT32_MAX};
  const uint64_t ne[1] = {256};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    struct npu_gguf_buf b = {0};
    one_tensor_file(&b, 1, ne, types[i], 0, 2048);
    expect_fail_buf(&b, "'t'");
  }
  /* Known but unsupported types parse; converting them names the type. */
  const struct {
    uint32_t id;
    const char *name;
  } known[] = {{9, "Q8_1"}, {15, "Q8_K"}, {16, "IQ2_XXS"}, {19, "IQ1_S"},
               {24, "I8"},  {28, "F64"},  {29, "IQ1_M"},   {39, "MXFP4"}};
  for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
    struct npu_gguf_buf b = {0};
    one_tensor_file(&b, 1, ne, known[i].id, 0, 2048);
    struct npu_gguf *g = expect_ok(&b);
    float out[256];
    npulm_error err = {{0}};
    assert_int_equal(npu_gguf_tensor_to_f32(&g->tensors[0], out, &err), NPULM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, known[i].name));
    npu_gguf_close(g);
    npu_gguf_buf_free(&b);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_every_type),
      cmocka_unit_test(test_versions_2_and_3),
      cmocka_unit_test(test_tensor_layout),
      cmocka_unit_test(test_f16_conversions),
      cmocka_unit_test(test_q8_0_quantize),
      cmocka_unit_test(test_tensor_to_f32_accuracy),
      cmocka_unit_test(test_writer_errors),
      cmocka_unit_test(test_writer_files),
      cmocka_unit_test(test_writer_atomic),
      cmocka_unit_test(test_writer_checksums),
      cmocka_unit_test(test_every_prefix),
      cmocka_unit_test(test_random_corruption),
      cmocka_unit_test(test_bad_magic_and_version),
      cmocka_unit_test(test_absurd_counts),
      cmocka_unit_test(test_absurd_strings),
      cmocka_unit_test(test_array_counts),
      cmocka_unit_test(test_nested_depth),
      cmocka_unit_test(test_bad_value_types),
      cmocka_unit_test(test_bad_shapes),
      cmocka_unit_test(test_bad_offsets),
      cmocka_unit_test(test_duplicates),
      cmocka_unit_test(test_bad_alignment),
      cmocka_unit_test(test_bad_tensor_types),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
