/* Compile-time quantization helpers (floating point allowed here, never in src/kernels/npu). */
#include "program/qparams.h"

#include <math.h>

bool npu_quantize_multiplier(double real, int32_t *mult_out, int32_t *shift_out) {
  *mult_out = 0;
  *shift_out = 0;
  if (!(real >= 0.0) || !isfinite(real)) return false;
  if (real == 0.0) return true;
  int e;
  const double q = frexp(real, &e); /* real = q * 2^e, q in [0.5, 1) */
  if (e < -31) {
    /* Below the normalized range: keep the smallest shift and let mult shrink. */
    *mult_out = (int32_t)llround(ldexp(real, 62));
    *shift_out = -31;
    return true;
  }
  long long m = llround(ldexp(q, 31));
  if (m == (1LL << 31)) { /* q rounded up to 1.0 */
    m = 1LL << 30;
    e++;
  }
  if (e > 30) {
    *mult_out = INT32_MAX;
    *shift_out = 30;
    return false;
  }
  *mult_out = (int32_t)m;
  *shift_out = e;
  return true;
}

double npu_multiplier_real(int32_t mult, int32_t shift) { return ldexp((double)mult, shift - 31); }

bool npu_quantize_multipliers(float in_scale, const float *ch_scales, size_t n, float out_scale,
                              int32_t *mult_out, int32_t *shift_out) {
  bool ok = out_scale > 0.0f;
  for (size_t i = 0; i < n; i++) {
    const double real = ok ? (double)in_scale * ch_scales[i] / out_scale : 0.0;
    ok = npu_quantize_multiplier(real, &mult_out[i], &shift_out[i]) && ok;
  }
  return ok;
}

bool npu_quantize_weights_per_channel(const float *w, size_t rows, size_t cols, int8_t *q_out,
                                      float *scales_out) {
  for (size_t r = 0; r < rows; r++) {
    const float *row = w + r * cols;
    float absmax = 0.0f;
    for (size_t c = 0; c < cols; c++) {
      if (!isfinite(row[c])) return false;
      absmax = fmaxf(absmax, fabsf(row[c]));
    }
    const float scale = absmax / 127.0f;
    scales_out[r] = scale;
    for (size_t c = 0; c < cols; c++) {
      float v = scale > 0.0f ? roundf(row[c] / scale) : 0.0f;
      v = fminf(fmaxf(v, -127.0f), 127.0f);
      q_out[r * cols + c] = (int8_t)v;
    }
  }
  return true;
}

bool npu_quantize_bias(const float *bias, size_t n, float x_scale, const float *w_scales,
                       int32_t *q_out) {
  for (size_t i = 0; i < n; i++) {
    const double s = (double)x_scale * w_scales[i];
    const double v = s > 0.0 ? round(bias[i] / s) : 0.0;
    if (!(fabs(v) <= (double)(1 << 30))) return false;
    q_out[i] = (int32_t)v;
  }
  return true;
}

void npu_choose_qparams_s8(float min, float max, float *scale_out, int32_t *zero_point_out) {
  min = fminf(min, 0.0f);
  max = fmaxf(max, 0.0f);
  if (!(max > min)) {
    *scale_out = 1.0f;
    *zero_point_out = 0;
    return;
  }
  const double scale = ((double)max - min) / 255.0;
  const double zp = round(-128.0 - min / scale);
  *scale_out = (float)scale;
  *zero_point_out = zp < -128.0 ? -128 : zp > 127.0 ? 127 : (int32_t)zp;
}

float npu_choose_scale_sym(float absmax, int32_t qmax) {
  return absmax > 0.0f ? absmax / (float)qmax : 1.0f;
}

bool npu_qadd_params_make(float a_scale, int32_t a_zero_point, float b_scale, int32_t b_zero_point,
                          float y_scale, int32_t y_zero_point, bool int16,
                          struct npu_qadd_params *params_out) {
  struct npu_qadd_params *p = params_out;
  p->a_zero_point = a_zero_point;
  p->b_zero_point = b_zero_point;
  p->y_zero_point = y_zero_point;
  p->left_shift = int16 ? 14 : 20;
  const double twice_max = 2.0 * fmax(a_scale, b_scale);
  bool ok = a_scale > 0.0f && b_scale > 0.0f && y_scale > 0.0f;
  const double ra = ok ? a_scale / twice_max : 0.0; /* <= 0.5 */
  const double rb = ok ? b_scale / twice_max : 0.0;
  const double ry = ok ? twice_max / (ldexp(1.0, p->left_shift) * y_scale) : 0.0;
  ok = npu_quantize_multiplier(ra, &p->a_mult, &p->a_shift) && ok;
  ok = npu_quantize_multiplier(rb, &p->b_mult, &p->b_shift) && ok;
  ok = npu_quantize_multiplier(ry, &p->y_mult, &p->y_shift) && ok;
  return ok;
}

