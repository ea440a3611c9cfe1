/* SmoothQuant for the quantizer: per input channel factors s divide a matmul's input activation
 * (folded into the op that writes it) and multiply the matmul's weight columns, so that the
 * product is unchanged and the activation's outlier channels shrink before its one per-tensor
 * int8 scale is chosen. Four groups per block, each with its own factors: the inputs of q/k/v
 * (folded into attn_norm), of gate/up (ffn_norm), of down (up's rows) and of the attention output
 * projection (V's rows). */
#ifndef NPU_COMPILER_SMOOTH_H
#define NPU_COMPILER_SMOOTH_H

#include <stdint.h>

#include "compiler/calibrate.h"
#include "program/program.h"

/* The candidates of the choice: no smoothing, then NPU_SMOOTH_CANDIDATES alphas,
 * npu_smooth_candidate(i) = (i + 5) / 20, from 0.25 to 0.75. Below 0.25 smoothing mostly moves
 * the spread of the weights' column maxima onto the activation (alpha 0 reads no activation
 * statistic at all); above 0.75 it evens out channel maxima that a short calibration text does
 * not bound (bench/ACCURACY.md, "SmoothQuant's alpha"). */
#define NPU_SMOOTH_CANDIDATES 11
static inline float npu_smooth_candidate(int i) { return (float)(i + 5) / 20.0f; }
/* The error model reads at most about this many rows of each matrix (every stride-th). */
#define NPU_SMOOTH_MODEL_ROWS 1024

/* The activation a group's matmuls read, as calibrated. */
struct npu_smooth_input {
  int32_t k;            /* channels */
  const float *absmax;  /* (k) each channel's largest magnitude */
  const double *meansq; /* (k) each channel's mean square, E[x_c^2] */
  float range;          /* the tensor's calibrated max - min */
  double rows;          /* calibration rows (values per channel) */
  /* the precision: steps across an activation's range (255 for int8, 65535 for int16) and a
   * weight row's largest level (127 for int8, 7 for int4; int4 blocks taken as per channel) */
  double act_steps, w_levels;
  /* Where the fold of 1/s lands on a tensor of its own that is quantized before x (the output of
   * up, whose rows take down's factors; x is silu(gate) * up): that tensor's channel maxima and
   * range, and the mean square of what multiplies it into x (E[silu(gate)_c^2]); src_absmax
   * NULL: the fold lands on x itself (a norm's weight) or where int8 costs nothing. */
  const float *src_absmax; /* (k) */
  float src_range;
  const double *src_gain;   /* (k) */
  const double *src_meansq; /* (k) the source's mean squares */
};

/* A matmul reading it: 'n' rows (output channels) of 'k' weights. */
struct npu_smooth_matmul {
  const float *w;
  int32_t n, k;
};

/* SmoothQuant's factors s[c] = amax[c]^alpha / wmax[c]^(1-alpha), clamped to [1e-2, 1e2]. */
void npu_smooth_factors(const float *amax, const float *wmax, int32_t n, float alpha, float *s);

/* The predicted quantization noise of matmuls 'mm' (each with x->k columns) when their input is
 * divided by f[c] and their columns multiplied by it (f NULL: no smoothing): for each matmul the
 * noise power summed over its output channels n, relative to its output's power,
 *   sum_n [ sum_c w'_nc^2 v_c + dw_n^2/12 * sum_c E[x'_c^2] ] / sum_n sum_c w_nc^2 E[x_c^2],
 * added over the matmuls, the noises taken as independent. dw_n is the step of row n of
 * w' = w * f (its largest magnitude / w_levels); v_c the noise power of channel c of x' = x / f:
 * the rounding of its per-tensor step dx (the calibrated range, shrunk as the largest channel
 * maximum is, / act_steps), dx^2/12, plus what values of other text beyond that range cost (a
 * power-law tail past each channel's calibrated maximum, see clip_noise in smooth.c), plus, with a
 * source tensor (src_absmax), the same two terms for the source's own int8 step times src_gain[c].
 * Reads at most about NPU_SMOOTH_MODEL_ROWS rows of each matrix; 'scratch' has room for x->k
 * doubles. */
double npu_smooth_error(const struct npu_smooth_input *x, const struct npu_smooth_matmul *mm,
                        int n_mm, const float *f, double *scratch);

/* The factors of one group: 'n_factors' of them, channel c taking factor map[c] (map NULL:
 * n_factors is x->k, each channel its own), their amax and wmax the largest over the channels
 * that share them. With 'alpha' in [0, 1], SmoothQuant's factors for it. With NPU_SMOOTH_AUTO,
 * those of least npu_smooth_error among no smoothing (all 1) and the candidate alphas, every
 * channel maximum taken as at least the median channel's (a channel quiet on the calibration
 * text may reach a typical channel's magnitude on another: it is neither magnified by its
 * factor nor counted as safe from clipping); only a strictly smaller error displaces an earlier
 * candidate. Writes the factors (n_factors) to 's_out', the alpha to '*alpha_out'
 * (NPU_SMOOTH_NONE: no smoothing), and, if 'err_out' is not NULL, the predicted error to
 * '*err_out' (for a forced alpha, from the maxima as calibrated). */
npulm_status npu_smooth_choose(const struct npu_smooth_input *x, const struct npu_smooth_matmul *mm,
                               int n_mm, int32_t n_factors, const int32_t *map, float alpha,
                               float *s_out, float *alpha_out, double *err_out, npulm_error *err);

/* Smooth block 'l' of program 'p' (compiled from 'm', the block's weights in memory) from the
 * block's statistics in 'cal': each group's factors by npu_smooth_choose with 'alpha' (a fixed
 * alpha, or NPU_SMOOTH_AUTO), folded into the weights, which become copies the program owns
 * (p->owned); the alphas taken go to p->smooth_alphas (made at the first block). */
npulm_status npu_smooth_layer(const struct npulm_model *m, struct npu_program *p,
                              const struct npu_calib *cal, float alpha, int32_t l,
                              npulm_error *err);

#endif /* NPU_COMPILER_SMOOTH_H */
