/* The CPU backend's float kernels that have one variant (kernels.h): gather, RMSNorm, KV-cache
 * writes and the element-wise ops (softmax is attention's: f32_attention.c). Those with several
 * are listed in cpu_ukernels.inc. */
#include "kernels/cpu/f32_util.h"

void npu_f32_gather(float *restrict out, const float *restrict table, const int32_t *restrict ids,
                    int32_t rows, int32_t cols) {
  for (int32_t t = 0; t < rows; t++) {
    memcpy(out + (size_t)t * (size_t)cols, table + (size_t)ids[t] * (size_t)cols,
           (size_t)cols * sizeof(float));
  }
}

/* Rows whose sums of squares are taken side by side: each is one sequential chain, as the
 * reference adds it, and eight independent chains keep the adders busy where one would wait on
 * its own previous add at every element. */
#define RMS_ROWS 8

/* ss[r] = the reference's sum of squares of row r of x (rows 'cols' apart), r < n_rows. */
static void sum_squares(float *restrict ss, const float *restrict x, int32_t n_rows, int32_t cols) {
  if (n_rows == RMS_ROWS) {
    /* eight named chains: an array of them would live in memory, one store-to-load apart */
    const size_t c = (size_t)cols;
    const float *x0 = x, *x1 = x0 + c, *x2 = x1 + c, *x3 = x2 + c, *x4 = x3 + c, *x5 = x4 + c,
                *x6 = x5 + c, *x7 = x6 + c;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, a4 = 0.0f, a5 = 0.0f, a6 = 0.0f, a7 = 0.0f;
    for (int32_t i = 0; i < cols; i++) {
      a0 += x0[i] * x0[i];
      a1 += x1[i] * x1[i];
      a2 += x2[i] * x2[i];
      a3 += x3[i] * x3[i];
      a4 += x4[i] * x4[i];
      a5 += x5[i] * x5[i];
      a6 += x6[i] * x6[i];
      a7 += x7[i] * x7[i];
    }
    ss[0] = a0, ss[1] = a1, ss[2] = a2, ss[3] = a3, ss[4] = a4, ss[5] = a5, ss[6] = a6, ss[7] = a7;
    return;
  }
  for (int32_t r = 0; r < n_rows; r++) {
    const float *xr = x + (size_t)r * (size_t)cols;
    float acc = 0.0f;
    for (int32_t i = 0; i < cols; i++) acc += xr[i] * xr[i];
    ss[r] = acc;
  }
}

void npu_f32_rmsnorm(float *restrict out, const float *restrict x, const float *restrict w,
                     int32_t rows, int32_t cols, float eps) {
  for (int32_t t0 = 0; t0 < rows; t0 += RMS_ROWS) {
    const int32_t n_rows = rows - t0 < RMS_ROWS ? rows - t0 : RMS_ROWS;
    float ss[RMS_ROWS];
    sum_squares(ss, x + (size_t)t0 * (size_t)cols, n_rows, cols);
    for (int32_t r = 0; r < n_rows; r++) {
      const float *xr = x + (size_t)(t0 + r) * (size_t)cols;
      float *o = out + (size_t)(t0 + r) * (size_t)cols;
      const float scale = 1.0f / sqrtf(ss[r] / (float)cols + eps);
      int32_t i = 0;
      for (; i + 8 <= cols; i += 8) {
        npu_v8f xv, wv;
        LOAD8(xv, xr + i);
        LOAD8(wv, w + i);
        xv = xv * scale * wv;
        memcpy(o + i, &xv, sizeof(xv));
      }
      for (; i < cols; i++) o[i] = xr[i] * scale * w[i];
    }
  }
}

/* ---- KV cache and attention ----------------------------------------------------------------- */

void npu_f32_kv_write(float *restrict cache, const float *restrict x, int32_t pos0, int32_t n_valid,
                      int32_t cols) {
  memcpy(cache + (size_t)pos0 * (size_t)cols, x, (size_t)n_valid * (size_t)cols * sizeof(float));
}

uint32_t npu_touch_lines(const void *p, size_t bytes) {
  const uint8_t *b = p;
  uint32_t sum = 0;
  for (size_t i = 0; i < bytes; i += 64) sum += b[i];
  return sum;
}

/* ---- Element-wise --------------------------------------------------------------------------- */

/* out[i] = a[i] OP b[i], eight at a time. */
#define ELEMENTWISE(OP)                                                                            \
  do {                                                                                             \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8) {                                                                   \
      npu_v8f va, vb;                                                                              \
      LOAD8(va, a + i);                                                                            \
      LOAD8(vb, b + i);                                                                            \
      va = va OP vb;                                                                               \
      memcpy(out + i, &va, sizeof(va));                                                            \
    }                                                                                              \
    for (; i < n; i++) out[i] = a[i] OP b[i];                                                      \
  } while (0)

void npu_f32_add(float *restrict out, const float *restrict a, const float *restrict b, size_t n) {
  ELEMENTWISE(+);
}

void npu_f32_mul(float *restrict out, const float *restrict a, const float *restrict b, size_t n) {
  ELEMENTWISE(*);
}

void npu_f32_silu(float *restrict out, const float *restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = npu_ref_silu(x[i]);
}
