/* GGUF v2/v3 reader: the file is mmap'd and used in place; every count, length, offset and shape
 * is checked against the file size before use. Spec: ggml/docs/gguf.md. */
#ifndef NPU_IO_GGUF_H
#define NPU_IO_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/ggml_blocks.h" /* tensor types, their sizes and dequantizers, f16 */
#include "npulm.h"

/* Metadata value types, numbered as in the file. */
enum npu_gguf_vtype {
  NPU_GGUF_U8 = 0,
  NPU_GGUF_I8 = 1,
  NPU_GGUF_U16 = 2,
  NPU_GGUF_I16 = 3,
  NPU_GGUF_U32 = 4,
  NPU_GGUF_I32 = 5,
  NPU_GGUF_F32 = 6,
  NPU_GGUF_BOOL = 7,
  NPU_GGUF_STR = 8,
  NPU_GGUF_ARR = 9,
  NPU_GGUF_U64 = 10,
  NPU_GGUF_I64 = 11,
  NPU_GGUF_F64 = 12,
  NPU_GGUF_VTYPE_COUNT
};

/* A string inside the mapping: not NUL-terminated. */
struct npu_gguf_str {
  const char *ptr;
  uint64_t len;
};

/* An array value: 'n' elements of 'type' stored back to back at 'data' ('size' bytes). */
struct npu_gguf_arr {
  uint32_t type;
  uint64_t n;
  const uint8_t *data;
  uint64_t size;
};

struct npu_gguf_value {
  uint32_t type; /* enum npu_gguf_vtype */
  union {
    uint64_t u; /* U8, U16, U32, U64, BOOL */
    int64_t i;  /* I8, I16, I32, I64 */
    double f;   /* F32, F64 */
    struct npu_gguf_str s;
    struct npu_gguf_arr a;
  } v;
};

struct npu_gguf_kv {
  struct npu_gguf_str key;
  struct npu_gguf_value val;
};

#define NPU_GGUF_MAX_DIMS 4

