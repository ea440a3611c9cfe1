/* GGUF v2/v3 reader. The file is treated as hostile: the parser walks it with a bounds-checked
 * cursor, rejects counts that cannot fit in the bytes that remain before allocating for them, and
 * checks every tensor's shape, type and data range against the file size. */
/* madvise: not in POSIX 2008, but in every Unix this targets (base/pages.c) */
#define _DEFAULT_SOURCE
#include "io/gguf.h"

#include <assert.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/common.h"
#include "base/pages.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_KEY_LEN 65535u
#define GGUF_MAX_ARRAY_DEPTH 8 /* nested arrays deeper than this are rejected, not recursed */

static const char *const vtype_names[NPU_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

size_t npu_gguf_vtype_size(uint32_t type) {
  static const uint8_t sizes[NPU_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return type < NPU_GGUF_VTYPE_COUNT ? sizes[type] : 0;
}

/* ---- Bounds-checked cursor ------------------------------------------------------------------ */

struct cursor {
  const uint8_t *base;
  size_t size;
  size_t pos;
  npulm_error *err;
};

static size_t remaining(const struct cursor *c) { return c->size - c->pos; }

/* Read 'n' bytes; on truncation record an error mentioning 'what'. */
static bool read_bytes(struct cursor *c, void *dst, size_t n, const char *what) {
  if (n > remaining(c)) {
    npu_fail(c->err, NPULM_ERR_FORMAT,
             "file is truncated: %s at offset %zu needs %zu bytes, %zu left", what, c->pos, n,
             remaining(c));
    return false;
  }
  if (dst != NULL) memcpy(dst, c->base + c->pos, n);
  c->pos += n;
  return true;
}

static bool read_u32(struct cursor *c, uint32_t *v, const char *what) {
  return read_bytes(c, v, 4, what);
}
static bool read_u64(struct cursor *c, uint64_t *v, const char *what) {
  return read_bytes(c, v, 8, what);
}

static bool read_str(struct cursor *c, struct npu_gguf_str *s, const char *what) {
  if (!read_u64(c, &s->len, what)) return false;
  if (s->len > remaining(c)) {
    npu_fail(c->err, NPULM_ERR_FORMAT,
             "%s at offset %zu has length %llu, beyond the end of the file", what, c->pos - 8,
             (unsigned long long)s->len);
    return false;
  }
  s->ptr = (const char *)c->base + c->pos;
  c->pos += (size_t)s->len;
  return true;
}

/* True if some byte of p[0 .. n-1] exceeds 'max'. */
static bool memchr_above(const uint8_t *p, size_t n, uint8_t max) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] > max) return true;
  }
  return false;
}

