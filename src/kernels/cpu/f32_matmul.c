/* npu_f32_matmul__scalar: 1 weight row x 4 tokens, portable C (cpu_ukernels.h). */
#include "kernels/cpu/f32_util.h"

/* Finish one output from its partial sums 'acc': the tail of k sequentially, then the lanes. */
#define MM_FINISH(dst, acc, wrow, xrow, o)                                                         \
  do {                                                                                             \
    float sum_ = 0.0f;                                                                             \
    for (int32_t i_ = k8; i_ < k; i_++) sum_ += (wrow)[i_] * (xrow)[i_];                           \
    sum_ += HSUM8(acc);                                                                            \
    (dst) = bias != NULL ? sum_ + bias[o] : sum_;                                                  \
  } while (0)

/* The portable matmul: 1 weight row x 4 tokens (12 of 16 SSE registers); the remaining tokens
 * (all of a decode step) one weight row after another. */
void npu_f32_matmul__scalar(float *restrict out, const float *restrict x, const float *restrict w,
                            const float *restrict bias, int32_t rows, int32_t k, int32_t n) {
  const int32_t k8 = k & ~7;
  const size_t ks = (size_t)k, ns = (size_t)n;
  int32_t tile = (int32_t)(MM_TILE_BYTES / (ks * sizeof(float)));
  if (tile < 4) tile = 4;
  for (int32_t n0 = 0; n0 < n; n0 += tile) {
    const int32_t n1 = n - n0 < tile ? n : n0 + tile;
    int32_t t = 0;
    /* four tokens at a time: each weight row is read once per four tokens */
    for (; t + 4 <= rows; t += 4) {
      const float *x0 = x + (size_t)t * ks, *x1 = x0 + ks, *x2 = x1 + ks, *x3 = x2 + ks;
      float *o0 = out + (size_t)t * ns, *o1 = o0 + ns, *o2 = o1 + ns, *o3 = o2 + ns;
      for (int32_t j = n0; j < n1; j++) {
        const float *w0 = w + (size_t)j * ks;
        npu_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int32_t i = 0; i < k8; i += 8) {
          npu_v8f wv0, xv;
          LOAD8(wv0, w0 + i);
          LOAD8(xv, x0 + i);
          a0 += wv0 * xv;
          LOAD8(xv, x1 + i);
          a1 += wv0 * xv;
          LOAD8(xv, x2 + i);
          a2 += wv0 * xv;
          LOAD8(xv, x3 + i);
          a3 += wv0 * xv;
        }
        MM_FINISH(o0[j], a0, w0, x0, j);
        MM_FINISH(o1[j], a1, w0, x1, j);
        MM_FINISH(o2[j], a2, w0, x2, j);
        MM_FINISH(o3[j], a3, w0, x3, j);
      }
    }
    for (; t < rows; t++) {
      const float *x0 = x + (size_t)t * ks;
      float *o0 = out + (size_t)t * ns;
      for (int32_t j = n0; j < n1; j++) {
        const float *w0 = w + (size_t)j * ks;
        npu_v8f a0 = {0};
        for (int32_t i = 0; i < k8; i += 8) {
          npu_v8f xv, wv;
          LOAD8(xv, x0 + i);
          LOAD8(wv, w0 + i);
          a0 += wv * xv;
        }
        MM_FINISH(o0[j], a0, w0, x0, j);
      }
    }
  }
}
