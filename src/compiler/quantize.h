/* The quantizer: turns a compiled FP32 program into an integer NPU program. From calibration
 * statistics it gives every NPU tensor a dtype and per-tensor scale, quantizes and packs the
 * weights per output channel, derives every fixed-point multiplier and lookup table, and applies
 * the chosen answer to activation outliers:
 *   naive   per-tensor int8 activations from the calibrated range, no outlier handling;
 *   shadow  llm.npu's shadow outlier execution: the input channels of a matmul whose calibrated
 *           magnitude exceeds a threshold get zero weights on the NPU (so their int8 range is set
 *           by the other channels) and are computed in float on the CPU, then added back;
 *   smooth  SmoothQuant: per input channel factors s = amax^alpha / wmax^(1-alpha) divide the
 *           activation (folded into the op before it) and multiply the weight columns; alpha
 *           fixed, or chosen per block and matmul input by a predicted error (smooth.h).
 * Conventions (documented in docs/usage.md): matmul inputs are int8 asymmetric per tensor; weights
 * int8 symmetric per output channel in [-127, 127]; the residual stream and matmul outputs that
 * leave the NPU (q, k, v, logits) are int16 symmetric; gate/up/SiLU/product are int8. Attention ops
 * the precision policy lets onto the NPU (--float-ops): q and the K/V caches int8 asymmetric (the
 * caches stay F32 on the CPU; a CPU transfer quantizes the rows a step attends over into an NPU
 * copy "blk.L.k_cache" / "blk.L.v_cache" with the calibrated scale of k_rope / attn_v); scores
 * "blk.L.kq" int16 symmetric (calibrated, scale included); probabilities "blk.L.kq_softmax" Q15
 * (int16, scale 2^-15, zero point 0); the attention output int8. */
#ifndef NPU_COMPILER_QUANTIZE_H
#define NPU_COMPILER_QUANTIZE_H

#include <stdint.h>

#include "compiler/calibrate.h"
#include "compiler/program.h"
#include "kernels/npu/ukernels.h"

/* How a program's NPU computes: a precision (the bits of its weights and of its activations) and
 * an answer to activation outliers, or FP32. Stored in program files as one number: 0 for f32,
 * else 1 + outliers + 3 * precision, so that w8a8's three modes keep the numbers 1, 2, 3 they had
 * before the other precisions came. */
enum npu_precision {
  NPU_PREC_W8A8,  /* int8 weights per output channel, int8 activations (asymmetric) */
  NPU_PREC_W8A16, /* int8 weights per output channel, int16 activations (symmetric) */
  NPU_PREC_W4A16, /* int4 weights per output channel, int16 activations */
  /* int4 weights in blocks of 32 along k, each block's scale an integer 0..15 times its
   * channel's (LPBQ), int16 activations */
  NPU_PREC_W4A16_BLOCK,
  NPU_PREC_W4A8, /* int4 weights per output channel, int8 activations */
  NPU_PREC_COUNT
};

enum npu_outliers { NPU_OUTLIERS_NAIVE, NPU_OUTLIERS_SHADOW, NPU_OUTLIERS_SMOOTH };

enum npu_quant_mode {
  NPU_QUANT_F32,   /* no quantization: the NPU backend computes in FP32 (the static-graph oracle) */
  NPU_QUANT_NAIVE, /* w8a8-naive */
  NPU_QUANT_SHADOW, /* w8a8-shadow */
  NPU_QUANT_SMOOTH, /* w8a8-smooth */
  NPU_QUANT_MODE_COUNT = 1 + 3 * NPU_PREC_COUNT
};

/* The mode of 'prec' with 'outliers'. */
static inline enum npu_quant_mode npu_quant_mode_of(enum npu_precision prec,
                                                    enum npu_outliers outliers) {
  return (enum npu_quant_mode)(1 + (int)outliers + 3 * (int)prec);
}

