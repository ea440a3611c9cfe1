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
 * Conventions (documented in docs/precisions.md): matmul inputs are int8 asymmetric per tensor;
 * weights int8 symmetric per output channel in [-127, 127]; the residual stream and matmul outputs
 * that leave the NPU (q, k, v, logits) are int16 symmetric; gate/up/SiLU/product are int8.
 * Attention ops the precision policy lets onto the NPU (--float-ops): q and the K/V caches int8
 * asymmetric (the caches stay F32 on the CPU; a CPU transfer quantizes the rows a step attends over
 * into an NPU copy "blk.L.k_cache" / "blk.L.v_cache" with the calibrated scale of k_rope / attn_v);
 * scores "blk.L.kq" int16 symmetric (calibrated, scale included); probabilities "blk.L.kq_softmax"
 * Q15 (int16, scale 2^-15, zero point 0); the attention output int8. */
#ifndef NPU_COMPILER_QUANTIZE_H
#define NPU_COMPILER_QUANTIZE_H

#include <stdint.h>

#include "compiler/calibrate.h"
#include "kernels/npu/npu_ukernels.h"
#include "program/program.h"

struct npu_quant_options {
  enum npu_quant_mode mode;
  float smooth_alpha;     /* SmoothQuant migration strength in (0, 1), default 0.5, or
                             NPU_SMOOTH_AUTO (program/quant_mode.h): chosen per block and group
                             (compiler/smooth.h) */
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

#endif /* NPU_COMPILER_QUANTIZE_H */
