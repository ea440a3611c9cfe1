/* What the quantizer's three parts share (quantize.c the pass, quant_sites.c the per-op integer
 * data, quant_rewrite.c the graph rewrites); nothing outside the quantizer includes it. */
#ifndef NPU_COMPILER_QUANT_INTERNAL_H
#define NPU_COMPILER_QUANT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "compiler/calibrate.h"
#include "compiler/quantize.h"
#include "program/program.h"

/* True if the CPU can compute the outlier channels of a matmul reading tensor 'x' in float: the
 * value exists on the CPU (made there), or it is the FFN product, which the CPU recomputes from
 * the FFN norm output. An input the NPU makes (the attention output, when P.V runs there) is not:
 * its matmul gets no shadow, and its int8 range covers all channels. */
bool npu_quant_shadowable(const struct npu_graph *g, int32_t x);

/* The name of the NPU's int8 copy of the K (or V) cache of 'layer' (its quantization's key). */
void npu_quant_kv_copy_name(int32_t layer, bool value, char name[NPU_IR_NAME_MAX]);

/* Input channels of 'stats' whose calibrated magnitude exceeds 'threshold' times the median, into
 * 'out'; their count, or -1 out of memory. */
int32_t npu_quant_find_outliers(const struct npu_act_stats *st, float threshold, int32_t *out);

/* Rows [r0, r0 + n) of weight 'wi' as floats at '*out': where the table has them, else read from
 * the model into 'scratch' (a streaming compile's embedding and classifier, never whole in
 * memory). */
npulm_status npu_quant_weight_rows(const struct npulm_model *m, const struct npu_program *p,
                                   int32_t wi, size_t r0, size_t n, float *scratch,
                                   const float **out, npulm_error *err);

/* The integer data of NPU node 'n' of graph 'g', appended to p->qsites, from its tensors'
 * quantization (p->qtensors) and its weights (matmul and gather: quantized on 'pool', which
 * may be NULL for the others). */
npulm_status npu_quant_make_site(const struct npulm_model *m, struct npu_program *p,
                                 const struct npu_graph *g, const struct npu_ir_node *n,
                                 const struct npu_calib *cal, const struct npu_quant_options *o,
                                 struct npu_pool *pool, npulm_error *err);

/* A gather whose table equals a matmul's packed weights (the classifier of a model whose output
 * shares the token embedding) reads it from there: the int8 matrix is kept once. */
void npu_quant_share_tables(struct npu_program *p);

/* Give a graph the program's integer form: NPU tensors take their dtype and scale; the NPU's
 * classifier writes int16 logits that a CPU transfer dequantizes; every TRANSFER (quantize or
 * dequantize) runs on the CPU; then subgraphs and the plan are made again. */
npulm_status npu_quant_rewrite_graph(const struct npu_program *p, struct npu_graph *g,
                                     npulm_error *err);

#endif /* NPU_COMPILER_QUANT_INTERNAL_H */
