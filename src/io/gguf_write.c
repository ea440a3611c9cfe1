/* GGUF v3 writer: the header (metadata + tensor infos) is built in memory, then emitted once and
 * followed by tensor data streamed in declaration order, so files of any size can be written. */
#include "io/gguf_write.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/atomic_file.h"
#include "base/common.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32u

/* ---- Byte buffer ---------------------------------------------------------------------------- */

void npu_gguf_buf_free(struct npu_gguf_buf *b) {
  if (b == NULL) return;
  free(b->data);
  *b = (struct npu_gguf_buf){0};
}

/* Make room for 'n' more bytes; false (and 'failed' set) if that is impossible. */
static bool buf_reserve(struct npu_gguf_buf *b, size_t n) {
  if (b->failed) return false;
  if (n <= b->cap - b->size) return true;
  size_t need = b->size + n;
  if (need < b->size) {
    b->failed = true;
    return false;
  }
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need) {
    if (cap > SIZE_MAX / 2) {
      cap = need;
      break;
    }
    cap *= 2;
  }
  uint8_t *p = realloc(b->data, cap);
  if (p == NULL) {
    b->failed = true;
    return false;
  }
  b->data = p;
  b->cap = cap;
  return true;
}

void npu_gguf_buf_put(struct npu_gguf_buf *b, const void *bytes, size_t n) {
  if (n == 0 || !buf_reserve(b, n)) return;
  memcpy(b->data + b->size, bytes, n);
  b->size += n;
}

void npu_gguf_buf_put_zeros(struct npu_gguf_buf *b, size_t n) {
  if (n == 0 || !buf_reserve(b, n)) return;
  memset(b->data + b->size, 0, n);
  b->size += n;
}

/* The format is little-endian, as is every host npulm supports; values are copied as stored. */
void npu_gguf_buf_put_u8(struct npu_gguf_buf *b, uint8_t v) { npu_gguf_buf_put(b, &v, 1); }
void npu_gguf_buf_put_u16(struct npu_gguf_buf *b, uint16_t v) { npu_gguf_buf_put(b, &v, 2); }
void npu_gguf_buf_put_u32(struct npu_gguf_buf *b, uint32_t v) { npu_gguf_buf_put(b, &v, 4); }
void npu_gguf_buf_put_u64(struct npu_gguf_buf *b, uint64_t v) { npu_gguf_buf_put(b, &v, 8); }
void npu_gguf_buf_put_f32(struct npu_gguf_buf *b, float v) { npu_gguf_buf_put(b, &v, 4); }
void npu_gguf_buf_put_f64(struct npu_gguf_buf *b, double v) { npu_gguf_buf_put(b, &v, 8); }

void npu_gguf_buf_put_strn(struct npu_gguf_buf *b, const char *s, size_t len) {
  npu_gguf_buf_put_u64(b, (uint64_t)len);
  npu_gguf_buf_put(b, s, len);
}

void npu_gguf_buf_put_str(struct npu_gguf_buf *b, const char *s) {
  npu_gguf_buf_put_strn(b, s, strlen(s));
}

/* ---- Writer --------------------------------------------------------------------------------- */

struct wtensor {
  char *name;
  uint32_t type;
  uint32_t n_dims;
  uint64_t ne[NPU_GGUF_MAX_DIMS];
  uint64_t nbytes;
  uint64_t offset; /* from the start of the data section */
};

enum wstate { DECLARING, WRITING_DATA, FINISHED };

struct npu_gguf_writer {
  /* Output: a file written whole or not at all, or 'mem' in memory mode. */
  struct npu_afile file;
  bool memory;
  struct npu_gguf_buf mem;

  /* Checksums (npu_gguf_writer_add_checksums): the key, or NULL; from the header's emission on,
   * the values ([0] the header's, [1 + i] tensor i's), the file offset where they are stored, and
   * the running hash of the tensor being written. */
  char *sum_key;
  uint64_t *sums;
  uint64_t sums_at;
  XXH3_state_t *hash;

  uint32_t version;
  uint32_t alignment;
  bool alignment_set;