/* Read a value of 'type' (arrays recursively, up to GGUF_MAX_ARRAY_DEPTH). */
static bool read_value(struct cursor *c, uint32_t type, struct npu_gguf_value *v, int depth,
                       const char *key) {
  v->type = type;
  if (type >= NPU_GGUF_VTYPE_COUNT) {
    npu_fail(c->err, NPULM_ERR_FORMAT, "key '%s' has unknown value type %u", key, type);
    return false;
  }
  switch (type) {
  case NPU_GGUF_U8:
  case NPU_GGUF_U16:
  case NPU_GGUF_U32:
  case NPU_GGUF_U64:
  case NPU_GGUF_BOOL: {
    uint64_t u = 0;
    if (!read_bytes(c, &u, npu_gguf_vtype_size(type), key)) return false; /* little-endian host */
    if (type == NPU_GGUF_BOOL && u > 1) {
      npu_fail(c->err, NPULM_ERR_FORMAT, "key '%s' has bool value %llu", key,
               (unsigned long long)u);
      return false;
    }
    v->v.u = u;
    return true;
  }
  case NPU_GGUF_I8: {
    int8_t x;
    if (!read_bytes(c, &x, 1, key)) return false;
    v->v.i = x;
    return true;
  }
  case NPU_GGUF_I16: {
    int16_t x;
    if (!read_bytes(c, &x, 2, key)) return false;
    v->v.i = x;
    return true;
  }
  case NPU_GGUF_I32: {
    int32_t x;
    if (!read_bytes(c, &x, 4, key)) return false;
    v->v.i = x;
    return true;
  }
  case NPU_GGUF_I64: {
    int64_t x;
    if (!read_bytes(c, &x, 8, key)) return false;
    v->v.i = x;
    return true;
  }
  case NPU_GGUF_F32: {
    float x;
    if (!read_bytes(c, &x, 4, key)) return false;
    v->v.f = x;
    return true;
  }
  case NPU_GGUF_F64: {
    double x;
    if (!read_bytes(c, &x, 8, key)) return false;
    v->v.f = x;
    return true;
  }
  case NPU_GGUF_STR: return read_str(c, &v->v.s, key);
  case NPU_GGUF_ARR: {
    struct npu_gguf_arr *a = &v->v.a;
    if (depth >= GGUF_MAX_ARRAY_DEPTH) {
      npu_fail(c->err, NPULM_ERR_FORMAT, "key '%s' nests arrays deeper than %d", key,
               GGUF_MAX_ARRAY_DEPTH);
      return false;
    }
    if (!read_u32(c, &a->type, key) || !read_u64(c, &a->n, key)) return false;
    if (a->type >= NPU_GGUF_VTYPE_COUNT) {
      npu_fail(c->err, NPULM_ERR_FORMAT, "key '%s' is an array of unknown type %u", key, a->type);
      return false;
    }
    /* The smallest an element can be: its fixed size, or a length/header for strings/arrays. */
    size_t elem_min = a->type == NPU_GGUF_STR   ? 8
                      : a->type == NPU_GGUF_ARR ? 12
                                                : npu_gguf_vtype_size(a->type);
    uint64_t min_bytes;
    if (!npu_mul_u64(a->n, elem_min, &min_bytes) || min_bytes > remaining(c)) {
      npu_fail(c->err, NPULM_ERR_FORMAT,
               "key '%s': array of %llu %s elements does not fit in the file", key,
               (unsigned long long)a->n, vtype_names[a->type]);
      return false;
    }
    size_t start = c->pos;
    a->data = c->base + start;
    if (a->type == NPU_GGUF_STR || a->type == NPU_GGUF_ARR) {
      for (uint64_t i = 0; i < a->n; i++) {
        struct npu_gguf_value elem;
        if (!read_value(c, a->type, &elem, depth + 1, key)) return false;
      }
    } else {
      if (a->type == NPU_GGUF_BOOL && memchr_above(c->base + start, (size_t)min_bytes, 1)) {
        npu_fail(c->err, NPULM_ERR_FORMAT, "key '%s' has a bool array element other than 0 or 1",
                 key);
        return false;
      }
      c->pos += (size_t)min_bytes;
    }
    a->size = c->pos - start;
    return true;
  }
  }
  return false; /* unreachable: every type is handled above */
}

/* ---- Parsing the whole file ----------------------------------------------------------------- */

static int cmp_str(struct npu_gguf_str a, struct npu_gguf_str b) {
  size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
  int r = n ? memcmp(a.ptr, b.ptr, n) : 0;
  if (r != 0) return r;
  return a.len < b.len ? -1 : a.len > b.len;
}

static int cmp_kv_key(const void *a, const void *b) {
  return cmp_str((*(const struct npu_gguf_kv *const *)a)->key,
                 (*(const struct npu_gguf_kv *const *)b)->key);
}
static int cmp_tensor_name(const void *a, const void *b) {
  return cmp_str((*(const struct npu_gguf_tensor *const *)a)->name,
                 (*(const struct npu_gguf_tensor *const *)b)->name);
}

