/* A compiled program: the static graphs of every specialization of one model, with placement and
 * memory plan, the table of weights they reference and, for the integer NPU, the integer data of
 * every NPU operation. It is the contract between the compiler, which builds it (compiler/), and
 * everything that runs or reads it: the executor, the runtime, inspect, diff and export, and its
 * file format (program_file.h). Here: its types, who owns what, and the lookups they all share. */
#ifndef NPU_PROGRAM_PROGRAM_H
#define NPU_PROGRAM_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/ir.h"
#include "kernels/npu/npu_ukernels.h"
#include "model/model.h"
#include "program/quant_mode.h"

#define NPU_MAX_CHUNKS 8
#define NPU_MAX_BUCKETS 32
#define NPU_INPUT_AUTO_LEVELS 4 /* the levels input-sparse --sparsity auto tries */

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
  /* Predicted sparse decode (program/sparse_data.h): predictors, thresholds and neuron bundles of
   * every layer's FFN; NULL: decode is dense. */
  struct npu_sparse *sparse;
  /* Input-sparse decode (sparse_data.h, npu_input_sparse): the share of each sparsified matmul's
   * input channels a decode step skips on the calibration text (0: none; the sites' skip_below
   * hold the thresholds), and --sparsity auto's decode perplexity over dense's at each level it
   * tried (0: not tried) */
  float input_sparsity;
  float input_auto_ratio[NPU_INPUT_AUTO_LEVELS];
  /* Loaded under a memory budget (npulm_model.mem_budget): the matmul sites whose packed weights
   * stay in the file's mapping, read at each use (n_qsites flags, npu_sparse_streamed), and the
   * bytes of weights held in memory; NULL and 0 otherwise. */
  uint8_t *streamed;
  uint64_t held_bytes;
};

/* Integer data of one NPU operation, shared by every specialization (keyed by the name of the
 * tensor the operation writes, e.g. "blk.3.ffn_down"). */
struct npu_qsite {
  char name[NPU_IR_NAME_MAX];
  uint8_t op; /* enum npu_op */
  /* matmul: packed int8 weights (npu_qs8_gemm_pack) [n, k]; gather: int8 table [n rows, k], or
   * (table_site >= 0) the packed weights of that matmul site, whose int8 values are the table's
   * (a tied embedding is stored once) */
  int32_t n, k;
  void *packed;
  int32_t table_site; /* -1, or the matmul site whose packed weights a gather reads */
  uint64_t packed_size;
  int32_t *mult, *shift; /* (n) per output channel (matmul) or per table row (gather); an
                            RMSNORM's per-channel multipliers (mult only, n = its width) */
  /* matmul weights: 8 bits (npu_qs8_gemm_pack's layout) or 4 (npu_qc4w_gemm_pack's, one scale
   * per channel if w_block is 0, else blocks of NPU_QC4W_BLOCK with integer block scales) */
  uint8_t w_bits, w_block;
  struct npu_qs8_gemm_params gemm;    /* int8 input */
  struct npu_qs16_gemm_params gemm16; /* int16 input: its acc_shift, zero point and block */
  struct npu_qs8_gather_params gather;
  struct npu_qadd_params add;
  struct npu_qmul_params mul;
  struct npu_qs8_qk_params qk;            /* attention scores (QK) */
  struct npu_qs16_softmax_params softmax; /* SOFTMAX */
  struct npu_qs16_pv_params pv;           /* attention output (PV) */
  struct npu_qs16_rmsnorm_params rmsnorm; /* RMSNORM: n channels, its multipliers in 'mult' */
  int8_t lut[256];                        /* SILU of int8 */
  int16_t lut16[NPU_QS16_LUT_SIZE];       /* SILU of int16 (lut_wide) */
  uint8_t lut_wide;
  /* shadow outliers of a matmul: input channels computed in float on the CPU */
  int32_t n_outliers;
  int32_t *outliers; /* (n_outliers) input channel indices */
  float *outlier_w;  /* (n, n_outliers) the weights of those channels */
  /* when the input is the FFN product silu(gate) * up, which lives only on the NPU, the CPU
   * recomputes its outlier channels from the FFN norm output: gate and up rows of them */
  float *outlier_gate; /* (n_outliers, dim) or NULL */
  float *outlier_up;   /* (n_outliers, dim) or NULL */
  int32_t outlier_dim;
  /* input-sparse decode of a matmul (program/sparse_data.h, npu_input_sparse): a decode step
   * skips input channel c when |x[c] - x_zero_point| < skip_below, an integer in the input's own
   * units (0: the matmul runs dense); skip_keep is the share of channels it kept on the
   * calibration text */
  int32_t skip_below;
  float skip_keep;
};

/* Quantization parameters of a named tensor (the same in every graph). */
struct npu_qtensor {
  char name[NPU_IR_NAME_MAX];
  uint8_t dtype;
  struct npu_qparams q;
};

/* Check 'o' against the model: sizes positive and ascending, buckets within the context. */
npulm_status npu_compile_check_options(const struct npu_config *cfg,
                                       const struct npu_compile_options *o, npulm_error *err);

