/* A compiled program: the static graphs of every specialization of one model, with placement and
 * memory plan, plus the table of weights they reference. It is built by npu_compile() from a
 * model, written to / read from a program file (a GGUF container, see program_file.h), and run by
 * the runtime. */
#ifndef NPU_COMPILER_PROGRAM_H
#define NPU_COMPILER_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir.h"
#include "kernels/npu/ukernels.h"
#include "model/model.h"

#define NPU_MAX_CHUNKS 8
#define NPU_MAX_BUCKETS 32

/* Ops the precision policy keeps in float on the CPU (bit mask of 1 << enum npu_op). */
#define NPU_DEFAULT_FLOAT_OPS ((1u << NPU_OP_SOFTMAX) | (1u << NPU_OP_QK) | (1u << NPU_OP_PV))

struct npu_compile_options {
  int32_t chunks[NPU_MAX_CHUNKS]; /* prefill chunk sizes, ascending (decode, 1, is implicit) */
  int32_t n_chunks;
  int32_t buckets[NPU_MAX_BUCKETS]; /* context buckets, ascending; the last is the max context */
  int32_t n_buckets;
  uint32_t float_ops; /* precision policy */
};

/* A weight the graphs read: model tensor 'name' as FP32 rows [ne1][ne0] (ne1 = 1 for vectors).
 * NULL data is a weight the model lacks (an absent bias), unless 'deferred': a matrix of a model
 * read with defer_matrices, which a streaming compile reads a layer at a time. */
struct npu_weight {
  char name[64];
  int32_t ne0, ne1;
  const float *data;
  bool deferred;
};

struct npu_qsite;
struct npu_qtensor;
struct npu_sparse;

struct npu_program {
  struct npu_compile_options opts;
  int32_t n_graphs;
  struct npu_graph *graphs; /* for each rows in {1, chunks...} (ascending), each bucket */
  int32_t n_weights;
  struct npu_weight *weights;
  uint64_t weight_bytes; /* bytes of distinct weight data */
  uint64_t kv_bytes;     /* KV cache of a session at the largest bucket */
  /* Integer NPU (set by npu_quantize_program; quant_mode 0 = the NPU computes in FP32): the
   * integer data of each NPU operation and the quantization of each named tensor. */
  int32_t quant_mode; /* enum npu_quant_mode */
  /* smooth_alpha: the alpha SmoothQuant was forced to, or -1 (NPU_SMOOTH_AUTO): chosen per block
   * and group; smooth_alphas (n_layers, 4 groups, in memory only: NULL for a program read from a
   * file): the alphas it took, -2 (NPU_SMOOTH_NONE) where it left a group alone */
  float smooth_alpha, shadow_threshold;
  float *smooth_alphas;
  /* smooth_factors (n_layers, 4 groups, in memory only like smooth_alphas): each group's factors
   * s, its input's channels divided by them (KV channels for the output projection's), or NULL
   * where it left the group alone: what npu_smooth_unsmooth needs */
  float **smooth_factors;
  int32_t n_smooth_factors;
  int32_t n_qsites;
  struct npu_qsite *qsites;
  int32_t n_qtensors;
  struct npu_qtensor *qtensors;
  int32_t n_owned;
  float **owned; /* weights the quantizer rewrote (SmoothQuant), referenced by 'weights' */
  /* Its program file holds every float weight, also those only the integer NPU reads (compile
   * --keep-float; a loaded program: its file did); else only those npu_program_float_weights
   * names. An FP32 program always holds them all. */
  bool keep_float;
  struct npu_ukernels uk; /* the integer kernels chosen for this CPU */
  /* true when the sites' 'packed' weights point into the mapping of the program file they were
   * loaded from (npu_program_load): npu_quant_free must not free() them. Everything else of a
   * site is always heap memory the program owns. */
  bool qsites_mapped;
  /* Where the matmul sites' packed weights live once placed (npu_quant_place_packed): one block
   * of huge pages, streamed by the decode GEMV on every token. NULL before. */
  uint8_t *packed_arena;
  size_t packed_arena_size;
  /* A streaming compile's packed weights (npu_quant_options.spill_dir): a file-backed scratch
   * mapping (npu_pages_map_scratch) that the sites' packed weights point into, written once and
   * let go of page by page, then read once by the save; NULL otherwise. */
  uint8_t *spill;
  size_t spill_size, spill_used;
  /* Predicted sparse decode (compiler/sparse.h): predictors, thresholds and neuron bundles of
   * every layer's FFN; NULL: decode is dense. */
  struct npu_sparse *sparse;
  /* Loaded under a memory budget (npulm_model.mem_budget): the matmul sites whose packed weights
   * stay in the file's mapping, read at each use (n_qsites flags, npu_sparse_streamed), and the
   * bytes of weights held in memory; NULL and 0 otherwise. */
  uint8_t *streamed;
  uint64_t held_bytes;
};

