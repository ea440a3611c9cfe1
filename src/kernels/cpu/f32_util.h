/* What the variants of the CPU's float kernels share (portable C: GCC/Clang vector extensions).
 * The order of floating-point operations of each output element is exactly the reference
 * forward's: the matmul keeps eight partial sums over k (lane j takes elements i = j mod 8), adds
 * the tail sequentially and reduces the lanes pairwise; attention dots and sums run sequentially
 * over their index, and the fused attention takes the reference's tiles and folds them in its
 * order. Speed comes from what does not change that order: tiling over rows and weight rows,
 * independent accumulators side by side, and 8-lane vector arithmetic whose lanes are different
 * outputs (weight rows, keys, head-dim elements), never parts of one sum except in the matmul's
 * eight partial sums, which the reference keeps too. No FMA: each product is rounded before it is
 * added, as in the scalar reference. */
#ifndef NPU_KERNELS_CPU_F32_UTIL_H
#define NPU_KERNELS_CPU_F32_UTIL_H

#include <stdbool.h>
#include <string.h>

#include "base/expf.h" /* npu_expf: the exponential that defines attention; npu_v8f */
#include "kernels/cpu/kernels.h"

/* Loads through memcpy: no alignment is assumed, and no vector crosses a call boundary. */
#define LOAD8(v, p) memcpy(&(v), (p), sizeof(npu_v8f))

/* The reference's reduction of the eight partial sums. */
#define HSUM8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))

/* Weight rows per tile: a tile stays in L2 while every tile of rows passes over it. */
#define MM_TILE_BYTES (96 * 1024)

/* Pairs i0 .. half-1 of one head: the reference's rotation. */
static inline __attribute__((always_inline)) void
rope_pairs(float *restrict o, const float *restrict v, const float *restrict cs,
           const float *restrict sn, int32_t i0, int32_t half, bool norm) {
  for (int32_t i = i0; i < half; i++) {
    int32_t a = norm ? 2 * i : i, b = norm ? 2 * i + 1 : i + half;
    float v0 = v[a], v1 = v[b];
    o[a] = v0 * cs[i] - v1 * sn[i];
    o[b] = v0 * sn[i] + v1 * cs[i];
  }
}

/* Rotate each head of rows 0 .. rows-1 of x to position pos0 + t with head(o, v, cs, sn, half,
 * norm) (rope_pairs of the whole head, or its vector form); dimensions past rope_dim copied. */
static inline __attribute__((always_inline)) void
rope_rows(float *restrict out, const float *restrict x, const float *restrict cos_tab,
          const float *restrict sin_tab, const struct npu_config *c, int32_t rows, int32_t heads,
          int32_t pos0,
          void (*head)(float *restrict, const float *restrict, const float *restrict,
                       const float *restrict, int32_t, bool)) {
  const int32_t hd = c->head_dim, half = c->rope_dim / 2;
  const size_t cols = (size_t)heads * (size_t)hd;
  const bool norm = c->rope_type == NPU_ROPE_NORM;
  if (2 * half < hd) { /* the dimensions RoPE leaves alone */
    memcpy(out, x, (size_t)rows * cols * sizeof(float));
  }
  for (int32_t t = 0; t < rows; t++) {
    const float *cs = cos_tab + (size_t)(pos0 + t) * (size_t)half;
    const float *sn = sin_tab + (size_t)(pos0 + t) * (size_t)half;
    for (int32_t h = 0; h < heads; h++) {
      const size_t at = (size_t)t * cols + (size_t)h * (size_t)hd;
      head(out + at, x + at, cs, sn, half, norm);
    }
  }
}

#endif /* NPU_KERNELS_CPU_F32_UTIL_H */