  /* Metadata: encoded key-value pairs, and the keys for the duplicate check. */
  struct npu_gguf_buf kv;
  char **keys;
  size_t n_kv;
  size_t cap_kv;

  struct wtensor *tensors;
  size_t n_tensors;
  size_t cap_tensors;
  uint64_t data_size; /* data section, padding included */

  enum wstate state;
  uint64_t header_size;  /* bytes before the data section, padding included */
  size_t cur;            /* tensor whose data is due */
  uint64_t cur_done;     /* bytes of it written */
  uint64_t data_written; /* data section bytes written, padding included */

  /* The first failure; every later call returns it again. */
  npulm_status status;
  npulm_error error;
};

static uint64_t pad_to(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }

/* Record the first failure and return it (or the earlier one). */
static npulm_status NPU_PRINTF(3, 4)
    wfail(struct npu_gguf_writer *w, npulm_status status, const char *fmt, ...) {
  if (w->status != NPULM_OK) return w->status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->error.msg, sizeof(w->error.msg), fmt, ap);
  va_end(ap);
  w->status = status;
  return status;
}

/* Copy the writer's recorded failure (if any) to 'err' and return it. */
static npulm_status report(const struct npu_gguf_writer *w, npulm_error *err) {
  if (w->status != NPULM_OK && err != NULL) *err = w->error;
  return w->status;
}

npulm_status npu_gguf_writer_status(const struct npu_gguf_writer *w, npulm_error *err) {
  return report(w, err);
}

