/* Compile-time quantization helpers: the floating-point side of the NPU contract. They turn real
 * scales into the integer (multiplier, shift) pairs of src/kernels/npu/fixedpoint.h, quantize
 * weights per output channel and activations per tensor, and build lookup tables; nothing here runs
 * inside an NPU graph. Conventions: real = scale * (q - zero_point); rounding is half away from
 * zero (roundf, as TFLite's quantize and llama.cpp's Q8_0 do), then saturation to the type's range.
 */
#ifndef NPU_PROGRAM_QPARAMS_H
#define NPU_PROGRAM_QPARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/npu/npu_ukernels.h"

/* (mult, shift) with real ~= mult * 2^(shift - 31) (fixedpoint.h): mult in [2^30, 2^31 - 1] and
 * shift = the binary exponent, so the error is at most half a Q31 ulp: |mult * 2^(shift-31) - real|
 * <= 2^(shift - 32). real = 0 gives (0, 0). 0 < real < 2^-32 gives shift = -31 and the
 * denormal mult = round(real * 2^62) (possibly 0). Return false, with (INT32_MAX, 30) or (0, 0),
 * if real is negative, not finite, or >= 2^30 (after rounding). */
bool npu_quantize_multiplier(double real, int32_t *mult_out, int32_t *shift_out);

/* The real multiplier mult * 2^(shift - 31) that (mult, shift) stands for: the inverse of
 * npu_quantize_multiplier, exact in double. */
double npu_multiplier_real(int32_t mult, int32_t shift);

/* Per-channel multipliers real[i] = in_scale * ch_scales[i] / out_scale (in double), e.g. x_scale
 * * w_scale[n] / y_scale for a matmul, or row_scale[r] / y_scale for a gather (in_scale = 1).
 * Return false if any is not representable (see npu_quantize_multiplier) or out_scale <= 0. */
bool npu_quantize_multipliers(float in_scale, const float *ch_scales, size_t n, float out_scale,
                              int32_t *mult_out, int32_t *shift_out);

/* Symmetric per-output-channel int8 weights: row r of w [rows, cols] gets scale[r] = absmax / 127
 * and q = round(w / scale) in [-127, 127] (never -128, as the GEMM kernels require). An all-zero
 * row gets scale 0 and q = 0. Return false if a weight is not finite. */
bool npu_quantize_weights_per_channel(const float *w, size_t rows, size_t cols, int8_t *q_out,
                                      float *scales_out);

/* int32 bias of a matmul: q[n] = round(bias[n] / (x_scale * w_scales[n])) (0 where that scale is
 * 0). Return false if some |q| would exceed 2^30 (the GEMM's limit) or is not finite. */
bool npu_quantize_bias(const float *bias, size_t n, float x_scale, const float *w_scales,
                       int32_t *q_out);

/* Asymmetric int8 parameters for values in [min, max] (the range is first widened to contain 0):
 * scale = (max - min) / 255 and the zero point that maps min to -128, rounded and clamped to
 * [-128, 127] (TFLite's nudging), so 0.0 is exactly representable. A zero range gives scale 1. */
void npu_choose_qparams_s8(float min, float max, float *scale_out, int32_t *zero_point_out);

/* Symmetric scale absmax / qmax (qmax = 127 for int8, 32767 for int16; zero point 0); 1 when
 * absmax is 0. */
float npu_choose_scale_sym(float absmax, int32_t qmax);

/* Params of npu_qs8_vadd / npu_qs16_vadd for y = a + b with the given scales and zero points;
 * left_shift: 20 for int8 inputs (TFLite), 14 for int16. Return false if a multiplier is not
 * representable or left_shift is out of range for 'int16' inputs. */
bool npu_qadd_params_make(float a_scale, int32_t a_zero_point, float b_scale, int32_t b_zero_point,
                          float y_scale, int32_t y_zero_point, bool int16,
                          struct npu_qadd_params *params_out);

/* Params of npu_qs8_vmul / npu_qs16_vmul for y = a * b (multiplier a_scale * b_scale / y_scale). */
bool npu_qmul_params_make(float a_scale, int32_t a_zero_point, float b_scale, int32_t b_zero_point,
                          float y_scale, int32_t y_zero_point, struct npu_qmul_params *params_out);

/* Lookup table of npu_x8_lut for y = fn(x): table[q + 128] = quantize(fn(dequantize(q))) over
 * the 256 int8 codes q, with the input and output scales and zero points given. */
void npu_lut_s8_build(double (*fn)(double), float x_scale, int32_t x_zero_point, float y_scale,
                      int32_t y_zero_point, int8_t table_out[256]);

/* Knots of npu_qs16_lut for y = fn(x) (int16 x and y, both symmetric: real x = x_scale * x):
 * table[i] = sat_int16(round(fn(x_scale * (128 * i - 32768)) / y_scale)) for i in [0, 512]; the
 * kernel interpolates linearly between them (knot 512 lies at x = 32768, one past the int16
 * range, so the last interval ends where the function does). */
void npu_lut_s16_build(double (*fn)(double), float x_scale, float y_scale,
                       int16_t table_out[NPU_QS16_LUT_SIZE]);

/* Attention on the integer NPU (npu_ukernels.h): the scores' multiplier q_scale * k_scale *
 * attn_scale / s_scale (attn_scale = 1/sqrt(head_dim)); the softmax's s_scale * 256 / ln 2 (into
 * 1/256ths of an octave); P.V's 2^-15 * v_scale / y_scale. Return false if a multiplier is not
 * representable (npu_quantize_multiplier) or a scale is not positive. */
bool npu_qk_params_make(float q_scale, int32_t q_zero_point, float k_scale, int32_t k_zero_point,
                        float attn_scale, float s_scale, int32_t s_zero_point,
                        struct npu_qs8_qk_params *params_out);
bool npu_softmax_params_make(float s_scale, struct npu_qs16_softmax_params *params_out);
bool npu_pv_params_make(float v_scale, int32_t v_zero_point, float y_scale, int32_t y_zero_point,
                        struct npu_qs16_pv_params *params_out);

/* Params of npu_qs16_rmsnorm_qs8 (npu_ukernels.h) for y = x / sqrt(mean(x^2) + eps) * gain: int16
 * input of scale x_scale (zero point 0), int8 output (y_scale, y_zero_point); mult_out (cols
 * entries) receives the per-channel multipliers, which params_out points at. The shift comes from
 * the largest |gain|; eps becomes cols * eps / x_scale^2 (at least 1). Return false for a scale
 * that is not positive, a gain that is not finite, a multiplier beyond 2^46, or cols outside
 * [1, 2^24]. */
bool npu_rmsnorm_params_make(float x_scale, const float *gain, size_t cols, float eps,
                             float y_scale, int32_t y_zero_point, int32_t *mult_out,
                             struct npu_qs16_rmsnorm_params *params_out);

/* The real scale of the NPU's probabilities, 2^-NPU_PROB_BITS (zero point 0). */
float npu_prob_scale(void);

/* SiLU, x * sigmoid(x), for npu_lut_s8_build. */
double npu_silu(double x);

#endif /* NPU_PROGRAM_QPARAMS_H */
