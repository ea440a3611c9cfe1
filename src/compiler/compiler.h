/* The compiler's entry points: from a model to a program (program/program.h) of static graphs,
 * one per specialization, each built, partitioned and memory-planned; quantize.h makes it an
 * integer program. */
#ifndef NPU_COMPILER_COMPILER_H
#define NPU_COMPILER_COMPILER_H

#include <stdbool.h>
#include <stdint.h>

#include "program/program.h"

/* Defaults: chunks 16, 64 and 128 (those within the model's context), buckets powers of two from
 * 128 up to the model's context (which is always the last bucket), the default precision policy.
 */
void npu_compile_default_options(const struct npu_config *cfg, struct npu_compile_options *o);

/* What npulm_model_compile does, without touching the model: compile with 'params' (NULL: the
 * defaults), then calibrate and quantize as they ask. With 'spill_dir' (a model read with
 * defer_matrices), stream: see npu_quant_options.spill_dir. */
npulm_status npu_program_build(const struct npulm_model *model, const npulm_compile_params *params,
                               const char *spill_dir, struct npu_program **out, npulm_error *err);

/* Build, partition and plan every specialization; 'progress' (may be NULL) counts the graphs
 * (phase "graphs"). */
npulm_status npu_compile(const struct npulm_model *m, const struct npu_compile_options *o,
                         npulm_phase_progress_fn progress, void *user, struct npu_program **out,
                         npulm_error *err);

/* Build one graph (unpartitioned, unplanned): exposed for tests. Attention is one fused ATTN op
 * where 'float_ops' keeps QK, SOFTMAX and PV all in float (npu_attention_fused), else those
 * three ops with their [heads, rows, ctx] scores and probabilities. With 'last_logits' the
 * output head runs on the last real row only (NPU_OP_LAST_ROW; logits [1, n_vocab]). */
npulm_status npu_build_graph(const struct npulm_model *m, const struct npu_weight *weights,
                             int32_t n_weights, int32_t rows, int32_t ctx, uint32_t float_ops,
                             bool last_logits, struct npu_graph *g, npulm_error *err);

/* Partition: place each node on the NPU if the NPU supports its op and the policy does not pin
 * it to float, else on the CPU; insert TRANSFER nodes at backend switches; form subgraphs. */
npulm_status npu_partition(struct npu_graph *g, uint32_t float_ops, npulm_error *err);

/* Plan: give every activation a fixed offset in its backend's arena, reusing memory of tensors
 * whose lifetimes do not overlap; sets arena_size. */
npulm_status npu_plan(struct npu_graph *g, npulm_error *err);

#endif /* NPU_COMPILER_COMPILER_H */
