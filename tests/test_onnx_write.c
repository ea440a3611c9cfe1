/* ONNX writer tests: models built through the API are read back by a minimal protobuf decoder
 * (below) and checked field by field; one tiny model byte for byte; external data; and every
 * refusal, which must leave no file behind (and an existing one as it was). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "test_util.h"

#include "export/onnx_write.h"

/* ---- A minimal protobuf decoder ------------------------------------------------------------- */

struct span {
  const uint8_t *p;
  size_t n;
};

struct field {
  unsigned num;
  unsigned wire;
  uint64_t v;       /* a varint's value, a fixed32's bits */
  struct span data; /* a length-delimited field's bytes */
};

static uint64_t read_varint(struct span m, size_t *at) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 70; shift += 7) {
    assert_true(*at < m.n);
    uint8_t byte = m.p[(*at)++];
    v |= (uint64_t)(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return v;
  }
  fail_msg("varint longer than 10 bytes");
  return 0;
}

/* The field of 'm' at '*at', moving past it; false at the end. Fails on malformed bytes. */
static bool next_field(struct span m, size_t *at, struct field *f) {
  if (*at == m.n) return false;
  uint64_t tag = read_varint(m, at);
  *f = (struct field){.num = (unsigned)(tag >> 3), .wire = (unsigned)(tag & 7)};
  switch (f->wire) {
  case 0: f->v = read_varint(m, at); break;
  case 2:
    f->data.n = (size_t)read_varint(m, at);
    assert_true(f->data.n <= m.n - *at);
    f->data.p = m.p + *at;
    *at += f->data.n;
    break;
  case 5:
    assert_true(m.n - *at >= 4);
    for (int i = 0; i < 4; i++) f->v |= (uint64_t)m.p[*at + (size_t)i] << (8 * i);
    *at += 4;
    break;
  default: fail_msg("wire type %u", f->wire);
  }
  return true;
}

static int count_fields(struct span m, unsigned num) {
  int n = 0;
  struct field f;
  for (size_t at = 0; next_field(m, &at, &f);) n += f.num == num;
  return n;
}

/* Occurrence 'idx' of field 'num' of 'm', which must be of wire type 'wire'. */
static struct field get_field(struct span m, unsigned num, int idx, unsigned wire) {
  struct field f;
  for (size_t at = 0; next_field(m, &at, &f);) {
    if (f.num == num && idx-- == 0) {
      assert_int_equal(f.wire, wire);
      return f;
    }
  }
  fail_msg("field %u missing", num);
  return f;
}

static struct span get_msg(struct span m, unsigned num, int idx) {
  return get_field(m, num, idx, 2).data;
}

static int64_t get_int(struct span m, unsigned num, int idx) {
  return (int64_t)get_field(m, num, idx, 0).v;
}

static void assert_str_field(struct span m, unsigned num, int idx, const char *want) {
  struct span s = get_msg(m, num, idx);
  if (s.n != strlen(want) || memcmp(s.p, want, s.n) != 0) {
    fail_msg("field %u: '%.*s', expected '%s'", num, (int)s.n, (const char *)s.p, want);
  }
}

static void assert_bytes_field(struct span m, unsigned num, const void *want, size_t n) {
  struct span s = get_msg(m, num, 0);
  assert_int_equal(s.n, n);
  assert_memory_equal(s.p, want, n);
}

/* ---- Helpers -------------------------------------------------------------------------------- */

static struct span model_bytes(struct npu_onnx *o, uint8_t **owned) {
  size_t n;
  npulm_error err;
  npulm_status st = npu_onnx_write_mem(o, owned, &n, &err);
  if (st != NPULM_OK) fail_msg("%s", err.msg);
  return (struct span){*owned, n};
}

static void assert_value_info(struct span info, const char *name, int elem_type, int nd,
                              const int64_t *dims) {
  assert_str_field(info, 1, 0, name);
  struct span tensor = get_msg(get_msg(info, 2, 0), 1, 0);
  assert_int_equal(get_int(tensor, 1, 0), elem_type);
  struct span shape = get_msg(tensor, 2, 0);
  assert_int_equal(count_fields(shape, 1), nd);
  for (int d = 0; d < nd; d++) assert_int_equal(get_int(get_msg(shape, 1, d), 1, 0), dims[d]);
}