/* Return the index of a name that occurs twice in 'n' items (sorted via pointers), or -1. */
static int64_t find_duplicate(const void *items, size_t n, size_t item_size,
                              int (*cmp)(const void *, const void *), bool *nomem) {
  *nomem = false;
  if (n < 2) return -1;
  const void **ptrs = malloc(n * sizeof(*ptrs));
  if (ptrs == NULL) {
    *nomem = true;
    return -1;
  }
  for (size_t i = 0; i < n; i++) ptrs[i] = (const uint8_t *)items + i * item_size;
  qsort(ptrs, n, sizeof(*ptrs), cmp);
  int64_t dup = -1;
  for (size_t i = 1; i < n && dup < 0; i++) {
    if (cmp(&ptrs[i - 1], &ptrs[i]) == 0) {
      dup = (int64_t)(((const uint8_t *)ptrs[i] - (const uint8_t *)items) / item_size);
    }
  }
  free(ptrs);
  return dup;
}

static npulm_status parse_kvs(struct npu_gguf *g, struct cursor *c, npulm_error *err) {
  /* Smallest key-value: key length (8) + empty key + type (4) + a 1-byte value. */
  if (g->n_kv > remaining(c) / 13) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata count %llu is impossible for a %zu-byte file",
                    (unsigned long long)g->n_kv, c->size);
  }
  g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
  if (g->kv == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory reading metadata");
  for (uint64_t i = 0; i < g->n_kv; i++) {
    struct npu_gguf_kv *kv = &g->kv[i];
    uint32_t type;
    if (!read_str(c, &kv->key, "metadata key")) return NPULM_ERR_FORMAT;
    if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY_LEN) {
      return npu_fail(err, NPULM_ERR_FORMAT, "metadata key %llu has invalid length %llu",
                      (unsigned long long)i, (unsigned long long)kv->key.len);
    }
    char key[128];
    snprintf(key, sizeof(key), "%.*s", (int)(kv->key.len < 100 ? kv->key.len : 100), kv->key.ptr);
    if (!read_u32(c, &type, key) || !read_value(c, type, &kv->val, 0, key)) {
      return NPULM_ERR_FORMAT;
    }
  }
  bool nomem;
  int64_t dup = find_duplicate(g->kv, (size_t)g->n_kv, sizeof(*g->kv), cmp_kv_key, &nomem);
  if (nomem) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory checking metadata keys");
  if (dup >= 0) {
    struct npu_gguf_str k = g->kv[dup].key;
    return npu_fail(err, NPULM_ERR_FORMAT, "duplicate metadata key '%.*s'",
                    (int)(k.len < 200 ? k.len : 200), k.ptr);
  }
  return NPULM_OK;
}

static npulm_status read_alignment(struct npu_gguf *g, npulm_error *err) {
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  const struct npu_gguf_kv *kv = npu_gguf_find(g, "general.alignment");
  if (kv == NULL) return NPULM_OK;
  if (kv->val.type != NPU_GGUF_U32) {
    return npu_fail(err, NPULM_ERR_FORMAT, "general.alignment must be a u32, not %s",
                    vtype_names[kv->val.type]);
  }
  uint64_t a = kv->val.v.u;
  if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 20)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "general.alignment %llu is not a power of two <= 1 MiB",
                    (unsigned long long)a);
  }
  g->alignment = (uint32_t)a;
  return NPULM_OK;
}

