/* ONNX model writer: a model is built in memory (graph inputs and outputs, initializers, nodes with
 * their attributes, metadata) and then written as one ONNX protobuf file, or with its initializers'
 * bytes in a second file beside it ("external data", needed past protobuf's 2 GiB message limit).
 * The protobuf wire format and ONNX's message fields (onnx/onnx.proto: ModelProto, GraphProto,
 * NodeProto, AttributeProto, TensorProto, ValueInfoProto, TypeProto, TensorShapeProto,
 * OperatorSetIdProto, StringStringEntryProto) are written by hand here; no generated code.
 *
 * Well-formed by construction: every name is copied and checked (non-empty, at most
 * NPU_ONNX_NAME_MAX bytes, no NUL), every value (graph input, initializer, node output) is
 * defined once, every node input is a value defined before it (or "" for an omitted optional
 * input), every graph output is defined; npu_onnx_write refuses a model that breaks one of these
 * (NPULM_ERR_ARG naming the value), so nodes must be added in a topological order. The
 * builder keeps the first failure (out of memory, a bad name, a bad shape) and every later call
 * does nothing; npu_onnx_write reports it. */
#ifndef NPU_EXPORT_ONNX_WRITE_H
#define NPU_EXPORT_ONNX_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "npulm.h"

#define NPU_ONNX_NAME_MAX 256 /* the longest name (bytes) of a value, node or attribute */
#define NPU_ONNX_MAX_DIMS 8

/* TensorProto.DataType values (the numbers are ONNX's). */
enum npu_onnx_dtype {
  NPU_ONNX_FLOAT = 1,
  NPU_ONNX_UINT8 = 2,
  NPU_ONNX_INT8 = 3,
  NPU_ONNX_UINT16 = 4,
  NPU_ONNX_INT16 = 5,
  NPU_ONNX_INT32 = 6,
  NPU_ONNX_INT64 = 7,
};

/* Bytes of one element of 'dt' (0 for a value outside the enum). */
size_t npu_onnx_dtype_size(enum npu_onnx_dtype dt);

struct npu_onnx;      /* a model being built */
struct npu_onnx_node; /* one of its nodes, for adding attributes */

/* A new empty model: graph 'graph_name', producer "npulm" with version npulm_version(), opset
 * 'opset' of the default domain (ai.onnx). NULL if out of memory. */
struct npu_onnx *npu_onnx_new(const char *graph_name, int64_t opset);
void npu_onnx_free(struct npu_onnx *o); /* accepts NULL */

/* The first failure so far (NPULM_OK if none), copied to '*err' (may be NULL). */
npulm_status npu_onnx_status(const struct npu_onnx *o, npulm_error *err);

/* ModelProto.metadata_props entry; ModelProto.doc_string. */
void npu_onnx_metadata(struct npu_onnx *o, const char *key, const char *value);
void npu_onnx_doc(struct npu_onnx *o, const char *doc);

/* A graph input / output of type tensor(dt) with a static shape (nd <= NPU_ONNX_MAX_DIMS dims,
 * each >= 1). Outputs are listed in the order added; an output must be defined (by a node or
 * an input) by the time the model is written. */
void npu_onnx_input(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                    const int64_t *dims);
void npu_onnx_output(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                     const int64_t *dims);

/* An initializer whose bytes (product of dims times the element size, little-endian) the builder
 * copies now: for small tensors (scales, zero points, shapes). nd may be 0 (a scalar). */
void npu_onnx_init_copy(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                        const int64_t *dims, const void *data);

/* An initializer whose bytes are produced when the model is written, by fill(user, dst), dst
 * being a buffer of the tensor's size (any alignment of 8 or more): for large tensors (weights)
 * that the caller makes (unpacks) on demand, so no more than one is in memory at a time. 'user'
 * must stay valid until npu_onnx_write returns. fill returns false to fail the write (it may
 * then have set nothing: the write reports NPULM_ERR_ARG naming the tensor). */
typedef bool npu_onnx_fill_fn(void *user, void *dst);
void npu_onnx_init_lazy(struct npu_onnx *o, const char *name, enum npu_onnx_dtype dt, int nd,
                        const int64_t *dims, npu_onnx_fill_fn *fill, void *user);

/* Scalar and 1-D shorthands of npu_onnx_init_copy. */
void npu_onnx_init_f32(struct npu_onnx *o, const char *name, float v);
void npu_onnx_init_i64s(struct npu_onnx *o, const char *name, int n, const int64_t *v);

/* A node: op_type in 'domain' (NULL or "": ai.onnx; any other domain is imported with version 1
 * the first time a node uses it), named 'name' (NULL: "n<index>"), with n_in inputs and n_out
 * outputs (names of values; an input may be "" for an omitted optional input). Returns the node
 * for its attributes, or NULL after a failure (the attribute calls accept NULL). */
struct npu_onnx_node *npu_onnx_node(struct npu_onnx *o, const char *op_type, const char *domain,
                                    const char *name, int n_in, const char *const *in, int n_out,
                                    const char *const *out);
void npu_onnx_attr_int(struct npu_onnx_node *n, const char *name, int64_t v);
void npu_onnx_attr_float(struct npu_onnx_node *n, const char *name, float v);
void npu_onnx_attr_ints(struct npu_onnx_node *n, const char *name, int count, const int64_t *v);
void npu_onnx_attr_string(struct npu_onnx_node *n, const char *name, const char *v);

/* Whether 'name' is a value defined so far (input, initializer or node output). */
bool npu_onnx_has_value(const struct npu_onnx *o, const char *name);

struct npu_onnx_write_options {
  /* Put the bytes of every initializer of 1 KiB or more in '<path>.data' (ONNX external data:
   * location = that file's base name, offset, length; offsets 64-byte aligned) instead of inside
   * the model (smaller ones stay: shapes, scales). The write does so anyway when the model would
   * pass protobuf's 2 GiB limit. No data file is written when no initializer is that large. */
  bool external;
  /* called as initializer bytes are written (may be NULL) */
  void (*progress)(void *user, uint64_t done, uint64_t total);
  void *progress_user;
  /* NULL, or the key of a metadata_props entry appended last to the model, holding
   * npu_onnx_initializers_digest as 16 lower-case hex digits: a check that the weights a reader
   * holds are the ones written, inside the model or in its data file */
  const char *checksum_key;
};

/* The digest of the initializers the last write wrote: XXH3-64 over the little-endian 8-byte
 * XXH3-64 of each initializer's bytes, in the order they were added (0 before a write, or if
 * out of memory). */
uint64_t npu_onnx_initializers_digest(const struct npu_onnx *o);

/* Check the model (see the top of this file) and write it to 'path' (and '<path>.data' when
 * external), each file whole or not at all (base/atomic_file.h): the data file first, then the
 * model (the data file is removed again if the model cannot be written). 'opts' may be NULL
 * (defaults: inside, no progress). '*external_out' (may be NULL) is set to whether some initializer
 * went to the data file. */
npulm_status npu_onnx_write(struct npu_onnx *o, const char *path,
                            const struct npu_onnx_write_options *opts, bool *external_out,
                            npulm_error *err);

/* Into a growable memory buffer instead (tests): the model file's bytes, always with the
 * initializers inside (NPULM_ERR_UNSUPPORTED past 2 GiB). '*data_out' is malloc'd. */
npulm_status npu_onnx_write_mem(struct npu_onnx *o, uint8_t **data_out, size_t *size_out,
                                npulm_error *err);

#endif /* NPU_EXPORT_ONNX_WRITE_H */
