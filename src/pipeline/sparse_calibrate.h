/* The compile's sparse decode step: calibration inputs from decoding the quantized program, then
 * the predictors, thresholds and bundles (compiler/sparsify.h), at a given level or the largest
 * within tolerance of dense. */
#ifndef NPU_PIPELINE_SPARSE_CALIBRATE_H
#define NPU_PIPELINE_SPARSE_CALIBRATE_H

#include <stdint.h>

#include "npulm.h"
#include "program/program.h"

/* Perplexity tolerance of --sparsity auto: decode perplexity on the calibration text at most
 * this factor of dense. */
#define NPU_SPARSE_AUTO_TOLERANCE 1.01

/* Give integer program 'p' of 'model' sparse decode data for 'level' (or NPULM_SPARSITY_AUTO)
 * with predictors of 'rank' (0: the default), calibrated on 'tokens' ('bos' first in each window
 * if >= 0), decoded one at a time. */
npulm_status npu_sparse_calibrate(const npulm_model *model, struct npu_program *p, float level,
                                  int32_t rank, const int32_t *tokens, size_t n_tokens, int32_t bos,
                                  const npulm_compile_params *params, npulm_error *err);

/* Give integer program 'p' of 'model' input-sparse decode (program/sparse_data.h,
 * npu_input_sparse) at 'level' (or NPULM_SPARSITY_AUTO): thresholds on every block matmul's
 * input from the inputs of decoding 'tokens' one at a time ('bos' first in each window if >= 0). */
npulm_status npu_input_calibrate(const npulm_model *model, struct npu_program *p, float level,
                                 const int32_t *tokens, size_t n_tokens, int32_t bos,
                                 const npulm_compile_params *params, npulm_error *err);

#endif /* NPU_PIPELINE_SPARSE_CALIBRATE_H */