/* Read one tensor info and compute its element count and byte size. */
static npulm_status parse_tensor_info(struct cursor *c, struct npu_gguf_tensor *t, uint64_t index,
                                      npulm_error *err) {
  if (!read_str(c, &t->name, "tensor name")) return NPULM_ERR_FORMAT;
  int name_len = (int)(t->name.len < 200 ? t->name.len : 200);
  if (t->name.len == 0) {
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor %llu has an empty name",
                    (unsigned long long)index);
  }
  if (!read_u32(c, &t->n_dims, "tensor dims")) return NPULM_ERR_FORMAT;
  if (t->n_dims == 0 || t->n_dims > NPU_GGUF_MAX_DIMS) {
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%.*s' has %u dimensions (1..%d allowed)",
                    name_len, t->name.ptr, t->n_dims, NPU_GGUF_MAX_DIMS);
  }
  t->n_elems = 1;
  for (uint32_t d = 0; d < NPU_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  for (uint32_t d = 0; d < t->n_dims; d++) {
    if (!read_u64(c, &t->ne[d], "tensor shape")) return NPULM_ERR_FORMAT;
    if (t->ne[d] == 0 || t->ne[d] > INT64_MAX || !npu_mul_u64(t->n_elems, t->ne[d], &t->n_elems) ||
        t->n_elems > INT64_MAX) {
      return npu_fail(err, NPULM_ERR_FORMAT,
                      "tensor '%.*s' has an invalid shape (dimension %u = %llu)", name_len,
                      t->name.ptr, d, (unsigned long long)t->ne[d]);
    }
  }
  if (!read_u32(c, &t->type, "tensor type") || !read_u64(c, &t->offset, "tensor offset")) {
    return NPULM_ERR_FORMAT;
  }
  const char *tname = npu_ggml_type_name(t->type);
  if (tname == NULL) {
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%.*s' has unknown type id %u", name_len,
                    t->name.ptr, t->type);
  }
  uint32_t block, block_bytes;
  npu_ggml_type_size(t->type, &block, &block_bytes);
  if (t->ne[0] % block != 0) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "tensor '%.*s' of type %s has row length %llu, not a multiple of %u", name_len,
                    t->name.ptr, tname, (unsigned long long)t->ne[0], block);
  }
  if (!npu_mul_u64(t->n_elems / block, block_bytes, &t->nbytes)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%.*s' is too large", name_len, t->name.ptr);
  }
  return NPULM_OK;
}

static int cmp_tensor_offset(const void *a, const void *b) {
  const struct npu_gguf_tensor *x = *(const struct npu_gguf_tensor *const *)a;
  const struct npu_gguf_tensor *y = *(const struct npu_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* No two tensors' data may overlap: a tensor whose type or shape claims more bytes than lie
 * before the next tensor's data (a type that disagrees with the data written) is refused, naming
 * it, instead of reading its neighbour's bytes as its own. */
static npulm_status check_overlaps(const struct npu_gguf *g, npulm_error *err) {
  if (g->n_tensors < 2) return NPULM_OK;
  const struct npu_gguf_tensor **order = malloc((size_t)g->n_tensors * sizeof(*order));
  if (order == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory checking tensor data");
  for (uint64_t i = 0; i < g->n_tensors; i++) order[i] = &g->tensors[i];
  qsort(order, (size_t)g->n_tensors, sizeof(*order), cmp_tensor_offset);
  npulm_status st = NPULM_OK;
  for (uint64_t i = 1; i < g->n_tensors && st == NPULM_OK; i++) {
    const struct npu_gguf_tensor *a = order[i - 1], *b = order[i];
    if (a->offset + a->nbytes > b->offset) { /* no overflow: both lie within the file */
      st = npu_fail(err, NPULM_ERR_FORMAT,
                    "tensor '%.*s' (%s, %llu bytes at offset %llu) runs into tensor '%.*s' at "
                    "offset %llu: its data size disagrees with its type or shape",
                    (int)(a->name.len < 200 ? a->name.len : 200), a->name.ptr,
                    npu_ggml_type_name(a->type), (unsigned long long)a->nbytes,
                    (unsigned long long)a->offset, (int)(b->name.len < 200 ? b->name.len : 200),
                    b->name.ptr, (unsigned long long)b->offset);
    }
  }
  free(order);
  return st;
}

static npulm_status parse_tensors(struct npu_gguf *g, struct cursor *c, npulm_error *err) {
  /* Smallest tensor info: name length (8) + 1-byte name + n_dims (4) + one dim (8) + type (4) +
   * offset (8). */
  if (g->n_tensors > remaining(c) / 33) {
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor count %llu is impossible for a %zu-byte file",
                    (unsigned long long)g->n_tensors, c->size);
  }
  g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
  if (g->tensors == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory reading tensors");
  npulm_status st;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    if ((st = parse_tensor_info(c, &g->tensors[i], i, err)) != NPULM_OK) return st;
  }
  uint64_t data_offset;
  if (!npu_add_u64(c->pos, g->alignment - 1, &data_offset)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "data section offset overflows");
  }
  g->data_offset = data_offset & ~(uint64_t)(g->alignment - 1);
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    struct npu_gguf_tensor *t = &g->tensors[i];
    int name_len = (int)(t->name.len < 200 ? t->name.len : 200);
    uint64_t start, end;
    if (t->offset % g->alignment != 0) {
      return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%.*s' offset %llu is not aligned to %u",
                      name_len, t->name.ptr, (unsigned long long)t->offset, g->alignment);
    }
    if (!npu_add_u64(g->data_offset, t->offset, &start) || !npu_add_u64(start, t->nbytes, &end) ||
        end > c->size) {
      return npu_fail(err, NPULM_ERR_FORMAT,
                      "tensor '%.*s' data (%s, offset %llu, %llu bytes) lies outside the %zu-byte "
                      "file",
                      name_len, t->name.ptr, npu_ggml_type_name(t->type),
                      (unsigned long long)t->offset, (unsigned long long)t->nbytes, c->size);
    }
    t->data = c->base + start;
  }
  npulm_status st_overlap = check_overlaps(g, err);
  if (st_overlap != NPULM_OK) return st_overlap;
  bool nomem;
  int64_t dup = find_duplicate(g->tensors, (size_t)g->n_tensors, sizeof(*g->tensors),
                               cmp_tensor_name, &nomem);
  if (nomem) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory checking tensor names");
  if (dup >= 0) {
    struct npu_gguf_str n = g->tensors[dup].name;
    return npu_fail(err, NPULM_ERR_FORMAT, "duplicate tensor name '%.*s'",
                    (int)(n.len < 200 ? n.len : 200), n.ptr);
  }
  return NPULM_OK;
}