/* Defaults: chunks 16, 64 and 128 (those within the model's context), buckets powers of two from
 * 128 up to the model's context (which is always the last bucket), the default precision policy.
 */
void npu_compile_default_options(const struct npu_config *cfg, struct npu_compile_options *o);

/* Check 'o' against the model: sizes positive and ascending, buckets within the context. */
npulm_status npu_compile_check_options(const struct npu_config *cfg,
                                       const struct npu_compile_options *o, npulm_error *err);

/* The weight table of a model: every weight the graphs may reference, in a fixed order. The
 * returned array (n entries) points into the model; free it with free(). */
npulm_status npu_weight_table(const struct npulm_model *m, struct npu_weight **out, int32_t *n,
                              npulm_error *err);

/* Whether the executor reads node 'n' of program 'p' in float: every node of an FP32 program,
 * the CPU's of an integer one (an integer NPU node reads its site's integer data instead of its
 * weights). */
static inline bool npu_node_reads_float(const struct npu_program *p, const struct npu_ir_node *n) {
  return p->quant_mode == 0 /* NPU_QUANT_F32 */ || n->backend != NPU_BE_NPU;
}

/* Which weights the executor reads in float: 'reads_out[i]' (for i < p->n_weights) is set when a
 * node of some graph that npu_node_reads_float has weight i as an input. A program file holds
 * these; the others, read only by the integer NPU, it may leave out (keep_float). */
void npu_program_float_weights(const struct npu_program *p, bool *reads_out);

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
void npu_program_free(struct npu_program *p); /* accepts NULL */

/* The graph that serves a step of 'rows' tokens (1 = decode) ending at cache position 'end'
 * (exclusive): the given row count with the smallest bucket >= end, computing the logits of
 * every row, or with 'last_logits' of the last real row only (for decode the two are one). NULL
 * if none does. */
const struct npu_graph *npu_program_find(const struct npu_program *p, int32_t rows, int32_t end,
                                         bool last_logits);

/* Build one graph (unpartitioned, unplanned): exposed for tests. Attention is one fused ATTN op
 * where 'float_ops' keeps QK, SOFTMAX and PV all in float (npu_attention_fused), else those
 * three ops with their [heads, rows, ctx] scores and probabilities. With 'last_logits' the
 * output head runs on the last real row only (NPU_OP_LAST_ROW; logits [1, n_vocab]). */
npulm_status npu_build_graph(const struct npulm_model *m, const struct npu_weight *weights,
                             int32_t n_weights, int32_t rows, int32_t ctx, uint32_t float_ops,
                             bool last_logits, struct npu_graph *g, npulm_error *err);

/* True when the precision policy 'float_ops' keeps every part of attention (QK, SOFTMAX, PV) on
 * the CPU: the graph then computes it with the fused online-softmax op, NPU_OP_ATTN. */
bool npu_attention_fused(uint32_t float_ops);

/* Partition: place each node on the NPU if the NPU supports its op and the policy does not pin
 * it to float, else on the CPU; insert TRANSFER nodes at backend switches; form subgraphs. */
npulm_status npu_partition(struct npu_graph *g, uint32_t float_ops, npulm_error *err);

/* Plan: give every activation a fixed offset in its backend's arena, reusing memory of tensors
 * whose lifetimes do not overlap; sets arena_size. */
npulm_status npu_plan(struct npu_graph *g, npulm_error *err);

/* Why an op runs on the CPU under 'float_ops' (NULL if it runs on the NPU). */
const char *npu_fallback_reason(enum npu_op op, uint32_t float_ops);

/* ---- Statistics (inspect.c) ------------------------------------------------------------- */

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

#endif /* NPU_COMPILER_PROGRAM_H */