/* The outlier answer and the precision of an integer mode (not f32). */
static inline enum npu_outliers npu_quant_outliers(enum npu_quant_mode mode) {
  return (enum npu_outliers)(((int)mode - 1) % 3);
}
static inline enum npu_precision npu_quant_precision(enum npu_quant_mode mode) {
  return (enum npu_precision)(((int)mode - 1) / 3);
}

/* Bits of the matmuls' weights (8 or 4) and activations (8 or 16) in integer mode 'mode', and
 * the weights' block along k (0: one scale per output channel). */
int npu_quant_weight_bits(enum npu_quant_mode mode);
int npu_quant_act_bits(enum npu_quant_mode mode);
int npu_quant_weight_block(enum npu_quant_mode mode);

/* "f32", "w8a8-naive", "w8a8-shadow", "w8a8-smooth", "w8a16-naive", ..., "w4a8-smooth". */
const char *npu_quant_mode_name(enum npu_quant_mode mode);

/* The mode named 'name' (as npu_quant_mode_name names it, or a precision alone, "w4a16", for its
 * naive mode), or -1. */
int npu_quant_mode_parse(const char *name);

struct npu_quant_options {
  enum npu_quant_mode mode;
  float smooth_alpha;     /* SmoothQuant migration strength in (0, 1), default 0.5, or
                             NPU_SMOOTH_AUTO: chosen per block and group (compiler/smooth.h) */
  float shadow_threshold; /* a channel is an outlier if its calibrated absmax exceeds this many
                             times the median channel absmax of the tensor (default 6) */
  int n_threads;          /* calibration threads (0: one per online CPU) */
  /* Stream (a model read with defer_matrices): each layer's matrices are read when its turn
   * comes and let go of after, and the packed weights go to a scratch file in this directory
   * (npu_program.spill) instead of memory, so that a model of any size compiles in about one
   * layer's float weights. NULL: every weight is in memory, and the packed weights too (placed
   * for running). */
  const char *spill_dir;
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
};

/* Quantization parameters of a named tensor (the same in every graph). */
struct npu_qtensor {
  char name[NPU_IR_NAME_MAX];
  uint8_t dtype;
  struct npu_qparams q;
};

/* The precision policy (float_ops, bits 1 << enum npu_op) a program quantized in 'mode' must be
 * compiled with: 'float_ops' plus what the mode needs. w8a8-shadow computes its outlier channels
 * on the CPU from the float output of the norm in front of each matmul, so it keeps RMSNORM in
 * float; the other modes need nothing. npu_quantize_program refuses a program compiled without. */
uint32_t npu_quant_float_ops(enum npu_quant_mode mode, uint32_t float_ops);

/* Defaults: smooth, alpha 0.5, shadow threshold 6. */
void npu_quant_default_options(struct npu_quant_options *o);

/* Quantize program 'p' (compiled from 'm', still FP32) in place: calibrate on 'tokens' (windows
 * of 256 starting with 'bos' if >= 0), apply the mode, set every NPU tensor's dtype and scale,
 * build every NPU operation's integer data, rewrite and re-plan every graph. Block after block:
 * each is calibrated (with SmoothQuant: calibrated, smoothed, calibrated again) and its integer
 * data made before the next is read, then the head; 'progress' (phase "quantize") counts them.
 * On failure the program is left FP32. */
npulm_status npu_quantize_program(const struct npulm_model *m, struct npu_program *p,
                                  const int32_t *tokens, size_t n_tokens, int32_t bos,
                                  const struct npu_quant_options *o,
                                  npulm_phase_progress_fn progress, void *user, npulm_error *err);

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

/* Lookups by name; NULL if absent. */
const struct npu_qsite *npu_program_qsite(const struct npu_program *p, const char *name);
const struct npu_qtensor *npu_program_qtensor(const struct npu_program *p, const char *name);

#endif /* NPU_COMPILER_QUANTIZE_H */