static npulm_status parse(struct npu_gguf *g, npulm_error *err) {
  struct cursor c = {.base = g->base, .size = g->size, .pos = 0, .err = err};
  uint32_t magic;
  npulm_status st;
  if (g->size < 4 || !read_u32(&c, &magic, "magic")) {
    return npu_fail(err, NPULM_ERR_FORMAT, "not a GGUF file: %zu bytes is too short", g->size);
  }
  if (magic != GGUF_MAGIC) {
    return npu_fail(err, NPULM_ERR_FORMAT, "not a GGUF file: bad magic 0x%08x", magic);
  }
  if (!read_u32(&c, &g->version, "version")) return NPULM_ERR_FORMAT;
  if (g->version == 1) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED, "GGUF version 1 is not supported (v2 and v3 are)");
  }
  if ((g->version & 0xffffu) == 0 && g->version != 0) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
  }
  if (g->version != 2 && g->version != 3) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED, "unknown GGUF version %u (v2 and v3 are supported)",
                    g->version);
  }
  if (!read_u64(&c, &g->n_tensors, "tensor count") || !read_u64(&c, &g->n_kv, "metadata count")) {
    return NPULM_ERR_FORMAT;
  }
  if ((st = parse_kvs(g, &c, err)) != NPULM_OK) return st;
  if ((st = read_alignment(g, err)) != NPULM_OK) return st;
  return parse_tensors(g, &c, err);
}

