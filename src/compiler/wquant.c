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
  double best_err = quant_run(w, n, imp, best, qmin, qmax, q);
  const int steps = qmax <= 7 ? 25 : 10;
  for (int i = 0; i <= steps; i++) {
    const float s = (1.0f - 0.02f * (float)i) * amax / (float)qmax;
    const double e = quant_run(w, n, imp, s, qmin, qmax, q);
    if (e < best_err) best_err = e, best = s;
    const float refit = refit_scale(w, n, imp, q);
    if (refit > 0.0f) {
      const double er = quant_run(w, n, imp, refit, qmin, qmax, q);
      if (er < best_err) best_err = er, best = refit;
    }
  }
  return best;
}

/* One row in blocks: for the row scale amax * ratio / (7 * 15), each block takes the integer
 * scale of least error among those near its own maximum's (or, without search, the smallest
 * that does not clip it). Returns the row's total error; writes q and the block scales. */
static double block_row(const float *w, size_t n, size_t block, const float *imp, float row_scale_,
                        bool search, int8_t *q, uint8_t *bscale) {
  double total = 0.0;
  for (size_t b0 = 0, b = 0; b0 < n; b0 += block, b++) {
    const size_t len = n - b0 < block ? n - b0 : block;
    const float *wb = w + b0;
    const float *ib = imp != NULL ? imp + b0 : NULL;
    const float bmax = absmax_of(wb, len);
    if (bmax == 0.0f || row_scale_ == 0.0f) {
      bscale[b] = 0;
      total += quant_run(wb, len, ib, 0.0f, -8, 7, q + b0);
      continue;
    }
    const float ideal = bmax / (7.0f * row_scale_);
    int lo = (int)ceilf(ideal), hi = lo;
    if (search) lo -= 3, hi += 2;
    lo = lo < 1 ? 1 : lo > BSCALE_MAX ? BSCALE_MAX : lo;
    hi = hi < lo ? lo : hi > BSCALE_MAX ? BSCALE_MAX : hi;
    int best = lo;
    double best_err = INFINITY;
    for (int k = lo; k <= hi; k++) {
      const double e = quant_run(wb, len, ib, row_scale_ * (float)k, -8, 7, q + b0);
      if (e < best_err) best_err = e, best = k;
    }
    bscale[b] = (uint8_t)best;
    total += quant_run(wb, len, ib, row_scale_ * (float)best, -8, 7, q + b0);
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
        const double e = block_row(row, cols, how->block, how->imp, s, true, q, bs);
        if (e < best_err) best_err = e, best = s;
      }
    }
    scales_out[r] = best;
    block_row(row, cols, how->block, how->imp, best, how->search, q, bs);
  }
  return true;
}
