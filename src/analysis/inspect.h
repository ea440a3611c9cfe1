/* What inspect counts in a program beyond the public npulm_inspect: the MACs of a step. */
#ifndef NPU_ANALYSIS_INSPECT_H
#define NPU_ANALYSIS_INSPECT_H

#include <stdint.h>

#include "program/program.h"

/* Multiply-accumulates of one step of a graph, by kind and by where and how they run. A weight
 * matmul (MATMUL) counts rows * N * K; an attention matmul (QK, PV) heads * rows * ctx * head_dim
 * (the whole bucket, as the static graph computes it). */
struct npu_mac_stats {
  uint64_t matmul;         /* weight matmuls, all of them */
  uint64_t matmul_npu;     /* of which on the NPU backend (FP32 or integer) */
  uint64_t matmul_int8;    /* of which in int8 on the NPU: a quantized program's NPU matmuls, less
                              the outlier channels' share (rows * N * n_outliers), which ... */
  uint64_t matmul_shadow;  /* ... the CPU computes in float (shadow outlier execution) */
  uint64_t shadow_extra;   /* float MACs the CPU spends recomputing FFN outlier channels from the
                              FFN norm output (gate and up rows: 2 * rows * n_outliers * dim) */
  uint64_t attention;      /* QK and PV */
  uint64_t attention_npu;  /* of which on the NPU backend */
  uint64_t attention_int8; /* of which in int8 (a quantized program's NPU QK and PV) */
  int32_t n_outliers;      /* outlier channels of the matmuls the graph runs (sum of n_outliers
                              over its shadowed NPU matmuls) */
  int32_t n_shadowed;      /* NPU matmuls with outlier channels */
};

/* Count the MACs of one step of graph 'g' of program 'p' (either kind of program). */
void npu_program_mac_stats(const struct npu_program *p, const struct npu_graph *g,
                           struct npu_mac_stats *out);

#endif /* NPU_ANALYSIS_INSPECT_H */
