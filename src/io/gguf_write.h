/* GGUF v3 writer: metadata of every value type, tensor infos with 'general.alignment' padding, and
 * tensor data streamed in declaration order, to a file (any size) or to a growable memory buffer
 * (tests that then corrupt bytes). Spec: ggml/docs/gguf.md. Quantizers are in ggml_blocks.h. */
#ifndef NPU_IO_GGUF_WRITE_H
#define NPU_IO_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"
#include "npulm.h"

/* ---- Little-endian byte buffer ------------------------------------------------------------ */

/* A growable byte buffer with a sticky failure flag: once an allocation fails every later put is
 * ignored and 'failed' stays true, so a sequence of puts needs one check at the end. Tests use it
 * to hand-craft (hostile) GGUF images; the writer uses it for the header. Zero-initialize it. */
struct npu_gguf_buf {
  uint8_t *data;
  size_t size;
  size_t cap;
  bool failed;
};

void npu_gguf_buf_free(struct npu_gguf_buf *b); /* frees the bytes, resets to empty; accepts NULL */
void npu_gguf_buf_put(struct npu_gguf_buf *b, const void *bytes, size_t n);
void npu_gguf_buf_put_zeros(struct npu_gguf_buf *b, size_t n);
void npu_gguf_buf_put_u8(struct npu_gguf_buf *b, uint8_t v);
void npu_gguf_buf_put_u16(struct npu_gguf_buf *b, uint16_t v);
void npu_gguf_buf_put_u32(struct npu_gguf_buf *b, uint32_t v);
void npu_gguf_buf_put_u64(struct npu_gguf_buf *b, uint64_t v);
void npu_gguf_buf_put_f32(struct npu_gguf_buf *b, float v);
void npu_gguf_buf_put_f64(struct npu_gguf_buf *b, double v);
/* A GGUF string: u64 length, then the bytes (no NUL). */
void npu_gguf_buf_put_str(struct npu_gguf_buf *b, const char *s);
void npu_gguf_buf_put_strn(struct npu_gguf_buf *b, const char *s, size_t len);

/* ---- Writer ------------------------------------------------------------------------------- */

/* Lifecycle: open (file or memory) -> add metadata (any order) -> add_tensor for every tensor ->
 * tensor data, tensor by tensor in declaration order (write_tensor, or write_data in chunks) ->
 * finish -> free. The header is written when the first data byte arrives (or at finish), so all
 * metadata and tensor declarations must come before any data. Only the header (metadata + tensor
 * infos) is held in memory in file mode. Every call after a failure returns the first failure
 * again, so callers may check only the last status. */
struct npu_gguf_writer;

/* Start a file that replaces 'path' at finish, written whole or not at all (atomic_file.h): until
 * a successful finish the target keeps its old contents, and a writer freed before one leaves no
 * trace. NPULM_ERR_IO names the path on failure. */
npulm_status npu_gguf_writer_open_file(const char *path, struct npu_gguf_writer **w_out,
                                       npulm_error *err);
/* Start an in-memory image; fetch it with npu_gguf_writer_take_memory after finish. */
npulm_status npu_gguf_writer_open_memory(struct npu_gguf_writer **w_out, npulm_error *err);
void npu_gguf_writer_free(struct npu_gguf_writer *w); /* accepts NULL */

/* The writer's first failure so far (NPULM_OK if none), its message copied to 'err': the add_*
 * calls take no 'err', so a caller that checks only their statuses fetches the message here. */
npulm_status npu_gguf_writer_status(const struct npu_gguf_writer *w, npulm_error *err);

/* The header's version field (default 3; 2 is the same layout). Tests only: before any data. */
void npu_gguf_writer_set_version(struct npu_gguf_writer *w, uint32_t version);

/* Metadata. Keys must be unique and non-empty (NPULM_ERR_ARG otherwise). A u32 'general.alignment'
 * also sets the data alignment (a power of two; default 32) and must precede add_tensor. */
