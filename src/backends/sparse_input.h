/* Input-sparse decode (program/sparse_data.h, npu_input_sparse): in a decode step, a group of NPU
 * matmuls on one input whose sites have thresholds runs as input-sparse GEMVs: the input channels
 * with |x - zero point| >= the site's skip_below are listed once, and the kernels read only those
 * channels' rows of a channel-major copy of the weights, made when the run is created. The output
 * is bit for bit the dense matmul's with the other channels at their zero point
 * (tests/test_sparse_input.c). Integer-only, on the NPU backend's threads. */
#ifndef NPU_BACKENDS_SPARSE_INPUT_H
#define NPU_BACKENDS_SPARSE_INPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir.h"
#include "program/program.h"

struct npu_pool;
struct npu_input_run;

/* Counts over the decode steps run since creation or the last reset. */
struct npu_input_stats {
  uint64_t steps;          /* matmul groups run input-sparse */
  uint64_t channels;       /* input channels of their matmuls (one per matmul and channel) */
  uint64_t kept;           /* of those, the channels read */
  uint64_t bytes_read;     /* weight bytes of all decode matmuls (dense ones too) read */
  uint64_t bytes_dense;    /* what they would have read dense */
  double select_s, gemv_s; /* time thresholding the inputs, and in the sparse GEMVs */
  uint64_t decode_matmuls; /* decode matmul groups counted (sparse or dense) */
};

/* Prepare input-sparse decode of program 'p' (npu_program_input_sparse) for up to 'n_threads'
 * threads: the channel-major copies of its sparsified matmuls (their bytes in '*bytes_out', may
 * be NULL). */
npulm_status npu_input_run_create(const struct npu_program *p, int n_threads,
                                  struct npu_input_run **out, uint64_t *bytes_out,
                                  npulm_error *err);
void npu_input_run_free(struct npu_input_run *r); /* accepts NULL */

/* Whether matmuls 'first' .. 'first + count - 1' of 'g' (one group: npu_emu_matmul_group) run
 * input-sparse: a decode step, and every one of them sparsified. */
bool npu_input_run_covers(const struct npu_input_run *r, const struct npu_graph *g, int32_t first,
                          int32_t count);

/* Run that group on the threads of 'pool'. */
void npu_input_run_exec(struct npu_input_run *r, const struct npu_graph *g, int32_t first,
                        int32_t count, struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]);

/* Count a decode matmul group that ran dense (its weight bytes). */
void npu_input_run_count_dense(struct npu_input_run *r, const struct npu_graph *g, int32_t first,
                               int32_t count);

void npu_input_run_stats(const struct npu_input_run *r, struct npu_input_stats *out);
void npu_input_run_reset_stats(struct npu_input_run *r);

#endif /* NPU_BACKENDS_SPARSE_INPUT_H */