/* The weight table's order (npu_weight_table): the globals, then the same twelve per layer. */
enum { NPU_W_EMBD, NPU_W_OUT_NORM, NPU_W_OUTPUT, NPU_W_GLOBALS };
enum {
  NPU_LW_ATTN_NORM,
  NPU_LW_Q,
  NPU_LW_K,
  NPU_LW_V,
  NPU_LW_BQ,
  NPU_LW_BK,
  NPU_LW_BV,
  NPU_LW_O,
  NPU_LW_FFN_NORM,
  NPU_LW_GATE,
  NPU_LW_UP,
  NPU_LW_DOWN,
  NPU_LW_COUNT
};

/* The index in the weight table of weight 'which' (NPU_LW_*) of block 'layer'. */
static inline int32_t npu_layer_weight(int32_t layer, int32_t which) {
  return NPU_W_GLOBALS + layer * NPU_LW_COUNT + which;
}

/* The weight table of a model: every weight the graphs may reference, in a fixed order. The
 * returned array (n entries) points into the model; free it with free(). */
npulm_status npu_weight_table(const struct npulm_model *m, struct npu_weight **out, int32_t *n,
                              npulm_error *err);

/* Whether the executor reads node 'n' of program 'p' in float: every node of an FP32 program,
 * the CPU's of an integer one (an integer NPU node reads its site's integer data instead of its
 * weights). */
static inline bool npu_node_reads_float(const struct npu_program *p, const struct npu_ir_node *n) {
  return p->quant_mode == NPU_QUANT_F32 || n->backend != NPU_BE_NPU;
}

/* Which weights the executor reads in float: 'reads_out[i]' (for i < p->n_weights) is set when a
 * node of some graph that npu_node_reads_float has weight i as an input. A program file holds
 * these; the others, read only by the integer NPU, it may leave out (keep_float). */
void npu_program_float_weights(const struct npu_program *p, bool *reads_out);

void npu_program_free(struct npu_program *p); /* accepts NULL */

/* The graph that serves a step of 'rows' tokens (1 = decode) ending at cache position 'end'
 * (exclusive): the given row count with the smallest bucket >= end, computing the logits of
 * every row, or with 'last_logits' of the last real row only (for decode the two are one). NULL
 * if none does. */
const struct npu_graph *npu_program_find(const struct npu_program *p, int32_t rows, int32_t end,
                                         bool last_logits);

/* True when the precision policy 'float_ops' keeps every part of attention (QK, SOFTMAX, PV) on
 * the CPU: the graph then computes it with the fused online-softmax op, NPU_OP_ATTN. */
bool npu_attention_fused(uint32_t float_ops);

/* Why an op runs on the CPU under 'float_ops' (NULL if it runs on the NPU). */
const char *npu_fallback_reason(enum npu_op op, uint32_t float_ops);

/* Point each NPU node of 'g' at its integer data in 'p' (g->node_site), found by the name of
 * its output, and each SHADOW node at that of the matmul whose sum reads its share; a node
 * without data, or with data of another op, is an error naming it. */
npulm_status npu_quant_link(const struct npu_program *p, struct npu_graph *g, npulm_error *err);

/* Move the packed weights of every matmul site of 'p' into one block of huge pages
 * (npu_pages_alloc_huge), each 64-byte aligned, freeing their heap copies or releasing their
 * pages of the program file's mapping as it goes, so that the weights are never held twice;
 * gathers that borrow a matmul's weights follow them. */
npulm_status npu_quant_place_packed(struct npu_program *p, npulm_error *err);
/* The same for the sites not flagged in 'leave' (n_qsites flags; a memory budget's streamed
 * sites, npu_sparse_streamed, stay in the file's mapping), in small pages: under a budget a huge
 * page's rounding would count against it. */
npulm_status npu_quant_place_packed_but(struct npu_program *p, const uint8_t *leave,
                                        npulm_error *err);

/* Free the integer data of 'p' (back to FP32 quant_mode). */
void npu_quant_free(struct npu_program *p);

/* Bytes of the packed weights of matmul site 's' ([n, k] in its w_bits / w_block format), or 0
 * for a format no kernel reads. */
uint64_t npu_matmul_packed_size(const struct npu_qsite *s);
/* The same for its first 'rows' rows of 'cols' weights. */
uint64_t npu_matmul_rows_packed_size(const struct npu_qsite *s, size_t rows, size_t cols);

/* Lookups by name; NULL if absent. */
const struct npu_qsite *npu_program_qsite(const struct npu_program *p, const char *name);
const struct npu_qtensor *npu_program_qtensor(const struct npu_program *p, const char *name);

/* The value 'v' (n channels) of the activation of 'role' in block 'layer' as program 'p' computes
 * it, made the unsmoothed model's: multiplied by the factors p->smooth_factors holds for it (no
 * change for an activation no group divides, or a program without them). What npulm diff
 * compares with the reference. */
void npu_smooth_unsmooth(const struct npu_program *p, const struct npu_config *c, int32_t layer,
                         enum npu_tensor_role role, float *v, int32_t n);

#endif /* NPU_PROGRAM_PROGRAM_H */
