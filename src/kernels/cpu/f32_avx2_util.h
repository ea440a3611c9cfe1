/* AVX2 helpers of the CPU's float kernels (matmul and attention scores): dot products whose lanes
 * add in the reference's order (f32_util.h), eight rows reduced at once. */
#ifndef NPU_KERNELS_CPU_F32_AVX2_UTIL_H
#define NPU_KERNELS_CPU_F32_AVX2_UTIL_H

#include "kernels/cpu/f32_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NPU_HAVE_AVX2_CLONE 1

/* Lane r of the result is the reference's reduction of a[r]:
 * ((a[r]0 + a[r]1) + (a[r]2 + a[r]3)) + ((a[r]4 + a[r]5) + (a[r]6 + a[r]7)), eight at once.
 * hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]. */
__attribute__((target("avx2"))) static inline __m256
hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

/* Sum of x[i] * w[i] over the tail i = k8 .. k-1, in order (0 when k is a multiple of 8). */
static inline float tail_dot(const float *restrict w, const float *restrict x, int32_t k8,
                             int32_t k) {
  float sum = 0.0f;
  for (int32_t i = k8; i < k; i++) sum += w[i] * x[i];
  return sum;
}

/* The reference's dot products of u0 and of u1 (k floats) with each of v[0..3]: lanes 0-3 u0 .
 * v[l], lanes 4-7 u1 . v[l]; each one's lane l sums the products of dims i = l mod 8 in order, the
 * lanes are reduced pairwise, and the tail past k8 (in order) comes first. */
__attribute__((target("avx2"))) static inline __m256 dot2x4(const float *restrict u0,
                                                            const float *restrict u1,
                                                            const float *const v[4], int32_t k8,
                                                            int32_t k) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  for (int32_t i = 0; i < k8; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(u0 + i), x1 = _mm256_loadu_ps(u1 + i);
    __m256 y = _mm256_loadu_ps(v[0] + i);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(x0, y));
    b0 = _mm256_add_ps(b0, _mm256_mul_ps(x1, y));
    y = _mm256_loadu_ps(v[1] + i);
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(x0, y));
    b1 = _mm256_add_ps(b1, _mm256_mul_ps(x1, y));
    y = _mm256_loadu_ps(v[2] + i);
    a2 = _mm256_add_ps(a2, _mm256_mul_ps(x0, y));
    b2 = _mm256_add_ps(b2, _mm256_mul_ps(x1, y));
    y = _mm256_loadu_ps(v[3] + i);
    a3 = _mm256_add_ps(a3, _mm256_mul_ps(x0, y));
    b3 = _mm256_add_ps(b3, _mm256_mul_ps(x1, y));
  }
  const __m256 r = hsum8x8(a0, a1, a2, a3, b0, b1, b2, b3);
  if (k8 == k) return _mm256_add_ps(_mm256_setzero_ps(), r); /* 0 + sum, as the reference's '+=' */
  float tv[8];
  for (int l = 0; l < 4; l++) {
    tv[l] = tail_dot(u0, v[l], k8, k);
    tv[4 + l] = tail_dot(u1, v[l], k8, k);
  }
  return _mm256_add_ps(_mm256_loadu_ps(tv), r);
}

/* The eight partial sums of one row: lane l sums w[i] * x[i] over i = l mod 8, in order. */
__attribute__((target("avx2"))) static inline __m256 row_dot(const float *restrict w,
                                                             const float *restrict x, int32_t k8) {
  __m256 a = _mm256_setzero_ps();
  for (int32_t i = 0; i < k8; i += 8) {
    a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i)));
  }
  return a;
}

/* One output the plain way (the edges of a tile). */
__attribute__((target("avx2"))) static inline float
dot1(const float *restrict w, const float *restrict x, int32_t k8, int32_t k) {
  float l[8];
  _mm256_storeu_ps(l, row_dot(w, x, k8));
  return tail_dot(w, x, k8, k) + HSUM8(l);
}
#endif

#endif /* NPU_KERNELS_CPU_F32_AVX2_UTIL_H */