static char tmp_path_buf[256];

/* A path in the temporary folder, unique to this process and 'tag'. */
static const char *tmp_path(const char *tag) {
  const char *dir = getenv("TMPDIR");
  snprintf(tmp_path_buf, sizeof(tmp_path_buf), "%s/npulm-test-onnx-%ld-%s.onnx",
           dir != NULL && dir[0] != '\0' ? dir : "/tmp", (long)getpid(), tag);
  return tmp_path_buf;
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* ---- The model of most tests ---------------------------------------------------------------- */

static const int8_t w_bytes[12] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -128};
static const int64_t shape_values[2] = {-1, 4};
static const int64_t ints_values[4] = {-1, 0, 300, INT64_MIN};

/* The lazy initializer's bytes: int16 i * 1000 - 2000. */
static bool fill_big(void *user, void *dst) {
  int *calls = user;
  (*calls)++;
  int16_t v[5];
  for (int i = 0; i < 5; i++) v[i] = (int16_t)(i * 1000 - 2000);
  memcpy(dst, v, sizeof(v));
  return true;
}

static bool fill_fails(void *user, void *dst) {
  (void)user;
  (void)dst;
  return false;
}

static float odd_float(void) { /* a float whose bits no decimal round trip would keep by luck */
  uint32_t bits = 0x3eaaaaab;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

static struct npu_onnx *build_model(int *fill_calls) {
  struct npu_onnx *o = npu_onnx_new("net", 17);
  assert_non_null(o);
  const int64_t x_dims[2] = {2, 3}, w_dims[2] = {3, 4}, big_dims[1] = {5}, z_dims[2] = {2, 4};
  npu_onnx_doc(o, "a doc");
  npu_onnx_metadata(o, "k1", "v1");
  npu_onnx_metadata(o, "k2", "");
  npu_onnx_input(o, "x", NPU_ONNX_FLOAT, 2, x_dims);
  npu_onnx_init_copy(o, "w", NPU_ONNX_INT8, 2, w_dims, w_bytes);
  npu_onnx_init_lazy(o, "big", NPU_ONNX_INT16, 1, big_dims, fill_big, fill_calls);
  npu_onnx_init_f32(o, "scale", 0.5f);
  npu_onnx_init_i64s(o, "shape", 2, shape_values);
  const char *dq_in[2] = {"w", "scale"}, *dq_out[1] = {"wf"};
  assert_non_null(npu_onnx_node(o, "DequantizeLinear", NULL, NULL, 2, dq_in, 1, dq_out));
  const char *mm_in[2] = {"x", "wf"}, *mm_out[1] = {"y"};
  assert_non_null(npu_onnx_node(o, "MatMul", "", NULL, 2, mm_in, 1, mm_out));
  const char *c_in[3] = {"y", "", "big"}, *c_out[1] = {"z"};
  struct npu_onnx_node *n = npu_onnx_node(o, "Custom", "com.microsoft", "cust", 3, c_in, 1, c_out);
  assert_non_null(n);
  npu_onnx_attr_int(n, "i", -5);
  npu_onnx_attr_float(n, "f", odd_float());
  npu_onnx_attr_ints(n, "ints", 4, ints_values);
  npu_onnx_attr_string(n, "s", "hello");
  npu_onnx_output(o, "z", NPU_ONNX_FLOAT, 2, z_dims);
  assert_int_equal(npu_onnx_status(o, NULL), NPULM_OK);
  return o;
}

/* ---- Tests ---------------------------------------------------------------------------------- */

static void test_dtype_size(void **state) {
  (void)state;
  assert_int_equal(npu_onnx_dtype_size(NPU_ONNX_INT8), 1);
  assert_int_equal(npu_onnx_dtype_size(NPU_ONNX_INT16), 2);
  assert_int_equal(npu_onnx_dtype_size(NPU_ONNX_FLOAT), 4);
  assert_int_equal(npu_onnx_dtype_size(NPU_ONNX_INT64), 8);
  assert_int_equal(npu_onnx_dtype_size((enum npu_onnx_dtype)99), 0);
}

static void test_model_fields(void **state) {
  (void)state;
  int fill_calls = 0;
  struct npu_onnx *o = build_model(&fill_calls);
  assert_true(npu_onnx_has_value(o, "wf"));
  assert_false(npu_onnx_has_value(o, "nope"));
  uint8_t *bytes;
  struct span model = model_bytes(o, &bytes);
  assert_int_equal(fill_calls, 1);

  assert_int_equal(get_int(model, 1, 0), 8); /* ir_version */
  assert_str_field(model, 2, 0, "npulm");
  assert_str_field(model, 3, 0, npulm_version());
  assert_str_field(model, 6, 0, "a doc");
  assert_int_equal(count_fields(model, 8), 2); /* opset_import */
  assert_str_field(get_msg(model, 8, 0), 1, 0, "");
  assert_int_equal(get_int(get_msg(model, 8, 0), 2, 0), 17);
  assert_str_field(get_msg(model, 8, 1), 1, 0, "com.microsoft");
  assert_int_equal(get_int(get_msg(model, 8, 1), 2, 0), 1);
  assert_int_equal(count_fields(model, 14), 2); /* metadata_props */
  assert_str_field(get_msg(model, 14, 0), 1, 0, "k1");
  assert_str_field(get_msg(model, 14, 0), 2, 0, "v1");
  assert_str_field(get_msg(model, 14, 1), 1, 0, "k2");
  assert_str_field(get_msg(model, 14, 1), 2, 0, "");

  struct span graph = get_msg(model, 7, 0);
  assert_str_field(graph, 2, 0, "net");
  assert_int_equal(count_fields(graph, 1), 3);
  struct span dq = get_msg(graph, 1, 0);
  assert_str_field(dq, 4, 0, "DequantizeLinear");
  assert_str_field(dq, 3, 0, "n0");
  assert_int_equal(count_fields(dq, 7), 0); /* ai.onnx: no domain */
  assert_str_field(dq, 1, 0, "w");
  assert_str_field(dq, 1, 1, "scale");
  assert_str_field(dq, 2, 0, "wf");
  struct span mm = get_msg(graph, 1, 1);
  assert_str_field(mm, 3, 0, "n1");
  assert_int_equal(count_fields(mm, 7), 0);
  struct span cust = get_msg(graph, 1, 2);
  assert_str_field(cust, 4, 0, "Custom");
  assert_str_field(cust, 3, 0, "cust");
  assert_str_field(cust, 7, 0, "com.microsoft");
  assert_int_equal(count_fields(cust, 1), 3);
  assert_str_field(cust, 1, 1, ""); /* an omitted optional input */
  assert_str_field(cust, 1, 2, "big");
  assert_str_field(cust, 2, 0, "z");

  assert_int_equal(count_fields(cust, 5), 4);
  struct span a_int = get_msg(cust, 5, 0), a_float = get_msg(cust, 5, 1);
  struct span a_ints = get_msg(cust, 5, 2), a_str = get_msg(cust, 5, 3);
  assert_str_field(a_int, 1, 0, "i");
  assert_int_equal(get_int(a_int, 20, 0), 2);
  assert_int_equal(get_int(a_int, 3, 0), -5);
  assert_str_field(a_float, 1, 0, "f");
  assert_int_equal(get_int(a_float, 20, 0), 1);
  assert_int_equal(get_field(a_float, 2, 0, 5).v, 0x3eaaaaab);
  assert_str_field(a_ints, 1, 0, "ints");
  assert_int_equal(get_int(a_ints, 20, 0), 7);
  assert_int_equal(count_fields(a_ints, 8), 4);
  for (int i = 0; i < 4; i++) assert_int_equal(get_int(a_ints, 8, i), ints_values[i]);
  assert_str_field(a_str, 1, 0, "s");
  assert_int_equal(get_int(a_str, 20, 0), 3);
  assert_str_field(a_str, 4, 0, "hello");

  assert_int_equal(count_fields(graph, 5), 4);
  struct span w = get_msg(graph, 5, 0);
  assert_str_field(w, 8, 0, "w");
  assert_int_equal(get_int(w, 2, 0), NPU_ONNX_INT8);
  assert_int_equal(count_fields(w, 1), 2);
  assert_int_equal(get_int(w, 1, 0), 3);
  assert_int_equal(get_int(w, 1, 1), 4);
  assert_bytes_field(w, 9, w_bytes, sizeof(w_bytes));
  struct span big = get_msg(graph, 5, 1);
  assert_str_field(big, 8, 0, "big");
  assert_int_equal(get_int(big, 2, 0), NPU_ONNX_INT16);
  const uint8_t big_bytes[10] = {0x30, 0xf8, 0x18, 0xfc, 0, 0, 0xe8, 0x03, 0xd0, 0x07};
  assert_bytes_field(big, 9, big_bytes, sizeof(big_bytes));
  struct span scale = get_msg(graph, 5, 2);
  assert_int_equal(count_fields(scale, 1), 0); /* a scalar */
  assert_int_equal(get_int(scale, 2, 0), NPU_ONNX_FLOAT);
  const uint8_t half[4] = {0, 0, 0, 0x3f};
  assert_bytes_field(scale, 9, half, sizeof(half));
  struct span shape = get_msg(graph, 5, 3);
  assert_int_equal(get_int(shape, 1, 0), 2);
  assert_int_equal(get_int(shape, 2, 0), NPU_ONNX_INT64);
  assert_bytes_field(shape, 9, shape_values, sizeof(shape_values)); /* little-endian host */

  const int64_t x_dims[2] = {2, 3}, z_dims[2] = {2, 4};
  assert_int_equal(count_fields(graph, 11), 1);
  assert_value_info(get_msg(graph, 11, 0), "x", NPU_ONNX_FLOAT, 2, x_dims);
  assert_int_equal(count_fields(graph, 12), 1);
  assert_value_info(get_msg(graph, 12, 0), "z", NPU_ONNX_FLOAT, 2, z_dims);
  free(bytes);
  npu_onnx_free(o);
}

/* One Identity node, byte for byte. */
static void test_golden_identity(void **state) {
  (void)state;
  struct npu_onnx *o = npu_onnx_new("g", 17);
  assert_non_null(o);
  const int64_t one[1] = {1};
  npu_onnx_input(o, "x", NPU_ONNX_FLOAT, 1, one);
  const char *in[1] = {"x"}, *out[1] = {"y"};
  assert_non_null(npu_onnx_node(o, "Identity", NULL, NULL, 1, in, 1, out));
  npu_onnx_output(o, "y", NPU_ONNX_FLOAT, 1, one);

  const char *version = npulm_version();
  size_t version_len = strlen(version);
  assert_true(version_len < 128); /* its length one byte */
  uint8_t want[256];
  size_t n = 0;
  const uint8_t head[] = {0x08, 0x08,                           /* ir_version 8 */
                          0x12, 0x05, 'n', 'p', 'u', 'l', 'm'}; /* producer_name */
  memcpy(want + n, head, sizeof(head));
  n += sizeof(head);
  want[n++] = 0x1a; /* producer_version */
  want[n++] = (uint8_t)version_len;
  memcpy(want + n, version, version_len);
  n += version_len;
  const uint8_t rest[] = {
      0x3a, 59, /* graph, 59 bytes */
      0x0a, 20, /* node, 20 bytes: input, output, name, op_type */
      0x0a, 1,    'x',  0x12, 1,    'y', 0x1a, 2,    'n',  '0', 0x22, 8, 'I',
      'd',  'e',  'n',  't',  'i',  't', 'y',  0x12, 1,    'g',          /* graph name */
      0x5a, 15,   0x0a, 1,    'x',                                       /* input: name */
      0x12, 10,   0x0a, 8,    0x08, 1,   0x12, 4,    0x0a, 2,   0x08, 1, /* tensor(float), shape [1]
                                                                          */
      0x62, 15,   0x0a, 1,    'y',                                       /* output */
      0x12, 10,   0x0a, 8,    0x08, 1,   0x12, 4,    0x0a, 2,   0x08, 1, 0x42,
      4,    0x0a, 0,    0x10, 17, /* opset_import: "" version 17 */
  };
  memcpy(want + n, rest, sizeof(rest));
  n += sizeof(rest);

  uint8_t *bytes;
  struct span got = model_bytes(o, &bytes);
  assert_int_equal(got.n, n);
  assert_memory_equal(got.p, want, n);
  free(bytes);
  npu_onnx_free(o);
}

struct progress_seen {
  uint64_t done, total;
  int calls;
};

static void note_progress(void *user, uint64_t done, uint64_t total) {
  struct progress_seen *seen = user;
  assert_true(done > seen->done && done <= total);
  *seen = (struct progress_seen){done, total, seen->calls + 1};
}

/* A file written with the initializers inside holds write_mem's bytes. */
static void test_file_equals_memory(void **state) {
  (void)state;
  int fill_calls = 0;
  struct npu_onnx *o = build_model(&fill_calls);
  uint8_t *bytes;
  struct span mem = model_bytes(o, &bytes);
  const char *path = tmp_path("inside");
  struct progress_seen seen = {0};
  struct npu_onnx_write_options opts = {.progress = note_progress, .progress_user = &seen};
  bool external = true;
  npulm_error err;
  npulm_status st = npu_onnx_write(o, path, &opts, &external, &err);
  if (st != NPULM_OK) fail_msg("%s", err.msg);
  assert_false(external);
  assert_int_equal(seen.calls, 4);
  assert_int_equal(seen.done, 12 + 10 + 4 + 16);
  assert_int_equal(seen.total, seen.done);
  size_t n;
  uint8_t *file = test_read_file(path, &n);
  assert_int_equal(n, mem.n);
  assert_memory_equal(file, mem.p, n);
  unlink(path);
  free(file);
  free(bytes);
  npu_onnx_free(o);
}

static void test_external_data(void **state) {
  (void)state;
  int fill_calls = 0;
  struct npu_onnx *o = build_model(&fill_calls);
  /* one initializer of 1 KiB or more, which goes to the data file; the others stay inside */
  enum { BIG = 1536 };
  int8_t big_bytes[BIG];
  for (int i = 0; i < BIG; i++) big_bytes[i] = (int8_t)(i * 7);
  npu_onnx_init_copy(o, "large", NPU_ONNX_INT8, 1, (const int64_t[]){BIG}, big_bytes);
  char path[256], data_path[300];
  snprintf(path, sizeof(path), "%s", tmp_path("external"));
  snprintf(data_path, sizeof(data_path), "%s.data", path);
  const char *data_name = strrchr(data_path, '/') + 1;
  struct npu_onnx_write_options opts = {.external = true, .checksum_key = "sum"};
  bool external = false;
  npulm_error err;
  npulm_status st = npu_onnx_write(o, path, &opts, &external, &err);
  if (st != NPULM_OK) fail_msg("%s", err.msg);
  assert_true(external);

  size_t model_n, data_n;
  uint8_t *model_bytes_ = test_read_file(path, &model_n);
  uint8_t *data = test_read_file(data_path, &data_n);
  struct span graph = get_msg((struct span){model_bytes_, model_n}, 7, 0);
  const int16_t shorts[5] = {-2000, -1000, 0, 1000, 2000};
  const float half = 0.5f;
  const struct {
    const void *bytes;
    size_t n;
  } want[5] = {{w_bytes, 12}, {shorts, 10}, {&half, 4}, {shape_values, 16}, {big_bytes, BIG}};
  assert_int_equal(count_fields(graph, 5), 5);
  for (int i = 0; i < 4; i++) { /* inside, as raw_data */
    struct span t = get_msg(graph, 5, i);
    assert_int_equal(count_fields(t, 13), 0);
    assert_int_equal(count_fields(t, 14), 0);
    struct span raw = get_msg(t, 9, 0);
    assert_int_equal(raw.n, want[i].n);
    assert_memory_equal(raw.p, want[i].bytes, want[i].n);
  }
  struct span t = get_msg(graph, 5, 4);
  assert_int_equal(count_fields(t, 9), 0); /* no raw_data */
  assert_int_equal(get_int(t, 14, 0), 1);  /* data_location EXTERNAL */
  assert_int_equal(count_fields(t, 13), 3);
  struct span location = get_msg(t, 13, 0), offset = get_msg(t, 13, 1), length = get_msg(t, 13, 2);
  assert_str_field(location, 1, 0, "location");
  assert_str_field(location, 2, 0, data_name);
  assert_str_field(offset, 1, 0, "offset");
  assert_str_field(length, 1, 0, "length");
  char number[32];
  snprintf(number, sizeof(number), "%d", BIG);
  assert_str_field(length, 2, 0, number);
  struct span value = get_msg(offset, 2, 0);
  snprintf(number, sizeof(number), "%.*s", (int)value.n, (const char *)value.p);
  assert_int_equal(strtoull(number, NULL, 10), 0);
  assert_int_equal(data_n, BIG);
  assert_memory_equal(data, big_bytes, BIG);
  /* the digest of every initializer's bytes, inside or not, appended as the last metadata entry */
  XXH3_state_t *sum = XXH3_createState();
  assert_non_null(sum);
  XXH3_64bits_reset(sum);
  for (int i = 0; i < 5; i++) {
    const uint64_t d = XXH3_64bits(want[i].bytes, want[i].n);
    uint8_t le[8];
    for (int b = 0; b < 8; b++) le[b] = (uint8_t)(d >> (8 * b));
    XXH3_64bits_update(sum, le, sizeof(le));
  }
  char hex[17];
  snprintf(hex, sizeof(hex), "%016" PRIx64, XXH3_64bits_digest(sum));
  XXH3_freeState(sum);
  struct span model = {model_bytes_, model_n};
  const int n_meta = count_fields(model, 14);
  assert_true(n_meta >= 1);
  struct span last = get_msg(model, 14, n_meta - 1);
  assert_str_field(last, 1, 0, "sum");
  assert_str_field(last, 2, 0, hex);
  char again[17];
  snprintf(again, sizeof(again), "%016" PRIx64, npu_onnx_initializers_digest(o));
  assert_string_equal(again, hex);
  unlink(path);
  unlink(data_path);
  free(model_bytes_);
  free(data);
  npu_onnx_free(o);
}

/* Writing a refused model fails with a message holding 'want', leaving no file, and an existing
 * file as it was. */
static void expect_refused(struct npu_onnx *o, const char *want) {
  uint8_t *bytes = (uint8_t *)1;
  size_t n = 1;
  npulm_error err = {{0}};
  assert_int_equal(npu_onnx_write_mem(o, &bytes, &n, &err), NPULM_ERR_ARG);
  assert_null(bytes);
  assert_int_equal(n, 0);
  if (strstr(err.msg, want) == NULL) fail_msg("'%s' does not mention '%s'", err.msg, want);
  assert_null(strchr(err.msg, '\n'));

  const char *path = tmp_path("refused");
  char data_path[300];
  snprintf(data_path, sizeof(data_path), "%s.data", path);
  unlink(path);
  struct npu_onnx_write_options opts = {.external = true};
  for (int external = 0; external < 2; external++) {
    err.msg[0] = '\0';
    assert_int_not_equal(npu_onnx_write(o, path, external ? &opts : NULL, NULL, &err), NPULM_OK);
    assert_non_null(strstr(err.msg, want));
    assert_false(file_exists(path));
    assert_false(file_exists(data_path));
  }
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs("old", f);
  fclose(f);
  assert_int_not_equal(npu_onnx_write(o, path, NULL, NULL, &err), NPULM_OK);
  size_t old_n;
  uint8_t *old = test_read_file(path, &old_n);
  assert_int_equal(old_n, 3);
  assert_memory_equal(old, "old", 3);
  free(old);
  unlink(path);
}

/* A model with graph input "x" (float [1]). */
static struct npu_onnx *small_model(void) {
  struct npu_onnx *o = npu_onnx_new("g", 17);
  assert_non_null(o);
  const int64_t one[1] = {1};
  npu_onnx_input(o, "x", NPU_ONNX_FLOAT, 1, one);
  return o;
}

static void test_refuse_undefined_input(void **state) {
  (void)state;
  struct npu_onnx *o = small_model();
  const char *in[2] = {"x", "later"}, *out[1] = {"y"};
  assert_null(npu_onnx_node(o, "Add", NULL, NULL, 2, in, 1, out));
  assert_false(npu_onnx_has_value(o, "y"));
  npulm_error err;
  assert_int_equal(npu_onnx_status(o, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "'later'"));
  expect_refused(o, "'later'");
  npu_onnx_free(o);
}

static void test_refuse_defined_twice(void **state) {
  (void)state;
  const int64_t one[1] = {1};
  struct npu_onnx *o = small_model();
  npu_onnx_init_f32(o, "x", 1.0f);
  expect_refused(o, "'x' is defined twice");
  npu_onnx_free(o);

  o = small_model();
  const char *in[1] = {"x"}, *out[1] = {"x"};
  assert_null(npu_onnx_node(o, "Identity", NULL, NULL, 1, in, 1, out));
  expect_refused(o, "'x' is defined twice");
  npu_onnx_free(o);

  o = small_model();
  const char *two_out[2] = {"y", "y"};
  assert_null(npu_onnx_node(o, "Split", NULL, NULL, 1, in, 2, two_out));
  expect_refused(o, "'y' is defined twice");
  npu_onnx_free(o);

  o = small_model();
  npu_onnx_output(o, "x", NPU_ONNX_FLOAT, 1, one);
  npu_onnx_output(o, "x", NPU_ONNX_FLOAT, 1, one);
  expect_refused(o, "'x' is listed twice");
  npu_onnx_free(o);

  o = small_model();
  npu_onnx_metadata(o, "k", "1");
  npu_onnx_metadata(o, "k", "2");
  expect_refused(o, "'k' is set twice");
  npu_onnx_free(o);
}

static void test_refuse_undefined_output(void **state) {
  (void)state;
  struct npu_onnx *o = small_model();
  const int64_t one[1] = {1};
  npu_onnx_output(o, "z", NPU_ONNX_FLOAT, 1, one);
  assert_int_equal(npu_onnx_status(o, NULL), NPULM_OK); /* it may still be defined */
  expect_refused(o, "graph output 'z'");
  const char *in[1] = {"x"}, *out[1] = {"z"};
  assert_non_null(npu_onnx_node(o, "Identity", NULL, NULL, 1, in, 1, out));
  uint8_t *bytes;
  struct span model = model_bytes(o, &bytes);
  assert_int_equal(count_fields(get_msg(model, 7, 0), 12), 1);
  free(bytes);
  npu_onnx_free(o);
}

static void test_refuse_bad_names(void **state) {
  (void)state;
  const int64_t one[1] = {1};
  struct npu_onnx *o = small_model();
  npu_onnx_input(o, "", NPU_ONNX_FLOAT, 1, one);
  expect_refused(o, "empty name");
  npu_onnx_free(o);

  char name[NPU_ONNX_NAME_MAX + 2];
  memset(name, 'a', NPU_ONNX_NAME_MAX);
  name[NPU_ONNX_NAME_MAX] = '\0';
  o = small_model();
  npu_onnx_init_f32(o, name, 1.0f); /* the longest allowed */
  assert_true(npu_onnx_has_value(o, name));
  name[NPU_ONNX_NAME_MAX] = 'a';
  name[NPU_ONNX_NAME_MAX + 1] = '\0';
  const char *in[1] = {"x"}, *out[1] = {"y"};
  struct npu_onnx_node *n = npu_onnx_node(o, "Identity", NULL, NULL, 1, in, 1, out);
  assert_non_null(n);
  npu_onnx_attr_int(n, name, 1);
  expect_refused(o, "longer than 256 bytes");
  npu_onnx_free(o);

  o = small_model();
  assert_null(npu_onnx_node(o, "", NULL, NULL, 1, in, 1, out));
  expect_refused(o, "empty name");
  npu_onnx_free(o);

  o = small_model();
  const int64_t zero[1] = {0};
  npu_onnx_input(o, "e", NPU_ONNX_FLOAT, 1, zero);
  expect_refused(o, "'e': bad shape");
  npu_onnx_free(o);
}

static void test_refuse_failing_fill(void **state) {
  (void)state;
  struct npu_onnx *o = small_model();
  const int64_t dims[1] = {1024}; /* 4 KiB: in the data file of an external write */
  npu_onnx_init_f32(o, "first", 1.0f);
  npu_onnx_init_lazy(o, "weights", NPU_ONNX_FLOAT, 1, dims, fill_fails, NULL);
  assert_int_equal(npu_onnx_status(o, NULL), NPULM_OK);
  expect_refused(o, "'weights'");
  npu_onnx_free(o);
}

/* Past protobuf's 2 GiB the initializers cannot be inside: write_mem refuses before making any
 * bytes. */
static void test_mem_past_2gib(void **state) {
  (void)state;
  struct npu_onnx *o = small_model();
  const int64_t dims[2] = {1 << 16, 1 << 15}; /* 2^31 bytes of int8 */
  int fill_calls = 0;
  npu_onnx_init_lazy(o, "huge", NPU_ONNX_INT8, 2, dims, fill_big, &fill_calls);
  uint8_t *bytes = NULL;
  size_t n = 0;
  npulm_error err;
  assert_int_equal(npu_onnx_write_mem(o, &bytes, &n, &err), NPULM_ERR_UNSUPPORTED);
  assert_non_null(strstr(err.msg, "2 GiB"));
  assert_null(bytes);
  assert_int_equal(fill_calls, 0);
  npu_onnx_free(o);
}

/* The first failure stays; later calls do nothing. */
static void test_sticky_failure(void **state) {
  (void)state;
  const int64_t one[1] = {1};
  struct npu_onnx *o = small_model();
  npu_onnx_input(o, "", NPU_ONNX_FLOAT, 1, one);
  npu_onnx_input(o, "ok", NPU_ONNX_FLOAT, 1, one);
  npu_onnx_init_f32(o, "x", 1.0f); /* would be a second failure */
  const char *in[1] = {"x"}, *out[1] = {"y"};
  struct npu_onnx_node *n = npu_onnx_node(o, "Identity", NULL, NULL, 1, in, 1, out);
  assert_null(n);
  npu_onnx_attr_int(n, "axis", 1); /* accepts NULL */
  assert_false(npu_onnx_has_value(o, "ok"));
  assert_false(npu_onnx_has_value(o, "y"));
  npulm_error err;
  assert_int_equal(npu_onnx_status(o, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "empty name"));
  expect_refused(o, "empty name");
  npu_onnx_free(o);
  npu_onnx_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_size),           cmocka_unit_test(test_model_fields),
      cmocka_unit_test(test_golden_identity),      cmocka_unit_test(test_file_equals_memory),
      cmocka_unit_test(test_external_data),        cmocka_unit_test(test_refuse_undefined_input),
      cmocka_unit_test(test_refuse_defined_twice), cmocka_unit_test(test_refuse_undefined_output),
      cmocka_unit_test(test_refuse_bad_names),     cmocka_unit_test(test_refuse_failing_fill),
      cmocka_unit_test(test_mem_past_2gib),        cmocka_unit_test(test_sticky_failure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