struct npu_gguf_tensor {
  struct npu_gguf_str name;
  uint32_t n_dims;
  uint64_t ne[NPU_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
  uint32_t type;                  /* enum npu_ggml_type or another ggml type id */
  uint64_t offset;                /* from the start of the data section */
  uint64_t n_elems;
  uint64_t nbytes;
  const void *data; /* inside the mapping; checked to lie within the file */
};

struct npu_gguf {
  const uint8_t *base; /* the whole file */
  size_t size;
  bool owns_mapping;
  uint64_t file_dev; /* the mapped file's device and inode (npu_gguf_open; 0 for an image) */
  uint64_t file_ino;
  /* its size and modification time when opened, before anything was read (npu_gguf_changed) */
  uint64_t file_size, file_mtime_ns;
  int fd; /* the mapped file, open for reading (npu_gguf_open), or -1 (an image) */
  /* Under a memory budget: pages are let go of as soon as they have been read through (the
   * checksums, npu_gguf_drop), so that reading the file once does not make it resident. */
  bool stream;
  uint32_t version;
  uint32_t alignment;
  uint64_t data_offset;
  uint64_t n_kv;
  struct npu_gguf_kv *kv;
  uint64_t n_tensors;
  struct npu_gguf_tensor *tensors;
};

/* Map and parse 'path'. Return NPULM_OK and '*out', or an error naming the problem. */
npulm_status npu_gguf_open(const char *path, struct npu_gguf **out, npulm_error *err);
/* Parse a file image already in memory (tests, fuzzing); 'data' must outlive the result. */
npulm_status npu_gguf_open_memory(const void *data, size_t size, struct npu_gguf **out,
                                  npulm_error *err);
void npu_gguf_close(struct npu_gguf *g); /* accepts NULL */
/* Whether the file 'g' maps was written since it was opened (its size or modification time
 * moved): its bytes, checksummed when opened, may then be others. A file put in its place by a
 * rename is another file and does not count (the change time would: the rename unlinks the old
 * one). One fstat; false for an image. Exact where the kernel stamps a write after a look at the
 * times with a time of its own (Linux 6.13 and later on ext4, xfs, btrfs, tmpfs); elsewhere a
 * write within one clock tick of the open may be missed, and so is one whose writer set the
 * modification time back on purpose. */
bool npu_gguf_changed(const struct npu_gguf *g);
/* Whether 'path' names the file 'g' was read from (by device and inode: a write to 'path' would
 * replace it, whatever the name it was opened by); false for an image. */
bool npu_gguf_is_file(const struct npu_gguf *g, const char *path);

/* Let go of bytes [begin, end) of the file (the whole pages they touch): out of this process's
 * resident set and, with 'uncache', out of the page cache too (clean pages), so that the next
 * read comes from storage. Nothing for an image. */
void npu_gguf_drop(const struct npu_gguf *g, uint64_t begin, uint64_t end, bool uncache);
/* Ask the kernel to start reading bytes [begin, end) into the page cache (readahead). */
void npu_gguf_prefetch(const struct npu_gguf *g, uint64_t begin, uint64_t end);

bool npu_gguf_str_eq(struct npu_gguf_str s, const char *cstr);

/* NULL if absent. */
const struct npu_gguf_kv *npu_gguf_find(const struct npu_gguf *g, const char *key);
const struct npu_gguf_tensor *npu_gguf_find_tensor(const struct npu_gguf *g, const char *name);

/* Typed getters. A missing key or a value of the wrong type (or out of range for the result) is
 * an error naming the key; integer getters accept any integer type that fits. */
npulm_status npu_gguf_get_u32(const struct npu_gguf *g, const char *key, uint32_t *out,
                              npulm_error *err);
npulm_status npu_gguf_get_f32(const struct npu_gguf *g, const char *key, float *out,
                              npulm_error *err);
npulm_status npu_gguf_get_bool(const struct npu_gguf *g, const char *key, bool *out,
                               npulm_error *err);
npulm_status npu_gguf_get_str(const struct npu_gguf *g, const char *key, struct npu_gguf_str *out,
                              npulm_error *err);
/* An array; if 'elem_type' >= 0 its elements must have that type. */
npulm_status npu_gguf_get_arr(const struct npu_gguf *g, const char *key, int elem_type,
                              struct npu_gguf_arr *out, npulm_error *err);

/* Decode all a->n elements of an (already validated) array into 'out', which holds a->n values;
 * nested arrays and strings point into the mapping. */
void npu_gguf_arr_values(const struct npu_gguf_arr *a, struct npu_gguf_value *out);
/* Element i of a numeric array, converted. */
double npu_gguf_arr_num(const struct npu_gguf_arr *a, uint64_t i);

/* Bytes of a fixed-width metadata value type; 0 for string, array and unknown types. */
size_t npu_gguf_vtype_size(uint32_t type);

/* Convert a tensor to 't->n_elems' floats at 'dst' exactly as llama.cpp dequantizes it (any type
 * with a dequantizer in ggml_blocks.h: F32, F16, BF16, the 32-value Q4_0..Q8_0 and IQ4_NL, the
 * K-quants Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0); any other type is NPULM_ERR_UNSUPPORTED naming the
 * type and the tensor. The reader has checked the shape and data size against the type. */
npulm_status npu_gguf_tensor_to_f32(const struct npu_gguf_tensor *t, float *dst, npulm_error *err);

/* Rows [row0, row0 + n_rows) of a tensor (a row is ne[0] values, a whole number of blocks) as
 * floats at 'dst' (n_rows * ne[0] of them), as npu_gguf_tensor_to_f32 converts them: a matrix
 * read a block of rows at a time. The rows must lie within the tensor. */
npulm_status npu_gguf_tensor_rows_to_f32(const struct npu_gguf_tensor *t, uint64_t row0,
                                         uint64_t n_rows, float *dst, npulm_error *err);

/* Let go of this process's copies of the pages holding rows [row0, row0 + n_rows) of 't' (of a
 * mapped file; they stay in the page cache): once read, so that reading a model a layer at a time
 * does not leave every page of it resident. */
void npu_gguf_tensor_release_rows(const struct npu_gguf_tensor *t, uint64_t row0, uint64_t n_rows);

#endif /* NPU_IO_GGUF_H */