static npulm_status writer_new(struct npu_gguf_writer **w_out, npulm_error *err) {
  struct npu_gguf_writer *w = calloc(1, sizeof(*w));
  if (w == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory creating a GGUF writer");
  w->version = 3;
  w->alignment = GGUF_DEFAULT_ALIGNMENT;
  *w_out = w;
  return NPULM_OK;
}

npulm_status npu_gguf_writer_open_memory(struct npu_gguf_writer **w_out, npulm_error *err) {
  *w_out = NULL;
  npulm_status st = writer_new(w_out, err);
  if (st == NPULM_OK) (*w_out)->memory = true;
  return st;
}

npulm_status npu_gguf_writer_open_file(const char *path, struct npu_gguf_writer **w_out,
                                       npulm_error *err) {
  *w_out = NULL;
  struct npu_gguf_writer *w = NULL;
  npulm_status st = writer_new(&w, err);
  if (st != NPULM_OK) return st;
  if ((st = npu_afile_open(path, &w->file, err)) != NPULM_OK) {
    npu_gguf_writer_free(w);
    return st;
  }
  *w_out = w;
  return NPULM_OK;
}

void npu_gguf_writer_free(struct npu_gguf_writer *w) {
  if (w == NULL) return;
  npu_afile_abort(&w->file); /* an unfinished file is useless: the target keeps its old bytes */
  free(w->sum_key);
  free(w->sums);
  XXH3_freeState(w->hash);
  npu_gguf_buf_free(&w->mem);
  npu_gguf_buf_free(&w->kv);
  for (size_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
  free(w->keys);
  for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
  free(w->tensors);
  free(w);
}

void npu_gguf_writer_set_version(struct npu_gguf_writer *w, uint32_t version) {
  if (w->state == DECLARING) w->version = version;
}

/* ---- Metadata ------------------------------------------------------------------------------- */

/* Check that metadata may still be added under 'key', remember the key, and encode the key and
 * the value type. The caller then appends the value's bytes to w->kv. */
static npulm_status begin_kv(struct npu_gguf_writer *w, const char *key, uint32_t vtype) {
  if (w->status != NPULM_OK) return w->status;
  if (key == NULL || key[0] == '\0') return wfail(w, NPULM_ERR_ARG, "empty metadata key");
  if (w->state != DECLARING) {
    return wfail(w, NPULM_ERR_ARG, "metadata '%s' added after tensor data was written", key);
  }
  for (size_t i = 0; i < w->n_kv; i++) {
    if (strcmp(w->keys[i], key) == 0) {
      return wfail(w, NPULM_ERR_ARG, "duplicate metadata key '%s'", key);
    }
  }
  if (w->n_kv == w->cap_kv) {
    size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
    char **keys = realloc(w->keys, cap * sizeof(*keys));
    if (keys == NULL) return wfail(w, NPULM_ERR_NOMEM, "out of memory adding metadata '%s'", key);
    w->keys = keys;
    w->cap_kv = cap;
  }
  char *copy = strdup(key);
  if (copy == NULL) return wfail(w, NPULM_ERR_NOMEM, "out of memory adding metadata '%s'", key);
  w->keys[w->n_kv++] = copy;
  npu_gguf_buf_put_str(&w->kv, key);
  npu_gguf_buf_put_u32(&w->kv, vtype);
  return NPULM_OK;
}

/* After the value's bytes: turn a buffer failure into NOMEM. */
static npulm_status end_kv(struct npu_gguf_writer *w, const char *key) {
  if (w->kv.failed) return wfail(w, NPULM_ERR_NOMEM, "out of memory adding metadata '%s'", key);
  return NPULM_OK;
}

/* A fixed-size scalar of 'size' bytes at 'v'. */
static npulm_status add_scalar(struct npu_gguf_writer *w, const char *key, uint32_t vtype,
                               const void *v, size_t size) {
  npulm_status st = begin_kv(w, key, vtype);
  if (st != NPULM_OK) return st;
  npu_gguf_buf_put(&w->kv, v, size);
  return end_kv(w, key);
}

npulm_status npu_gguf_writer_add_u8(struct npu_gguf_writer *w, const char *key, uint8_t v) {
  return add_scalar(w, key, NPU_GGUF_U8, &v, 1);
}
npulm_status npu_gguf_writer_add_i8(struct npu_gguf_writer *w, const char *key, int8_t v) {
  return add_scalar(w, key, NPU_GGUF_I8, &v, 1);
}
npulm_status npu_gguf_writer_add_u16(struct npu_gguf_writer *w, const char *key, uint16_t v) {
  return add_scalar(w, key, NPU_GGUF_U16, &v, 2);
}
npulm_status npu_gguf_writer_add_i16(struct npu_gguf_writer *w, const char *key, int16_t v) {
  return add_scalar(w, key, NPU_GGUF_I16, &v, 2);
}
npulm_status npu_gguf_writer_add_u32(struct npu_gguf_writer *w, const char *key, uint32_t v) {
  if (w->status == NPULM_OK && key != NULL && strcmp(key, "general.alignment") == 0) {
    if (v == 0 || (v & (v - 1)) != 0) {
      return wfail(w, NPULM_ERR_ARG, "general.alignment %u is not a power of two", v);
    }
    if (w->n_tensors > 0) {
      return wfail(w, NPULM_ERR_ARG, "general.alignment must be set before any tensor");
    }
    npulm_status st = add_scalar(w, key, NPU_GGUF_U32, &v, 4);
    if (st == NPULM_OK) w->alignment = v;
    return st;
  }
  return add_scalar(w, key, NPU_GGUF_U32, &v, 4);
}
npulm_status npu_gguf_writer_add_i32(struct npu_gguf_writer *w, const char *key, int32_t v) {
  return add_scalar(w, key, NPU_GGUF_I32, &v, 4);
}
npulm_status npu_gguf_writer_add_u64(struct npu_gguf_writer *w, const char *key, uint64_t v) {
  return add_scalar(w, key, NPU_GGUF_U64, &v, 8);
}
npulm_status npu_gguf_writer_add_i64(struct npu_gguf_writer *w, const char *key, int64_t v) {
  return add_scalar(w, key, NPU_GGUF_I64, &v, 8);
}
npulm_status npu_gguf_writer_add_f32(struct npu_gguf_writer *w, const char *key, float v) {
  return add_scalar(w, key, NPU_GGUF_F32, &v, 4);
}
npulm_status npu_gguf_writer_add_f64(struct npu_gguf_writer *w, const char *key, double v) {
  return add_scalar(w, key, NPU_GGUF_F64, &v, 8);
}
npulm_status npu_gguf_writer_add_bool(struct npu_gguf_writer *w, const char *key, bool v) {
  uint8_t b = v ? 1 : 0;
  return add_scalar(w, key, NPU_GGUF_BOOL, &b, 1);
}

npulm_status npu_gguf_writer_add_str(struct npu_gguf_writer *w, const char *key, const char *v) {
  npulm_status st = begin_kv(w, key, NPU_GGUF_STR);
  if (st != NPULM_OK) return st;
  npu_gguf_buf_put_str(&w->kv, v);
  return end_kv(w, key);
}

npulm_status npu_gguf_writer_add_arr(struct npu_gguf_writer *w, const char *key,
                                     enum npu_gguf_vtype elem_type, const void *elems, size_t n) {
  size_t size = npu_gguf_vtype_size((uint32_t)elem_type);
  if (w->status != NPULM_OK) return w->status;
  if (size == 0) {
    return wfail(w, NPULM_ERR_ARG, "metadata '%s': array element type %d is not a fixed-size type",
                 key, (int)elem_type);
  }
  if (n > SIZE_MAX / size) return wfail(w, NPULM_ERR_ARG, "metadata '%s': array too large", key);
  npulm_status st = begin_kv(w, key, NPU_GGUF_ARR);
  if (st != NPULM_OK) return st;
  npu_gguf_buf_put_u32(&w->kv, (uint32_t)elem_type);
  npu_gguf_buf_put_u64(&w->kv, (uint64_t)n);
  npu_gguf_buf_put(&w->kv, elems, n * size);
  return end_kv(w, key);
}

npulm_status npu_gguf_writer_add_arr_str(struct npu_gguf_writer *w, const char *key,
                                         const char *const *strs, size_t n) {
  npulm_status st = begin_kv(w, key, NPU_GGUF_ARR);
  if (st != NPULM_OK) return st;
  npu_gguf_buf_put_u32(&w->kv, NPU_GGUF_STR);
  npu_gguf_buf_put_u64(&w->kv, (uint64_t)n);
  for (size_t i = 0; i < n; i++) npu_gguf_buf_put_str(&w->kv, strs[i]);
  return end_kv(w, key);
}

npulm_status npu_gguf_writer_add_raw(struct npu_gguf_writer *w, const char *key, uint32_t vtype,
                                     const void *bytes, size_t n) {
  npulm_status st = begin_kv(w, key, vtype);
  if (st != NPULM_OK) return st;
  npu_gguf_buf_put(&w->kv, bytes, n);
  return end_kv(w, key);
}

npulm_status npu_gguf_writer_add_checksums(struct npu_gguf_writer *w, const char *key) {
  if (w->status != NPULM_OK) return w->status;
  if (w->state != DECLARING || w->sum_key != NULL) {
    return wfail(w, NPULM_ERR_ARG, "checksums '%s' added twice or after tensor data", key);
  }
  w->sum_key = strdup(key);
  if (w->sum_key == NULL) return wfail(w, NPULM_ERR_NOMEM, "out of memory adding checksums");
  return NPULM_OK;
}

/* ---- Tensors -------------------------------------------------------------------------------- */

npulm_status npu_gguf_writer_add_tensor(struct npu_gguf_writer *w, const char *name, uint32_t type,
                                        uint32_t n_dims, const uint64_t *ne, size_t *index_out) {
  if (w->status != NPULM_OK) return w->status;
  if (name == NULL || name[0] == '\0') return wfail(w, NPULM_ERR_ARG, "empty tensor name");
  if (w->state != DECLARING) {
    return wfail(w, NPULM_ERR_ARG, "tensor '%s' declared after tensor data was written", name);
  }
  uint32_t block, block_bytes;
  if (!npu_ggml_type_size(type, &block, &block_bytes)) {
    return wfail(w, NPULM_ERR_ARG, "tensor '%s': unknown ggml type %u", name, type);
  }
  if (n_dims < 1 || n_dims > NPU_GGUF_MAX_DIMS) {
    return wfail(w, NPULM_ERR_ARG, "tensor '%s': %u dimensions (1..%d allowed)", name, n_dims,
                 NPU_GGUF_MAX_DIMS);
  }
  for (size_t i = 0; i < w->n_tensors; i++) {
    if (strcmp(w->tensors[i].name, name) == 0) {
      return wfail(w, NPULM_ERR_ARG, "duplicate tensor name '%s'", name);
    }
  }
  struct wtensor t = {.type = type, .n_dims = n_dims};
  uint64_t n_elems = 1;
  for (uint32_t d = 0; d < NPU_GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    if (t.ne[d] == 0 || !npu_mul_u64(n_elems, t.ne[d], &n_elems) || n_elems > INT64_MAX) {
      return wfail(w, NPULM_ERR_ARG, "tensor '%s': invalid shape (dimension %u = %llu)", name, d,
                   (unsigned long long)t.ne[d]);
    }
  }
  if (t.ne[0] % block != 0) {
    return wfail(w, NPULM_ERR_ARG, "tensor '%s': row length %llu is not a multiple of %u", name,
                 (unsigned long long)t.ne[0], block);
  }
  uint64_t padded, end;
  if (!npu_mul_u64(n_elems / block, block_bytes, &t.nbytes) ||
      !npu_add_u64(t.nbytes, w->alignment - 1, &padded) ||
      !npu_add_u64(w->data_size, padded / w->alignment * w->alignment, &end)) {
    return wfail(w, NPULM_ERR_ARG, "tensor '%s' is too large", name);
  }
  t.offset = w->data_size;
  if (w->n_tensors == w->cap_tensors) {
    size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
    struct wtensor *p = realloc(w->tensors, cap * sizeof(*p));
    if (p == NULL) return wfail(w, NPULM_ERR_NOMEM, "out of memory adding tensor '%s'", name);
    w->tensors = p;
    w->cap_tensors = cap;
  }
  t.name = strdup(name);
  if (t.name == NULL) return wfail(w, NPULM_ERR_NOMEM, "out of memory adding tensor '%s'", name);
  w->tensors[w->n_tensors] = t;
  if (index_out != NULL) *index_out = w->n_tensors;
  w->n_tensors++;
  w->data_size = end;
  return NPULM_OK;
}

uint64_t npu_gguf_writer_tensor_nbytes(const struct npu_gguf_writer *w, size_t index) {
  return index < w->n_tensors ? w->tensors[index].nbytes : 0;
}

/* Bytes of the header as declared so far, padding to the data section included. */
static uint64_t header_size(const struct npu_gguf_writer *w) {
  uint64_t n = 4 + 4 + 8 + 8 + (uint64_t)w->kv.size;
  if (w->sum_key != NULL && w->state == DECLARING) {
    n += 8 + strlen(w->sum_key) + 4 + 4 + 8 + 8 * ((uint64_t)w->n_tensors + 1);
  }
  for (size_t i = 0; i < w->n_tensors; i++) {
    n += 8 + strlen(w->tensors[i].name) + 4 + 8ull * w->tensors[i].n_dims + 4 + 8;
  }
  return pad_to(n, w->alignment);
}

uint64_t npu_gguf_writer_data_size(const struct npu_gguf_writer *w) { return w->data_size; }

uint64_t npu_gguf_writer_file_size(const struct npu_gguf_writer *w) {
  return header_size(w) + w->data_size;
}

/* ---- Output --------------------------------------------------------------------------------- */

static npulm_status out_write(struct npu_gguf_writer *w, const void *data, size_t n) {
  if (n == 0) return NPULM_OK;
  if (w->memory) {
    npu_gguf_buf_put(&w->mem, data, n);
    if (w->mem.failed) return wfail(w, NPULM_ERR_NOMEM, "out of memory writing a GGUF image");
    return NPULM_OK;
  }
  npulm_error e;
  npulm_status st = npu_afile_write(&w->file, data, n, &e);
  return st == NPULM_OK ? NPULM_OK : wfail(w, st, "%s", e.msg);
}

static const uint8_t zeros[256];

/* Emit 'n' bytes of tensor data, adding them to the running checksum. */
static npulm_status out_data(struct npu_gguf_writer *w, const void *data, size_t n) {
  if (w->hash != NULL) XXH3_64bits_update(w->hash, data, n);
  return out_write(w, data, n);
}

/* Emit 'n' zero bytes of tensor padding. */
static npulm_status out_zeros(struct npu_gguf_writer *w, uint64_t n) {
  while (n > 0) {
    size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
    npulm_status st = out_data(w, zeros, k);
    if (st != NPULM_OK) return st;
    n -= k;
  }
  return NPULM_OK;
}

/* Declare the checksums' array (all zeros until finish) as the last metadata, now that the number
 * of tensors is known, and start the hashes. */
static npulm_status begin_checksums(struct npu_gguf_writer *w) {
  size_t n = w->n_tensors + 1;
  w->sums = calloc(n, sizeof(*w->sums));
  w->hash = XXH3_createState();
  if (w->sums == NULL || w->hash == NULL) {
    return wfail(w, NPULM_ERR_NOMEM, "out of memory adding checksums");
  }
  XXH3_64bits_reset(w->hash);
  npulm_status st = begin_kv(w, w->sum_key, NPU_GGUF_ARR);
  if (st != NPULM_OK) return st;
  npu_gguf_buf_put_u32(&w->kv, NPU_GGUF_U64);
  npu_gguf_buf_put_u64(&w->kv, (uint64_t)n);
  w->sums_at = 4 + 4 + 8 + 8 + (uint64_t)w->kv.size;
  npu_gguf_buf_put_zeros(&w->kv, n * sizeof(uint64_t));
  return end_kv(w, w->sum_key);
}

/* Store the checksums where begin_checksums left room for them. */
static npulm_status store_checksums(struct npu_gguf_writer *w) {
  struct npu_gguf_buf b = {0};
  for (size_t i = 0; i <= w->n_tensors; i++) npu_gguf_buf_put_u64(&b, w->sums[i]);
  npulm_status st = NPULM_OK;
  if (b.failed) {
    st = wfail(w, NPULM_ERR_NOMEM, "out of memory storing checksums");
  } else if (w->memory) {
    memcpy(w->mem.data + w->sums_at, b.data, b.size);
  } else {
    npulm_error e;
    st = npu_afile_pwrite(&w->file, b.data, b.size, w->sums_at, &e);
    if (st != NPULM_OK) st = wfail(w, st, "%s", e.msg);
  }
  npu_gguf_buf_free(&b);
  return st;
}

/* Encode and emit the header: magic, version, counts, metadata, tensor infos, padding. */
static npulm_status emit_header(struct npu_gguf_writer *w) {
  if (w->sum_key != NULL && begin_checksums(w) != NPULM_OK) return w->status;
  struct npu_gguf_buf h = {0};
  npu_gguf_buf_put_u32(&h, GGUF_MAGIC);
  npu_gguf_buf_put_u32(&h, w->version);
  npu_gguf_buf_put_u64(&h, (uint64_t)w->n_tensors);
  npu_gguf_buf_put_u64(&h, (uint64_t)w->n_kv);
  npu_gguf_buf_put(&h, w->kv.data, w->kv.size);
  for (size_t i = 0; i < w->n_tensors; i++) {
    const struct wtensor *t = &w->tensors[i];
    npu_gguf_buf_put_str(&h, t->name);
    npu_gguf_buf_put_u32(&h, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) npu_gguf_buf_put_u64(&h, t->ne[d]);
    npu_gguf_buf_put_u32(&h, t->type);
    npu_gguf_buf_put_u64(&h, t->offset);
  }
  npu_gguf_buf_put_zeros(&h, (size_t)(pad_to(h.size, w->alignment) - h.size));
  npulm_status st;
  if (h.failed) {
    st = wfail(w, NPULM_ERR_NOMEM, "out of memory encoding the GGUF header");
  } else {
    w->header_size = h.size;
    if (w->sums != NULL) w->sums[0] = XXH3_64bits(h.data, h.size); /* its own values still 0 */
    st = out_write(w, h.data, h.size);
  }
  npu_gguf_buf_free(&h);
  w->state = WRITING_DATA;
  return st;
}

npulm_status npu_gguf_writer_write_data(struct npu_gguf_writer *w, const void *data, size_t n,
                                        npulm_error *err) {
  if (w->status != NPULM_OK) return report(w, err);
  if (w->state == FINISHED) {
    wfail(w, NPULM_ERR_ARG, "tensor data written after finish");
    return report(w, err);
  }
  if (w->state == DECLARING && emit_header(w) != NPULM_OK) return report(w, err);
  const uint8_t *p = data;
  while (n > 0) {
    if (w->cur >= w->n_tensors) {
      wfail(w, NPULM_ERR_ARG, "more tensor data than the %zu declared tensors hold", w->n_tensors);
      return report(w, err);
    }
    const struct wtensor *t = &w->tensors[w->cur];
    uint64_t left = t->nbytes - w->cur_done;
    size_t k = left < n ? (size_t)left : n;
    if (out_data(w, p, k) != NPULM_OK) return report(w, err);
    p += k;
    n -= k;
    w->cur_done += k;
    w->data_written += k;
    if (w->cur_done == t->nbytes) {
      uint64_t pad = pad_to(t->nbytes, w->alignment) - t->nbytes;
      if (out_zeros(w, pad) != NPULM_OK) return report(w, err);
      w->data_written += pad;
      if (w->hash != NULL) {
        w->sums[1 + w->cur] = XXH3_64bits_digest(w->hash);
        XXH3_64bits_reset(w->hash);
      }
      w->cur++;
      w->cur_done = 0;
    }
  }
  return NPULM_OK;
}

npulm_status npu_gguf_writer_write_tensor(struct npu_gguf_writer *w, size_t index, const void *data,
                                          npulm_error *err) {
  if (w->status != NPULM_OK) return report(w, err);
  if (index != w->cur || w->cur_done != 0) {
    wfail(w, NPULM_ERR_ARG, "tensor %zu written out of order (tensor %zu is due)", index, w->cur);
    return report(w, err);
  }
  return npu_gguf_writer_write_data(w, data, (size_t)w->tensors[index].nbytes, err);
}

uint64_t npu_gguf_writer_data_written(const struct npu_gguf_writer *w) { return w->data_written; }

npulm_status npu_gguf_writer_finish(struct npu_gguf_writer *w, npulm_error *err) {
  if (w->status != NPULM_OK) return report(w, err);
  if (w->state == FINISHED) return NPULM_OK;
  if (w->state == DECLARING && emit_header(w) != NPULM_OK) return report(w, err);
  if (w->cur < w->n_tensors) {
    wfail(w, NPULM_ERR_ARG, "tensor '%s' and %zu after it have no data yet",
          w->tensors[w->cur].name, w->n_tensors - w->cur - 1);
    return report(w, err);
  }
  if (w->sums != NULL && store_checksums(w) != NPULM_OK) return report(w, err);
  w->state = FINISHED;
  if (!w->memory) {
    npulm_error e;
    npulm_status st = npu_afile_commit(&w->file, &e);
    if (st != NPULM_OK) wfail(w, st, "%s", e.msg);
  }
  return report(w, err);
}

npulm_status npu_gguf_writer_take_memory(struct npu_gguf_writer *w, void **data_out,
                                         size_t *size_out, npulm_error *err) {
  *data_out = NULL;
  *size_out = 0;
  if (w->status != NPULM_OK) return report(w, err);
  if (!w->memory || w->state != FINISHED) {
    wfail(w, NPULM_ERR_ARG, "take_memory needs a finished in-memory writer");
    return report(w, err);
  }
  *data_out = w->mem.data;
  *size_out = w->mem.size;
  w->mem = (struct npu_gguf_buf){0};
  return NPULM_OK;
}
