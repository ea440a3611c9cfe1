/* Weight quantization by the weighted error of the products (see wquant.h). */
#include "compiler/wquant.h"

#include <math.h>

/* Block scales are integers in [0, BSCALE_MAX] (4 bits) times the row's scale. */
#define BSCALE_MAX 15

/* Quantize n weights at 'scale' into [qmin, qmax] (round half away from zero, as the other
 * quantizers); the weighted squared error. */
static double quant_run(const float *w, size_t n, const float *imp, float scale, int qmin, int qmax,
                        int8_t *q) {
  double err = 0.0;
  for (size_t c = 0; c < n; c++) {
    float v = scale > 0.0f ? roundf(w[c] / scale) : 0.0f;
    v = fminf(fmaxf(v, (float)qmin), (float)qmax);
    q[c] = (int8_t)v;
    const double e = (double)w[c] - (double)scale * v;
    err += (imp != NULL ? (double)imp[c] : 1.0) * e * e;
  }
  return err;
}

/* The weighted squared error of quantizing n weights at 'scale' into [qmin, qmax], for the search:
 * a multiplication by the inverse and round-half-to-even by the 1.5 * 2^23 trick (exact for the
 * |w / scale| < 2^22 a candidate scale gives) instead of quant_run's division and roundf, a few
 * times faster, in float; the search only compares candidates, and the chosen scale is then
 * applied by quant_run. */
/* w * inv rounded half to even by the 1.5 * 2^23 trick, clamped to [lo, hi]. */
static inline float search_round(float w, float inv, float lo, float hi) {
  const float magic = 12582912.0f, v = (w * inv + magic) - magic;
  return v < lo ? lo : v > hi ? hi : v;
}

static float search_err(const float *w, size_t n, const float *imp, float scale, int qmin,
                        int qmax) {
  const float inv = 1.0f / scale, lo = (float)qmin, hi = (float)qmax;
  float err = 0.0f;
  for (size_t c = 0; c < n; c++) {
    const float v = search_round(w[c], inv, lo, hi);
    const float e = w[c] - scale * v;
    err += (imp != NULL ? imp[c] : 1.0f) * e * e;
  }
  return err;
}

/* The integers search_err rounds to, for a least-squares refit. */
static void search_q(const float *w, size_t n, float scale, int qmin, int qmax, int8_t *q) {
  const float inv = 1.0f / scale, lo = (float)qmin, hi = (float)qmax;
  for (size_t c = 0; c < n; c++) q[c] = (int8_t)search_round(w[c], inv, lo, hi);
}

/* The least-squares scale for fixed integers q: sum imp w q / sum imp q^2 (0 if all q are 0). */
static float refit_scale(const float *w, size_t n, const float *imp, const int8_t *q) {
  double num = 0.0, den = 0.0;
  for (size_t c = 0; c < n; c++) {
    const double i = imp != NULL ? (double)imp[c] : 1.0;
    num += i * w[c] * q[c];
    den += i * (double)q[c] * q[c];
  }
  return den > 0.0 && num > 0.0 ? (float)(num / den) : 0.0f;
}

static float absmax_of(const float *w, size_t n) {
  float m = 0.0f;
  for (size_t c = 0; c < n; c++) m = fmaxf(m, fabsf(w[c]));
  return m;
}

/* One row with one scale: the clipping ratios 1, 0.98, ... (down to 0.5 for int4, 0.8 for int8),
 * each with its least-squares refit; the scale of least error (the first on ties). */
static float row_scale(const float *w, size_t n, const float *imp, int qmin, int qmax, bool search,
                       int8_t *q) {
  const float amax = absmax_of(w, n);
  float best = amax / (float)qmax;
  if (!search || amax == 0.0f) return best;
  float best_err = search_err(w, n, imp, best, qmin, qmax);
  const int steps = qmax <= 7 ? 25 : 10;
  for (int i = 0; i <= steps; i++) {
    const float s = (1.0f - 0.02f * (float)i) * amax / (float)qmax;
    const float e = search_err(w, n, imp, s, qmin, qmax);
    if (e < best_err) best_err = e, best = s;
    search_q(w, n, s, qmin, qmax, q);
    const float refit = refit_scale(w, n, imp, q);
    if (refit > 0.0f) {
      const float er = search_err(w, n, imp, refit, qmin, qmax);
      if (er < best_err) best_err = er, best = refit;
    }
  }
  return best;
}

/* One row in blocks: for the row scale amax * ratio / (7 * 15), each block takes the integer
 * scale of least error among those near its own maximum's (or, without search, the smallest
 * that does not clip it). Returns the row's total error; writes q and the block scales. */
static double block_row(const float *w, size_t n, size_t block, const float *imp, float row_scale_,
                        bool search, bool final, int8_t *q, uint8_t *bscale) {
  double total = 0.0;
  for (size_t b0 = 0, b = 0; b0 < n; b0 += block, b++) {
    const size_t len = n - b0 < block ? n - b0 : block;
    const float *wb = w + b0;
    const float *ib = imp != NULL ? imp + b0 : NULL;
    const float bmax = absmax_of(wb, len);
    if (bmax == 0.0f || row_scale_ == 0.0f) {
      bscale[b] = 0;
      if (final) quant_run(wb, len, ib, 0.0f, -8, 7, q + b0);
      continue;
    }
    const float ideal = bmax / (7.0f * row_scale_);
    int lo = (int)ceilf(ideal), hi = lo;
    if (search) lo -= 3, hi += 2;
    lo = lo < 1 ? 1 : lo > BSCALE_MAX ? BSCALE_MAX : lo;
    hi = hi < lo ? lo : hi > BSCALE_MAX ? BSCALE_MAX : hi;
    int best = lo;
    float best_err = INFINITY;
    for (int k = lo; search && k <= hi; k++) {
      const float e = search_err(wb, len, ib, row_scale_ * (float)k, -8, 7);
      if (e < best_err) best_err = e, best = k;
    }
    bscale[b] = (uint8_t)best;
    total += final ? quant_run(wb, len, ib, row_scale_ * (float)best, -8, 7, q + b0) : best_err;
  }
  return total;
}

bool npu_quantize_weights(const float *w, size_t rows, size_t cols, const struct npu_wquant *how,
                          int8_t *q_out, float *scales_out, uint8_t *bscale_out) {
  const int qmax = how->bits == 4 ? 7 : 127, qmin = how->bits == 4 ? -8 : -127;
  const size_t n_blocks = how->block > 0 ? (cols + how->block - 1) / how->block : 0;
  for (size_t r = 0; r < rows; r++) {
    const float *row = w + r * cols;
    for (size_t c = 0; c < cols; c++) {
      if (!isfinite(row[c])) return false;
    }
    int8_t *q = q_out + r * cols;
    if (how->block == 0) {
      scales_out[r] = row_scale(row, cols, how->imp, qmin, qmax, how->search, q);
      quant_run(row, cols, how->imp, scales_out[r], qmin, qmax, q);
      continue;
    }
    uint8_t *bs = bscale_out + r * n_blocks;
    const float top = absmax_of(row, cols) / (7.0f * BSCALE_MAX);
    float best = top;
    if (how->search && top > 0.0f) {
      double best_err = INFINITY;
      for (int i = 0; i <= 20; i++) {
        const float s = top * (1.0f - 0.02f * (float)i);
        const double e = block_row(row, cols, how->block, how->imp, s, true, false, q, bs);
        if (e < best_err) best_err = e, best = s;
      }
    }
    scales_out[r] = best;
    block_row(row, cols, how->block, how->imp, best, how->search, true, q, bs);
  }
  return true;
}