bool npu_qmul_params_make(float a_scale, int32_t a_zero_point, float b_scale, int32_t b_zero_point,
                          float y_scale, int32_t y_zero_point, struct npu_qmul_params *params_out) {
  params_out->a_zero_point = a_zero_point;
  params_out->b_zero_point = b_zero_point;
  params_out->y_zero_point = y_zero_point;
  const bool ok = y_scale > 0.0f;
  const double real = ok ? (double)a_scale * b_scale / y_scale : 0.0;
  return npu_quantize_multiplier(real, &params_out->y_mult, &params_out->y_shift) && ok;
}

void npu_lut_s8_build(double (*fn)(double), float x_scale, int32_t x_zero_point, float y_scale,
                      int32_t y_zero_point, int8_t table_out[256]) {
  for (int q = INT8_MIN; q <= INT8_MAX; q++) {
    const double y = fn((double)x_scale * (q - x_zero_point));
    double v = isnan(y) ? 0.0 : round(y / y_scale);
    v = fmin(fmax(v + y_zero_point, INT8_MIN), INT8_MAX);
    table_out[q + 128] = (int8_t)v;
  }
}

void npu_lut_s16_build(double (*fn)(double), float x_scale, float y_scale,
                       int16_t table_out[NPU_QS16_LUT_SIZE]) {
  for (int i = 0; i < NPU_QS16_LUT_SIZE; i++) {
    const double y = fn((double)x_scale * (i * 128 - 32768));
    const double v = isnan(y) ? 0.0 : round(y / y_scale);
    table_out[i] = (int16_t)fmin(fmax(v, INT16_MIN), INT16_MAX);
  }
}

bool npu_qk_params_make(float q_scale, int32_t q_zero_point, float k_scale, int32_t k_zero_point,
                        float attn_scale, float s_scale, int32_t s_zero_point,
                        struct npu_qs8_qk_params *params_out) {
  params_out->q_zero_point = q_zero_point;
  params_out->k_zero_point = k_zero_point;
  params_out->s_zero_point = s_zero_point;
  const bool ok = q_scale > 0.0f && k_scale > 0.0f && attn_scale > 0.0f && s_scale > 0.0f;
  const double real = ok ? (double)q_scale * k_scale * attn_scale / s_scale : 0.0;
  return npu_quantize_multiplier(real, &params_out->mult, &params_out->shift) && ok;
}

bool npu_softmax_params_make(float s_scale, struct npu_qs16_softmax_params *params_out) {
  const bool ok = s_scale > 0.0f;
  const double real = ok ? (double)s_scale * 256.0 / log(2.0) : 0.0;
  return npu_quantize_multiplier(real, &params_out->mult, &params_out->shift) && ok;
}

bool npu_pv_params_make(float v_scale, int32_t v_zero_point, float y_scale, int32_t y_zero_point,
                        struct npu_qs16_pv_params *params_out) {
  params_out->v_zero_point = v_zero_point;
  params_out->y_zero_point = y_zero_point;
  const bool ok = v_scale > 0.0f && y_scale > 0.0f;
  const double real = ok ? ldexp((double)v_scale / y_scale, -NPU_PROB_BITS) : 0.0;
  return npu_quantize_multiplier(real, &params_out->mult, &params_out->shift) && ok;
}

bool npu_rmsnorm_params_make(float x_scale, const float *gain, size_t cols, float eps,
                             float y_scale, int32_t y_zero_point, int32_t *mult_out,
                             struct npu_qs16_rmsnorm_params *params_out) {
  if (!(x_scale > 0.0f) || !(y_scale > 0.0f) || !(eps >= 0.0f) || cols == 0 ||
      cols > (size_t)NPU_QS16_RMSNORM_MAX_COLS || y_zero_point < INT8_MIN ||
      y_zero_point > INT8_MAX) {
    return false;
  }
  /* one shift for the tensor, from the largest gain: the others keep fewer bits, which costs
   * them nothing the int8 output could show */
  const double root = sqrt((double)cols);
  double largest = 0.0;
  for (size_t c = 0; c < cols; c++) {
    const double m = fabs((double)gain[c]) * root / y_scale;
    if (!isfinite(m)) return false;
    if (m > largest) largest = m;
  }
  int ex = 0;
  if (largest > 0.0) frexp(largest, &ex); /* largest = f * 2^ex, f in [0.5, 1) */
  if (ex > 46) return false;
  const int32_t shift = ex < -16 ? -16 : ex;
  for (size_t c = 0; c < cols; c++) {
    const double m = rint(ldexp((double)gain[c] * root / y_scale, 31 - shift));
    mult_out[c] = m > INT32_MAX ? INT32_MAX : m < -INT32_MAX ? -INT32_MAX : (int32_t)m;
  }
  /* eps in units of the squared input: cols * eps / x_scale^2, at least 1 */
  double e = rint((double)cols * eps / ((double)x_scale * x_scale));
  const double most = ldexp(1.0, 62);
  params_out->eps = !(e >= 1.0) ? 1 : e >= most ? (int64_t)1 << 62 : (int64_t)e;
  params_out->mult = mult_out;
  params_out->shift = shift;
  params_out->y_zero_point = y_zero_point;
  return true;
}

float npu_prob_scale(void) { return ldexpf(1.0f, -NPU_PROB_BITS); }

double npu_silu(double x) { return x / (1.0 + exp(-x)); }