npulm_status npu_gguf_writer_add_u8(struct npu_gguf_writer *w, const char *key, uint8_t v);
npulm_status npu_gguf_writer_add_i8(struct npu_gguf_writer *w, const char *key, int8_t v);
npulm_status npu_gguf_writer_add_u16(struct npu_gguf_writer *w, const char *key, uint16_t v);
npulm_status npu_gguf_writer_add_i16(struct npu_gguf_writer *w, const char *key, int16_t v);
npulm_status npu_gguf_writer_add_u32(struct npu_gguf_writer *w, const char *key, uint32_t v);
npulm_status npu_gguf_writer_add_i32(struct npu_gguf_writer *w, const char *key, int32_t v);
npulm_status npu_gguf_writer_add_u64(struct npu_gguf_writer *w, const char *key, uint64_t v);
npulm_status npu_gguf_writer_add_i64(struct npu_gguf_writer *w, const char *key, int64_t v);
npulm_status npu_gguf_writer_add_f32(struct npu_gguf_writer *w, const char *key, float v);
npulm_status npu_gguf_writer_add_f64(struct npu_gguf_writer *w, const char *key, double v);
npulm_status npu_gguf_writer_add_bool(struct npu_gguf_writer *w, const char *key, bool v);
npulm_status npu_gguf_writer_add_str(struct npu_gguf_writer *w, const char *key, const char *v);
/* An array of 'n' fixed-size values of 'elem_type' (u8..f64, bool) stored back to back in host
 * (little-endian) layout at 'elems': e.g. int32_t[] for NPU_GGUF_I32, uint8_t 0/1 for BOOL. */
npulm_status npu_gguf_writer_add_arr(struct npu_gguf_writer *w, const char *key,
                                     enum npu_gguf_vtype elem_type, const void *elems, size_t n);
/* An array of 'n' NUL-terminated strings. */
npulm_status npu_gguf_writer_add_arr_str(struct npu_gguf_writer *w, const char *key,
                                         const char *const *strs, size_t n);
/* Any value given as its encoded bytes (what follows the type field in the file): nested arrays,
 * or deliberately malformed values in tests. The bytes are not checked. */
npulm_status npu_gguf_writer_add_raw(struct npu_gguf_writer *w, const char *key, uint32_t vtype,
                                     const void *bytes, size_t n);

/* Declare a tensor of ggml 'type' with 'n_dims' (1..4) dimensions 'ne' (ne[0] contiguous, a
 * multiple of the type's block size). Offsets are assigned in declaration order, each aligned.
 * Known types: F32, F16, BF16, Q8_0 and the other common ggml types (by size only). Sets
 * '*index_out' (may be NULL) to the tensor's index. NPULM_ERR_ARG for a bad name, shape or type. */
npulm_status npu_gguf_writer_add_tensor(struct npu_gguf_writer *w, const char *name, uint32_t type,
                                        uint32_t n_dims, const uint64_t *ne, size_t *index_out);
/* Bytes of tensor 'index' (without padding). */
uint64_t npu_gguf_writer_tensor_nbytes(const struct npu_gguf_writer *w, size_t index);
/* Bytes of the data section as declared so far, alignment padding included. */
/* Checksum the whole file: when the header is emitted, a U64 array of n_tensors + 1 values is
 * added under 'key' as the last metadata, and finish fills it in with XXH3-64 hashes (seed 0):
 * [0] of the header, bytes [0, data offset), with the array's own values read as zero; [1 + i]
 * of tensor i's data and its alignment padding. So every byte of the file is covered, and each
 * tensor can be checked on its own when it is first read (gguf_checksum.h checks them). */
npulm_status npu_gguf_writer_add_checksums(struct npu_gguf_writer *w, const char *key);

uint64_t npu_gguf_writer_data_size(const struct npu_gguf_writer *w);
/* Size of the whole file as declared so far (header, padding, all tensor data and padding). */
uint64_t npu_gguf_writer_file_size(const struct npu_gguf_writer *w);

/* Append 'n' bytes of tensor data: the bytes fill the tensors in declaration order; a chunk may
 * span tensors, and alignment padding is inserted automatically. Writing more bytes than the
 * tensors declare is NPULM_ERR_ARG. */
npulm_status npu_gguf_writer_write_data(struct npu_gguf_writer *w, const void *data, size_t n,
                                        npulm_error *err);
/* Write all of tensor 'index' (npu_gguf_writer_tensor_nbytes bytes); it must be the next one
 * whose data is due. */
npulm_status npu_gguf_writer_write_tensor(struct npu_gguf_writer *w, size_t index, const void *data,
                                          npulm_error *err);
/* Bytes of tensor data (padding included) written so far. */
uint64_t npu_gguf_writer_data_written(const struct npu_gguf_writer *w);

/* Check that every tensor's data was written, store the checksums, and put the file in place
 * (synced, then renamed over the target). */
npulm_status npu_gguf_writer_finish(struct npu_gguf_writer *w, npulm_error *err);
/* In memory mode after finish: hand over the image (free it with free()). */
npulm_status npu_gguf_writer_take_memory(struct npu_gguf_writer *w, void **data_out,
                                         size_t *size_out, npulm_error *err);

#endif /* NPU_IO_GGUF_WRITE_H */