npulm_status npu_gguf_open_memory(const void *data, size_t size, struct npu_gguf **out,
                                  npulm_error *err) {
  *out = NULL;
  struct npu_gguf *g = calloc(1, sizeof(*g));
  if (g == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  g->base = data;
  g->size = size;
  g->fd = -1;
  npulm_status st = parse(g, err);
  if (st != NPULM_OK) {
    npu_gguf_close(g);
    return st;
  }
  *out = g;
  return NPULM_OK;
}

static uint64_t time_ns(const struct timespec *t) {
  return (uint64_t)t->tv_sec * 1000000000u + (uint64_t)t->tv_nsec;
}

npulm_status npu_gguf_open(const char *path, struct npu_gguf **out, npulm_error *err) {
  *out = NULL;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return npu_fail(err, NPULM_ERR_IO, "cannot open '%s'", path);
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return npu_fail(err, NPULM_ERR_IO, "'%s' is not a regular file", path);
  }
  if (sb.st_size < 4) {
    close(fd);
    return npu_fail(err, NPULM_ERR_FORMAT, "'%s' is not a GGUF file: %lld bytes is too short", path,
                    (long long)sb.st_size);
  }
  size_t size = (size_t)sb.st_size;
  void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return npu_fail(err, NPULM_ERR_IO, "cannot map '%s'", path);
  }
  npulm_status st = npu_gguf_open_memory(map, size, out, err);
  if (st != NPULM_OK) {
    munmap(map, size);
    close(fd);
    return st;
  }
  (*out)->owns_mapping = true;
  (*out)->fd = fd;
  (*out)->file_dev = (uint64_t)sb.st_dev;
  (*out)->file_ino = (uint64_t)sb.st_ino;
  (*out)->file_size = (uint64_t)sb.st_size;
  (*out)->file_mtime_ns = time_ns(&sb.st_mtim);
  return NPULM_OK;
}

bool npu_gguf_changed(const struct npu_gguf *g) {
  struct stat sb;
  if (g == NULL || g->fd < 0) return false;
  return fstat(g->fd, &sb) != 0 || (uint64_t)sb.st_size != g->file_size ||
         time_ns(&sb.st_mtim) != g->file_mtime_ns;
}

bool npu_gguf_is_file(const struct npu_gguf *g, const char *path) {
  return g != NULL && g->owns_mapping && npu_file_is(path, g->file_dev, g->file_ino);
}

void npu_gguf_close(struct npu_gguf *g) {
  if (g == NULL) return;
  if (g->owns_mapping) munmap((void *)g->base, g->size);
  if (g->fd >= 0) close(g->fd);
  free(g->kv);
  free(g->tensors);
  free(g);
}

/* The whole pages of the mapping that bytes [begin, end) touch: their start and length. */
static bool page_span(const struct npu_gguf *g, uint64_t begin, uint64_t end, uint8_t **start,
                      size_t *len) {
  if (!g->owns_mapping || end > g->size || begin >= end) return false;
  const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  const uint64_t a = begin / page * page, b = (end + page - 1) / page * page;
  *start = (uint8_t *)g->base + a;
  *len = (size_t)((b < g->size ? b : (g->size + page - 1) / page * page) - a);
  return true;
}

void npu_gguf_drop(const struct npu_gguf *g, uint64_t begin, uint64_t end, bool uncache) {
  uint8_t *start;
  size_t len;
  if (!page_span(g, begin, end, &start, &len)) return;
  (void)madvise(start, len, MADV_DONTNEED); /* a private mapping never written: file pages */
  if (uncache && g->fd >= 0) {
    (void)posix_fadvise(g->fd, (off_t)(start - g->base), (off_t)len, POSIX_FADV_DONTNEED);
  }
}

void npu_gguf_prefetch(const struct npu_gguf *g, uint64_t begin, uint64_t end) {
  uint8_t *start;
  size_t len;
  if (page_span(g, begin, end, &start, &len)) (void)madvise(start, len, MADV_WILLNEED);
}

/* ---- Lookups -------------------------------------------------------------------------------- */

bool npu_gguf_str_eq(struct npu_gguf_str s, const char *cstr) {
  size_t n = strlen(cstr);
  return s.len == n && memcmp(s.ptr, cstr, n) == 0;
}

const struct npu_gguf_kv *npu_gguf_find(const struct npu_gguf *g, const char *key) {
  for (uint64_t i = 0; i < g->n_kv; i++) {
    if (npu_gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
  }
  return NULL;
}

const struct npu_gguf_tensor *npu_gguf_find_tensor(const struct npu_gguf *g, const char *name) {
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    if (npu_gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
  }
  return NULL;
}

static npulm_status find_required(const struct npu_gguf *g, const char *key,
                                  const struct npu_gguf_kv **kv, npulm_error *err) {
  *kv = npu_gguf_find(g, key);
  if (*kv == NULL) return npu_fail(err, NPULM_ERR_FORMAT, "missing metadata key '%s'", key);
  return NPULM_OK;
}

static npulm_status wrong_type(const struct npu_gguf_kv *kv, const char *key, const char *want,
                               npulm_error *err) {
  return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' is %s, expected %s", key,
                  vtype_names[kv->val.type], want);
}

