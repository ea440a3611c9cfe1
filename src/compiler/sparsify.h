/* The sparse decode data of a program (program/sparse_data.h), built at compile time from the
 * weights and calibration inputs alone (no training): the predictor from the range of the gate's
 * outputs over the calibration inputs (a randomized low-rank fit), the thresholds from their
 * distribution. */
#ifndef NPU_COMPILER_SPARSIFY_H
#define NPU_COMPILER_SPARSIFY_H

#include <stdint.h>

#include "program/program.h"
#include "program/sparse_data.h"

/* What the predictor's candidates must cover by default, by calibration |SiLU(gate)| mass, of
 * the neurons the thresholds keep: on stories27M at rank dim / 8 this keeps decode perplexity
 * within 0.3 % of the exact gate's (bench/ACCURACY.md), and 0.99 does not. */
#define NPU_SPARSE_RECALL 0.998

/* Build the sparse decode data of integer program 'p' (w8a8, without shadow outliers: the FFN
 * of every decode graph is gate and up matmuls, SiLU, product and down matmul on the NPU) for
 * skipping a share 'level' in [0, 1) of each layer's neurons, with predictors of 'rank' whose
 * candidates cover 'recall' (0: NPU_SPARSE_RECALL) of the kept mass (rank 0: dim / 8, a multiple
 * of 16, and none in a layer where a predictor does not pay: drop_unpaid_predictor), from 'n'
 * calibration inputs: 'x[l]' holds layer l's n FFN inputs [n, dim], int8 as its decode
 * graphs' FFN norm writes them. Sets p->sparse. */
npulm_status npu_sparse_build(struct npu_program *p, const struct npu_config *cfg,
                              const int8_t *const *x, int32_t n, float level, int32_t rank,
                              double recall, npulm_error *err);

#endif /* NPU_COMPILER_SPARSIFY_H */