static bool is_unsigned(uint32_t t) {
  return t == NPU_GGUF_U8 || t == NPU_GGUF_U16 || t == NPU_GGUF_U32 || t == NPU_GGUF_U64;
}
static bool is_signed(uint32_t t) {
  return t == NPU_GGUF_I8 || t == NPU_GGUF_I16 || t == NPU_GGUF_I32 || t == NPU_GGUF_I64;
}

npulm_status npu_gguf_get_u32(const struct npu_gguf *g, const char *key, uint32_t *out,
                              npulm_error *err) {
  const struct npu_gguf_kv *kv;
  npulm_status st = find_required(g, key, &kv, err);
  if (st != NPULM_OK) return st;
  uint32_t t = kv->val.type;
  if (is_unsigned(t) && kv->val.v.u <= UINT32_MAX) {
    *out = (uint32_t)kv->val.v.u;
  } else if (is_signed(t) && kv->val.v.i >= 0 && kv->val.v.i <= (int64_t)UINT32_MAX) {
    *out = (uint32_t)kv->val.v.i;
  } else if (is_unsigned(t) || is_signed(t)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' is out of range", key);
  } else {
    return wrong_type(kv, key, "an integer", err);
  }
  return NPULM_OK;
}

npulm_status npu_gguf_get_f32(const struct npu_gguf *g, const char *key, float *out,
                              npulm_error *err) {
  const struct npu_gguf_kv *kv;
  npulm_status st = find_required(g, key, &kv, err);
  if (st != NPULM_OK) return st;
  if (kv->val.type == NPU_GGUF_F32 || kv->val.type == NPU_GGUF_F64) {
    *out = (float)kv->val.v.f;
  } else if (is_unsigned(kv->val.type)) {
    *out = (float)kv->val.v.u;
  } else if (is_signed(kv->val.type)) {
    *out = (float)kv->val.v.i;
  } else {
    return wrong_type(kv, key, "a number", err);
  }
  if (!isfinite(*out))
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' is not finite", key);
  return NPULM_OK;
}

npulm_status npu_gguf_get_bool(const struct npu_gguf *g, const char *key, bool *out,
                               npulm_error *err) {
  const struct npu_gguf_kv *kv;
  npulm_status st = find_required(g, key, &kv, err);
  if (st != NPULM_OK) return st;
  if (kv->val.type != NPU_GGUF_BOOL) return wrong_type(kv, key, "bool", err);
  *out = kv->val.v.u != 0;
  return NPULM_OK;
}

npulm_status npu_gguf_get_str(const struct npu_gguf *g, const char *key, struct npu_gguf_str *out,
                              npulm_error *err) {
  const struct npu_gguf_kv *kv;
  npulm_status st = find_required(g, key, &kv, err);
  if (st != NPULM_OK) return st;
  if (kv->val.type != NPU_GGUF_STR) return wrong_type(kv, key, "string", err);
  *out = kv->val.v.s;
  return NPULM_OK;
}

npulm_status npu_gguf_get_arr(const struct npu_gguf *g, const char *key, int elem_type,
                              struct npu_gguf_arr *out, npulm_error *err) {
  const struct npu_gguf_kv *kv;
  npulm_status st = find_required(g, key, &kv, err);
  if (st != NPULM_OK) return st;
  if (kv->val.type != NPU_GGUF_ARR) return wrong_type(kv, key, "array", err);
  if (elem_type >= 0 && kv->val.v.a.type != (uint32_t)elem_type) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' is an array of %s, expected %s", key,
                    vtype_names[kv->val.v.a.type], vtype_names[elem_type]);
  }
  *out = kv->val.v.a;
  return NPULM_OK;
}

void npu_gguf_arr_values(const struct npu_gguf_arr *a, struct npu_gguf_value *out) {
  /* The array was validated when the file was parsed, so this walk cannot run off its end. */
  struct cursor c = {.base = a->data, .size = (size_t)a->size, .pos = 0, .err = NULL};
  for (uint64_t i = 0; i < a->n; i++) {
    bool ok = read_value(&c, a->type, &out[i], 1, "");
    (void)ok;
  }
}

double npu_gguf_arr_num(const struct npu_gguf_arr *a, uint64_t i) {
  const uint8_t *p = a->data + i * npu_gguf_vtype_size(a->type);
  switch (a->type) {
  case NPU_GGUF_U8: return *p;
  case NPU_GGUF_I8: return (int8_t)*p;
  case NPU_GGUF_BOOL: return *p != 0;
  case NPU_GGUF_U16: {
    uint16_t x;
    memcpy(&x, p, 2);
    return x;
  }
  case NPU_GGUF_I16: {
    int16_t x;
    memcpy(&x, p, 2);
    return x;
  }
  case NPU_GGUF_U32: {
    uint32_t x;
    memcpy(&x, p, 4);
    return x;
  }
  case NPU_GGUF_I32: {
    int32_t x;
    memcpy(&x, p, 4);
    return x;
  }
  case NPU_GGUF_F32: {
    float x;
    memcpy(&x, p, 4);
    return x;
  }
  case NPU_GGUF_U64: {
    uint64_t x;
    memcpy(&x, p, 8);
    return (double)x;
  }
  case NPU_GGUF_I64: {
    int64_t x;
    memcpy(&x, p, 8);
    return (double)x;
  }
  case NPU_GGUF_F64: {
    double x;
    memcpy(&x, p, 8);
    return x;
  }
  default: return 0; /* strings and arrays are not numbers */
  }
}

/* ---- Tensor data to float ------------------------------------------------------------------- */

npulm_status npu_gguf_tensor_to_f32(const struct npu_gguf_tensor *t, float *dst, npulm_error *err) {
  return npu_gguf_tensor_rows_to_f32(t, 0, t->ne[0] ? t->n_elems / t->ne[0] : 0, dst, err);
}

/* Bytes of one row (ne[0] values) of 't', whose type has a known block size. */
static uint64_t row_bytes(const struct npu_gguf_tensor *t) {
  uint32_t block, block_bytes;
  npu_ggml_type_size(t->type, &block, &block_bytes);
  /* the reader checked ne[0] % block == 0 and nbytes == n_elems / block * block_bytes */
  assert(t->ne[0] % block == 0 && t->nbytes == t->n_elems / block * block_bytes);
  return t->ne[0] / block * block_bytes;
}

npulm_status npu_gguf_tensor_rows_to_f32(const struct npu_gguf_tensor *t, uint64_t row0,
                                         uint64_t n_rows, float *dst, npulm_error *err) {
  npu_ggml_to_f32_fn to_f32 = npu_ggml_type_to_f32(t->type);
  if (to_f32 == NULL) {
    char readable[160];
    npu_ggml_readable_types(readable, sizeof(readable));
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "tensor '%.*s' has type %s, which npulm does not read (it reads %s)",
                    (int)(t->name.len < 200 ? t->name.len : 200), t->name.ptr,
                    npu_ggml_type_name(t->type), readable);
  }
  uint32_t block, block_bytes;
  npu_ggml_type_size(t->type, &block, &block_bytes);
  assert((row0 + n_rows) * t->ne[0] <= t->n_elems);
  const uint8_t *src = (const uint8_t *)t->data + row0 * row_bytes(t);
  to_f32(src, dst, (size_t)(n_rows * t->ne[0] / block));
  return NPULM_OK;
}

void npu_gguf_tensor_release_rows(const struct npu_gguf_tensor *t, uint64_t row0, uint64_t n_rows) {
  const uint64_t bytes = row_bytes(t);
  npu_pages_release((const uint8_t *)t->data + row0 * bytes, (size_t)(n_rows * bytes));
}
