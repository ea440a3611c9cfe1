/* FP32 kernels of the CPU backend (see kernels.h). The order of floating-point operations of each
 * output element is exactly the reference forward's: the matmul keeps eight partial sums over k
 * (lane j takes elements i = j mod 8), adds the tail sequentially and reduces the lanes pairwise;
 * attention dots and sums run sequentially over their index, and the fused attention takes the
 * reference's tiles and folds them in its order. Speed comes from what does not change that order:
 * tiling over rows and weight rows, independent accumulators side by side, and 8-lane vector
 * arithmetic (GCC/Clang vector extensions, AVX2 when the CPU has it) whose lanes are different
 * outputs (weight rows, keys, head-dim elements), never parts of one sum except in the matmul's
 * eight partial sums, which the reference keeps too. No FMA: each product is rounded before it is
 * added, as in the scalar reference. */
#include "cpu/kernels.h"

#include <math.h>
#include <string.h>

#include "ref/expf.h"    /* npu_expf: the exponential that defines attention; npu_v8f */

/* Loads through memcpy: no alignment is assumed, and no vector crosses a call boundary. */
#define LOAD8(v, p) memcpy(&(v), (p), sizeof(npu_v8f))

/* The reference's reduction of the eight partial sums. */
#define HSUM8(a) ((((a)[0] + (a)[1]) + ((a)[2] + (a)[3])) + (((a)[4] + (a)[5]) + ((a)[6] + (a)[7])))

/* Weight rows per tile: a tile stays in L2 while every tile of rows passes over it. */
#define MM_TILE_BYTES (96 * 1024)

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
static void sum_squares(float *restrict ss, const float *restrict x, int32_t n_rows,
                        int32_t cols) {
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

/* ---- matmul --------------------------------------------------------------------------------- */

/* Finish one output from its partial sums 'acc': the tail of k sequentially, then the lanes. */
#define MM_FINISH(dst, acc, wrow, xrow, o)                                                        \
  do {                                                                                           \
    float sum_ = 0.0f;                                                                           \
    for (int32_t i_ = k8; i_ < k; i_++) sum_ += (wrow)[i_] * (xrow)[i_];                         \
    sum_ += HSUM8(acc);                                                                          \
    (dst) = bias != NULL ? sum_ + bias[o] : sum_;                                                \
  } while (0)

/* The portable matmul: 1 weight row x 4 tokens (12 of 16 SSE registers); the remaining tokens
 * (all of a decode step) one weight row after another. */
void npu_f32_matmul__generic(float *restrict out, const float *restrict x,
                             const float *restrict w, const float *restrict bias, int32_t rows,
                             int32_t k, int32_t n) {
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

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NPU_HAVE_AVX2_CLONE 1

/* Lane r of the result is the reference's reduction of a[r]:
 * ((a[r]0 + a[r]1) + (a[r]2 + a[r]3)) + ((a[r]4 + a[r]5) + (a[r]6 + a[r]7)), eight at once.
 * hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]. */
__attribute__((target("avx2"))) static inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2,
                                                            __m256 a3, __m256 a4, __m256 a5,
                                                            __m256 a6, __m256 a7) {
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

/* The reference's dot products of u0 and of u1 (k floats) with each of v[0..3]: lanes 0-3 u0 . v[l],
 * lanes 4-7 u1 . v[l]; each one's lane l sums the products of dims i = l mod 8 in order, the lanes
 * are reduced pairwise, and the tail past k8 (in order) comes first. */
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
__attribute__((target("avx2"))) static inline float dot1(const float *restrict w,
                                                         const float *restrict x, int32_t k8,
                                                         int32_t k) {
  float l[8];
  _mm256_storeu_ps(l, row_dot(w, x, k8));
  return tail_dot(w, x, k8, k) + HSUM8(l);
}

/* AVX2 tiles: 2 weight rows x 4 tokens (prefill: each weight row is read once per four tokens);
 * for the remaining tokens (decode), one weight row after another: on the machines measured,
 * interleaving even two rows' streams cut the bandwidth from ~20 to ~7 GB/s. Products are rounded
 * before they are added (no FMA), as in the reference. */
__attribute__((target("avx2"))) void npu_f32_matmul__avx2(float *restrict out,
                                                          const float *restrict x,
                                                          const float *restrict w,
                                                          const float *restrict bias,
                                                          int32_t rows, int32_t k, int32_t n) {
  const int32_t k8 = k & ~7;
  const size_t ks = (size_t)k, ns = (size_t)n;
  int32_t tile = (int32_t)(MM_TILE_BYTES / (ks * sizeof(float)));
  if (tile < 8) tile = 8;
  float tv[8], r8[8];
  for (int32_t n0 = 0; n0 < n; n0 += tile) {
    const int32_t n1 = n - n0 < tile ? n : n0 + tile;
    int32_t t = 0;
    for (; t + 4 <= rows; t += 4) {
      const float *xs[4] = {x + (size_t)t * ks, x + (size_t)(t + 1) * ks,
                            x + (size_t)(t + 2) * ks, x + (size_t)(t + 3) * ks};
      float *o = out + (size_t)t * ns;
      int32_t j = n0;
      for (; j + 2 <= n1; j += 2) {
        const float *w0 = w + (size_t)j * ks, *w1 = w0 + ks;
        /* lanes: tokens 0..3 of weight row j, then of row j+1 */
        __m256 r = dot2x4(w0, w1, xs, k8, k);
        if (bias != NULL) {
          r = _mm256_add_ps(r, _mm256_set_m128(_mm_set1_ps(bias[j + 1]), _mm_set1_ps(bias[j])));
        }
        _mm256_storeu_ps(r8, r);
        for (int q = 0; q < 4; q++) {
          o[(size_t)q * ns + (size_t)j] = r8[q];
          o[(size_t)q * ns + (size_t)j + 1] = r8[4 + q];
        }
      }
      for (; j < n1; j++) {
        const float *w0 = w + (size_t)j * ks;
        for (int q = 0; q < 4; q++) {
          float s0 = dot1(w0, xs[q], k8, k);
          o[(size_t)q * ns + (size_t)j] = bias != NULL ? s0 + bias[j] : s0;
        }
      }
    }
    for (; t < rows; t++) {
      const float *x0 = x + (size_t)t * ks;
      float *o0 = out + (size_t)t * ns;
      int32_t j = n0;
      for (; j + 8 <= n1; j += 8) {
        const float *w0 = w + (size_t)j * ks;
        __m256 a0 = row_dot(w0, x0, k8), a1 = row_dot(w0 + ks, x0, k8);
        __m256 a2 = row_dot(w0 + 2 * ks, x0, k8), a3 = row_dot(w0 + 3 * ks, x0, k8);
        __m256 a4 = row_dot(w0 + 4 * ks, x0, k8), a5 = row_dot(w0 + 5 * ks, x0, k8);
        __m256 a6 = row_dot(w0 + 6 * ks, x0, k8), a7 = row_dot(w0 + 7 * ks, x0, k8);
        __m256 r = hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
        if (k8 < k) {
          for (int q = 0; q < 8; q++) tv[q] = tail_dot(w0 + (size_t)q * ks, x0, k8, k);
          r = _mm256_add_ps(_mm256_loadu_ps(tv), r);
        } else {
          r = _mm256_add_ps(_mm256_setzero_ps(), r);
        }
        if (bias != NULL) r = _mm256_add_ps(r, _mm256_loadu_ps(bias + j));
        _mm256_storeu_ps(o0 + j, r);
      }
      for (; j < n1; j++) {
        float s0 = dot1(w + (size_t)j * ks, x0, k8, k);
        o0[j] = bias != NULL ? s0 + bias[j] : s0;
      }
    }
  }
}
#endif

bool npu_f32_have_avx2(void) {
#ifdef NPU_HAVE_AVX2_CLONE
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

void npu_f32_matmul(float *restrict out, const float *restrict x, const float *restrict w,
                    const float *restrict bias, int32_t rows, int32_t k, int32_t n) {
#ifdef NPU_HAVE_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) {
    npu_f32_matmul__avx2(out, x, w, bias, rows, k, n);
    return;
  }
#endif
  npu_f32_matmul__generic(out, x, w, bias, rows, k, n);
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

void npu_f32_rope_table(float *restrict cos_out, float *restrict sin_out, int32_t n_pos,
                        const struct npu_config *c, const float *restrict freq_factors) {
  int32_t half = c->rope_dim / 2;
  for (int32_t i = 0; i < half; i++) {
    float freq = powf(c->rope_base, -2.0f * (float)i / (float)c->rope_dim);
    if (freq_factors != NULL) freq /= freq_factors[i];
    for (int32_t pos = 0; pos < n_pos; pos++) {
      float angle = (float)pos * freq;
      cos_out[(size_t)pos * (size_t)half + (size_t)i] = cosf(angle);
      sin_out[(size_t)pos * (size_t)half + (size_t)i] = sinf(angle);
    }
  }
}

/* Pairs i0 .. half-1 of one head: the reference's rotation. */
static inline __attribute__((always_inline)) void rope_pairs(float *restrict o,
                                                             const float *restrict v,
                                                             const float *restrict cs,
                                                             const float *restrict sn, int32_t i0,
                                                             int32_t half, bool norm) {
  for (int32_t i = i0; i < half; i++) {
    int32_t a = norm ? 2 * i : i, b = norm ? 2 * i + 1 : i + half;
    float v0 = v[a], v1 = v[b];
    o[a] = v0 * cs[i] - v1 * sn[i];
    o[b] = v0 * sn[i] + v1 * cs[i];
  }
}

#ifdef NPU_HAVE_AVX2_CLONE
/* rope_pairs of a whole head, eight dimensions at a time, with the same bits: each output is the
 * reference's two products joined by its one subtraction or addition (an addition's operands
 * commute exactly). Adjacent pairs (norm): x = [a0 b0 a1 b1 ..], p = x * [c0 c0 c1 c1 ..],
 * q = [b0 a0 b1 a1 ..] * [s0 s0 s1 s1 ..]; addsub(p, q) = [a0 c0 - b0 s0, b0 c0 + a0 s0, ..]. */
__attribute__((target("avx2"))) static void rope_head_avx2(float *restrict o,
                                                           const float *restrict v,
                                                           const float *restrict cs,
                                                           const float *restrict sn, int32_t half,
                                                           bool norm) {
  int32_t i = 0;
  if (norm) {
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    for (; i + 4 <= half; i += 4) {
      const __m256 x = _mm256_loadu_ps(v + 2 * i);
      const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cs + i)), dup);
      const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sn + i)), dup);
      const __m256 p = _mm256_mul_ps(x, c), q = _mm256_mul_ps(_mm256_permute_ps(x, 0xB1), s);
      _mm256_storeu_ps(o + 2 * i, _mm256_addsub_ps(p, q));
    }
  } else {
    for (; i + 8 <= half; i += 8) {
      const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
      const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
      _mm256_storeu_ps(o + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
      _mm256_storeu_ps(o + i + half, _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)));
    }
  }
  rope_pairs(o, v, cs, sn, i, half, norm);
}
#endif

void npu_f32_rope(float *restrict out, const float *restrict x, const float *restrict cos_tab,
                  const float *restrict sin_tab, const struct npu_config *c, int32_t rows,
                  int32_t heads, int32_t pos0) {
  const int32_t hd = c->head_dim, half = c->rope_dim / 2;
  const size_t cols = (size_t)heads * (size_t)hd;
  const bool norm = c->rope_type == NPU_ROPE_NORM;
#ifdef NPU_HAVE_AVX2_CLONE
  const bool avx2 = __builtin_cpu_supports("avx2");
#endif
  if (2 * half < hd) { /* the dimensions RoPE leaves alone */
    memcpy(out, x, (size_t)rows * cols * sizeof(float));
  }
  for (int32_t t = 0; t < rows; t++) {
    const float *cs = cos_tab + (size_t)(pos0 + t) * (size_t)half;
    const float *sn = sin_tab + (size_t)(pos0 + t) * (size_t)half;
    for (int32_t h = 0; h < heads; h++) {
      const float *v = x + (size_t)t * cols + (size_t)h * (size_t)hd;
      float *o = out + (size_t)t * cols + (size_t)h * (size_t)hd;
#ifdef NPU_HAVE_AVX2_CLONE
      if (avx2) {
        rope_head_avx2(o, v, cs, sn, half, norm);
        continue;
      }
#endif
      rope_pairs(o, v, cs, sn, 0, half, norm);
    }
  }
}

/* ---- KV cache and attention ----------------------------------------------------------------- */

void npu_f32_kv_write(float *restrict cache, const float *restrict x, int32_t pos0,
                      int32_t n_valid, int32_t cols) {
  memcpy(cache + (size_t)pos0 * (size_t)cols, x, (size_t)n_valid * (size_t)cols * sizeof(float));
}

uint32_t npu_touch_lines(const void *p, size_t bytes) {
  const uint8_t *b = p;
  uint32_t sum = 0;
  for (size_t i = 0; i < bytes; i += 64) sum += b[i];
  return sum;
}

/* Keys per tile: the reference attention's, since where its tiles start and end is part of its
 * bits; the score kernel takes a tile at a time too. */
#define AT_KEYS NPU_REF_ATTN_TILE

_Static_assert(AT_KEYS % 8 == 0, "scores come eight keys at a time");

/* The key rows of a group of 'count' starting at key j0, of the n keys of a tile: past the last,
 * the last again (never stored, and never a row past what the step attends to). */
static inline __attribute__((always_inline)) void at_key_rows(const float **kj, int count,
                                                              const float *restrict kh,
                                                              size_t kv_cols, int32_t j0,
                                                              int32_t n) {
  for (int l = 0; l < count; l++) kj[l] = kh + (size_t)(j0 + l < n ? j0 + l : n - 1) * kv_cols;
}

/* Scores s[j] = npu_ref_dot(k_j, qt, hd) * scale of keys k_j = kh + j * kv_cols, j < n: eight keys
 * at a time, each in one vector whose lane l sums dims i = l mod 8 in order, then the tail of hd
 * past a multiple of 8 in order, then the lanes pairwise. s has room for n rounded up to 8. */
static inline __attribute__((always_inline)) void
at_scores_generic(float *restrict s, const float *restrict qt, const float *restrict kh,
                  size_t kv_cols, int32_t hd, int32_t n, float scale) {
  const int32_t hd8 = hd & ~7;
  for (int32_t j0 = 0; j0 < n; j0 += 8) {
    const float *kj[8];
    at_key_rows(kj, 8, kh, kv_cols, j0, n);
    npu_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int32_t i = 0; i < hd8; i += 8) {
      npu_v8f qv, kv;
      LOAD8(qv, qt + i);
      LOAD8(kv, kj[0] + i);
      a0 += kv * qv;
      LOAD8(kv, kj[1] + i);
      a1 += kv * qv;
      LOAD8(kv, kj[2] + i);
      a2 += kv * qv;
      LOAD8(kv, kj[3] + i);
      a3 += kv * qv;
      LOAD8(kv, kj[4] + i);
      a4 += kv * qv;
      LOAD8(kv, kj[5] + i);
      a5 += kv * qv;
      LOAD8(kv, kj[6] + i);
      a6 += kv * qv;
      LOAD8(kv, kj[7] + i);
      a7 += kv * qv;
    }
    const float lanes[8] = {HSUM8(a0), HSUM8(a1), HSUM8(a2), HSUM8(a3),
                            HSUM8(a4), HSUM8(a5), HSUM8(a6), HSUM8(a7)};
    for (int l = 0; l < 8; l++) {
      float sum = 0.0f;
      for (int32_t i = hd8; i < hd; i++) sum += kj[l][i] * qt[i];
      sum += lanes[l];
      s[j0 + l] = sum * scale;
    }
  }
}

#ifdef NPU_HAVE_AVX2_CLONE
/* at_scores_generic with the lanes of eight keys reduced at once (hsum8x8). */
__attribute__((target("avx2"))) static inline void
at_scores_avx2(float *restrict s, const float *restrict qt, const float *restrict kh,
               size_t kv_cols, int32_t hd, int32_t n, float scale) {
  const int32_t hd8 = hd & ~7;
  for (int32_t j0 = 0; j0 < n; j0 += 8) {
    const float *kj[8];
    at_key_rows(kj, 8, kh, kv_cols, j0, n);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int32_t i = 0; i < hd8; i += 8) {
      const __m256 qv = _mm256_loadu_ps(qt + i);
      a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_loadu_ps(kj[0] + i), qv));
      a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_loadu_ps(kj[1] + i), qv));
      a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_loadu_ps(kj[2] + i), qv));
      a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_loadu_ps(kj[3] + i), qv));
      a4 = _mm256_add_ps(a4, _mm256_mul_ps(_mm256_loadu_ps(kj[4] + i), qv));
      a5 = _mm256_add_ps(a5, _mm256_mul_ps(_mm256_loadu_ps(kj[5] + i), qv));
      a6 = _mm256_add_ps(a6, _mm256_mul_ps(_mm256_loadu_ps(kj[6] + i), qv));
      a7 = _mm256_add_ps(a7, _mm256_mul_ps(_mm256_loadu_ps(kj[7] + i), qv));
    }
    __m256 r = hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7);
    if (hd8 < hd) {
      float tv[8];
      for (int l = 0; l < 8; l++) tv[l] = tail_dot(kj[l], qt, hd8, hd);
      r = _mm256_add_ps(_mm256_loadu_ps(tv), r);
    } else {
      r = _mm256_add_ps(_mm256_setzero_ps(), r); /* 0 + sum, as the reference's '+=' */
    }
    _mm256_storeu_ps(s + j0, _mm256_mul_ps(r, _mm256_set1_ps(scale)));
  }
}

/* at_scores_avx2 for two query rows at once (s0 from qt0, s1 from qt1), four keys at a time: each
 * key row loaded serves both, and every score has the same bits. s0 and s1 have room for n
 * rounded up to 4. */
__attribute__((target("avx2"))) static inline void
at_scores2_avx2(float *restrict s0, float *restrict s1, const float *restrict qt0,
                const float *restrict qt1, const float *restrict kh, size_t kv_cols, int32_t hd,
                int32_t n, float scale) {
  const int32_t hd8 = hd & ~7;
  for (int32_t j0 = 0; j0 < n; j0 += 4) {
    const float *kj[4];
    at_key_rows(kj, 4, kh, kv_cols, j0, n);
    /* lanes 0-3: row 0's four keys, 4-7: row 1's */
    __m256 r = dot2x4(qt0, qt1, kj, hd8, hd);
    r = _mm256_mul_ps(r, _mm256_set1_ps(scale));
    _mm_storeu_ps(s0 + j0, _mm256_castps256_ps128(r));
    _mm_storeu_ps(s1 + j0, _mm256_extractf128_ps(r, 1));
  }
}
#endif

/* The largest of 'init' and x[0 .. n-1] as the reference's running maximum finds it (a NaN
 * 'init' stays; a NaN x is passed over), eight lanes at a time: the order cannot change a
 * maximum, and a tie between -0 and +0 cannot change x - max. */
static inline __attribute__((always_inline)) float max_of(const float *restrict x, int32_t n,
                                                          float init) {
  npu_v8f m8 = NPU_V8F(init);
  int32_t j = 0;
  for (; j + 8 <= n; j += 8) {
    npu_v8f v;
    LOAD8(v, x + j);
    m8 = NPU_V8F_SELECT(v > m8, v, m8);
  }
  float m = init;
  for (int l = 0; l < 8; l++) m = m8[l] > m ? m8[l] : m;
  for (; j < n; j++) m = x[j] > m ? x[j] : m;
  return m;
}

/* o[j] = npu_expf(x[j] - max) for j < n (o may be x), eight at a time; returns 'sum' with each
 * added in order, as the reference sums them. */
static inline __attribute__((always_inline)) float exp_sum(float *o, const float *x, int32_t n,
                                                           float max, float sum) {
  int32_t j = 0;
  for (; j + 8 <= n; j += 8) {
    npu_v8f v;
    LOAD8(v, x + j);
    v -= max;
    memcpy(o + j, &v, sizeof(v));
    npu_expf8(o + j, o + j);
    for (int l = 0; l < 8; l++) sum += o[j + l];
  }
  for (; j < n; j++) {
    o[j] = npu_expf(x[j] - max);
    sum += o[j];
  }
  return sum;
}

/* Tiles of keys of one KV head in the outer loop: each tile stays in L1 while every row of every
 * query head of its group takes its scores. */
static inline __attribute__((always_inline)) void
qk_impl(float *restrict s, const float *restrict q, const float *restrict k, int32_t heads,
        int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx, int32_t pos0, int32_t n_valid,
        float scale, bool avx2) {
  const int32_t group = heads / kv_heads, n_keys = pos0 + n_valid;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)kv_heads * (size_t)hd;
  float tile[AT_KEYS];
  for (int32_t kvh = 0; kvh < kv_heads; kvh++) {
    for (int32_t j0 = 0; j0 < n_keys; j0 += AT_KEYS) {
      const float *kt = k + (size_t)j0 * kv_cols + (size_t)kvh * (size_t)hd;
      for (int32_t h = kvh * group; h < (kvh + 1) * group; h++) {
        /* from the first row that sees key j0 */
        for (int32_t t = j0 - pos0 > 0 ? j0 - pos0 : 0; t < rows; t++) {
          const int32_t len = npu_attn_len(pos0, n_valid, t);
          const int32_t n = len - j0 < AT_KEYS ? len - j0 : AT_KEYS;
          const float *qt = q + (size_t)t * q_cols + (size_t)h * (size_t)hd;
#ifdef NPU_HAVE_AVX2_CLONE
          if (avx2) at_scores_avx2(tile, qt, kt, kv_cols, hd, n, scale);
          else
#endif
            at_scores_generic(tile, qt, kt, kv_cols, hd, n, scale);
          memcpy(s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx + (size_t)j0, tile,
                 (size_t)n * sizeof(float));
        }
      }
    }
  }
  (void)avx2;
}

static void qk_generic(float *restrict s, const float *restrict q, const float *restrict k,
                       int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                       int32_t pos0, int32_t n_valid, float scale) {
  qk_impl(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale, false);
}

#ifdef NPU_HAVE_AVX2_CLONE
__attribute__((target("avx2"))) static void qk_avx2(float *restrict s, const float *restrict q,
                                                    const float *restrict k, int32_t heads,
                                                    int32_t kv_heads, int32_t hd, int32_t rows,
                                                    int32_t ctx, int32_t pos0, int32_t n_valid,
                                                    float scale) {
  qk_impl(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale, true);
}
#endif

void npu_f32_qk(float *restrict s, const float *restrict q, const float *restrict k, int32_t heads,
                int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx, int32_t pos0,
                int32_t n_valid, float scale) {
#ifdef NPU_HAVE_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) {
    qk_avx2(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
  } else
#endif
    qk_generic(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
  /* the masked rest of every row */
  for (int32_t h = 0; h < heads; h++) {
    for (int32_t t = 0; t < rows; t++) {
      float *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      for (int32_t j = npu_attn_len(pos0, n_valid, t); j < ctx; j++) row[j] = -INFINITY;
    }
  }
}

void npu_f32_softmax(float *restrict p, const float *restrict s, int32_t heads, int32_t rows,
                     int32_t ctx, int32_t pos0, int32_t n_valid) {
  for (int32_t h = 0; h < heads; h++) {
    for (int32_t t = 0; t < rows; t++) {
      const size_t off = ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const float *x = s + off;
      float *o = p + off;
      const int32_t len = npu_attn_len(pos0, n_valid, t);
      const float max = max_of(x + 1, len - 1, x[0]);
      const float sum = exp_sum(o, x, len, max, 0.0f);
      int32_t j = 0;
      for (; j + 8 <= len; j += 8) {
        npu_v8f v;
        LOAD8(v, o + j);
        v /= sum;
        memcpy(o + j, &v, sizeof(v));
      }
      for (; j < len; j++) o[j] /= sum;
      for (j = len; j < ctx; j++) o[j] = 0.0f;
    }
  }
}

/* out[i0 .. i0 + 8*NV) of one (row, head), summed over keys in order: the accumulators stay in
 * registers for the whole sum. */
#define PV_ACC(NV)                                                                                \
  do {                                                                                           \
    npu_v8f a_[NV];                                                                              \
    for (int v_ = 0; v_ < (NV); v_++) a_[v_] = (npu_v8f){0};                                     \
    for (int32_t j = 0; j < len; j++) {                                                          \
      const float pj = pr[j];                                                                    \
      const float *vj = vh + (size_t)j * kv_cols + i0;                                           \
      for (int v_ = 0; v_ < (NV); v_++) {                                                        \
        npu_v8f x_;                                                                              \
        LOAD8(x_, vj + 8 * v_);                                                                  \
        a_[v_] += x_ * pj;                                                                       \
      }                                                                                          \
    }                                                                                            \
    memcpy(o + i0, a_, sizeof(a_));                                                              \
    i0 += 8 * (NV);                                                                              \
  } while (0)

static inline __attribute__((always_inline)) void
pv_impl(float *restrict out, const float *restrict p, const float *restrict v, int32_t heads,
        int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx, int32_t pos0, int32_t n_valid) {
  const int32_t group = heads / kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)kv_heads * (size_t)hd;
  for (int32_t t = 0; t < rows; t++) {
    const int32_t len = npu_attn_len(pos0, n_valid, t);
    for (int32_t h = 0; h < heads; h++) {
      const float *pr = p + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const float *vh = v + (size_t)(h / group) * (size_t)hd;
      float *o = out + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      int32_t i0 = 0;
      while (i0 + 32 <= hd) PV_ACC(4);
      while (i0 + 8 <= hd) PV_ACC(1);
      /* a head dim that is not a multiple of 8 */
      for (int32_t i = i0; i < hd; i++) {
        float acc = 0.0f;
        for (int32_t j = 0; j < len; j++) acc += pr[j] * vh[(size_t)j * kv_cols + (size_t)i];
        o[i] = acc;
      }
    }
  }
}

static void pv_generic(float *restrict out, const float *restrict p, const float *restrict v,
                       int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                       int32_t pos0, int32_t n_valid) {
  pv_impl(out, p, v, heads, kv_heads, hd, rows, ctx, pos0, n_valid);
}

#ifdef NPU_HAVE_AVX2_CLONE
__attribute__((target("avx2"))) static void pv_avx2(float *restrict out, const float *restrict p,
                                                    const float *restrict v, int32_t heads,
                                                    int32_t kv_heads, int32_t hd, int32_t rows,
                                                    int32_t ctx, int32_t pos0, int32_t n_valid) {
  pv_impl(out, p, v, heads, kv_heads, hd, rows, ctx, pos0, n_valid);
}
#endif

void npu_f32_pv(float *restrict out, const float *restrict p, const float *restrict v,
                int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                int32_t pos0, int32_t n_valid) {
#ifdef NPU_HAVE_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) {
    pv_avx2(out, p, v, heads, kv_heads, hd, rows, ctx, pos0, n_valid);
    return;
  }
#endif
  pv_generic(out, p, v, heads, kv_heads, hd, rows, ctx, pos0, n_valid);
}

/* ---- Fused attention ------------------------------------------------------------------------ */

/* (head, row) pairs per block: they walk the keys together, so each tile of keys and values is
 * read from memory once per block and from L1 by every pair of it. */
#define AT_PAIRS 16

/* A PV accumulator of eight output elements: key j's weighted value (vj = its value row at i0,
 * pj = its probability) added to it. */
#define AT_PV_ADD(a, vj, pj, off)                                                                 \
  do {                                                                                           \
    npu_v8f x_;                                                                                  \
    LOAD8(x_, (vj) + (off));                                                                     \
    (a) += x_ * (pj);                                                                            \
  } while (0)
/* A tile's weighted sum 'a' of eight elements folded into row o from o + i0 + off, as the
 * reference folds it: o * f.run + a * f.tile, or a on the first tile ('first'). */
#define AT_PV_FOLD(a, o, f, off)                                                                  \
  do {                                                                                           \
    if (!first) {                                                                                \
      npu_v8f o_;                                                                                \
      LOAD8(o_, (o) + i0 + (off));                                                               \
      (a) = o_ * (f).run + (a) * (f).tile;                                                       \
    }                                                                                            \
    memcpy((o) + i0 + (off), &(a), sizeof(a));                                                   \
  } while (0)
/* STEP (AT_PV_ADD or AT_PV_FOLD) on four accumulators a0 .. a3 of 'a': head-dim elements i0 ..
 * i0+31. */
#define AT_PV_EACH4(STEP, a, x, y)                                                                \
  do {                                                                                            \
    STEP(a##0, x, y, 0);                                                                          \
    STEP(a##1, x, y, 8);                                                                          \
    STEP(a##2, x, y, 16);                                                                         \
    STEP(a##3, x, y, 24);                                                                         \
  } while (0)
#define AT_PV_ADD4(a, vj, pj) AT_PV_EACH4(AT_PV_ADD, a, vj, pj)
#define AT_PV_FOLD4(a, o, f) AT_PV_EACH4(AT_PV_FOLD, a, o, f)

/* How a tile folds into a running result: the factors of the running side and of the tile. */
struct at_fold {
  float run, tile;
};

/* npu_expf(x - y), without the call when x - y is zero: npu_expf(+-0) is exactly 1. */
static inline __attribute__((always_inline)) float at_exp_diff(float x, float y) {
  const float d = x - y;
  return d == 0.0f ? 1.0f : npu_expf(d);
}

/* The reference's fold of a tile of maximum m and sum l into a running *max and *sum (the tile
 * alone when 'first'); returns the factors that fold the weighted sums likewise (unused on the
 * first tile). One of the two has a zero exponent, so a fold costs one exponential: two measured
 * 25 % more time in prefill's attention. */
static inline __attribute__((always_inline)) struct at_fold
at_fold_sum(float m, float l, float *restrict max, float *restrict sum, bool first) {
  const float new_max = m > *max ? m : *max;
  struct at_fold f = {0.0f, 0.0f};
  if (first) {
    *sum = l;
  } else {
    f = (struct at_fold){at_exp_diff(*max, new_max), at_exp_diff(m, new_max)};
    *sum = *sum * f.run + l * f.tile;
  }
  *max = new_max;
  return f;
}

/* One element of a tile's weighted sum u folded into the running one o (u alone on the first
 * tile): AT_PV_FOLD's arithmetic, for the elements past the last eight. */
static inline __attribute__((always_inline)) float at_fold1(float o, float u, struct at_fold f,
                                                            bool first) {
  return first ? u : o * f.run + u * f.tile;
}

/* One tile's n scores 's' on their own, as the reference takes them: overwritten with each key's
 * exponential against their maximum, which goes to *m, and their sum to *l. */
static inline __attribute__((always_inline)) void at_softmax(float *restrict s, int32_t n,
                                                             float *restrict m,
                                                             float *restrict l) {
  *m = max_of(s, n, -INFINITY);
  *l = exp_sum(s, s, n, *m, 0.0f);
}

/* Head-dim elements i0 .. hd-1 of one pair's output row o (hd): the tile's n values (from 'vt',
 * value row j0) weighted by the exponentials p, folded into o by 'f' (or o's first tile).
 * Vector lanes are head-dim elements: each adds in key order. */
static inline __attribute__((always_inline)) void
at_pv(float *restrict o, const float *restrict p, int32_t n, const float *restrict vt,
      size_t kv_cols, int32_t i0, int32_t hd, struct at_fold f, bool first) {
  for (; i0 + 32 <= hd; i0 += 32) {
    npu_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int32_t j = 0; j < n; j++) {
      const float pj = p[j], *vj = vt + (size_t)j * kv_cols + i0;
      AT_PV_ADD4(a, vj, pj);
    }
    AT_PV_FOLD4(a, o, f);
  }
  for (; i0 + 8 <= hd; i0 += 8) {
    npu_v8f a0 = {0};
    for (int32_t j = 0; j < n; j++) {
      const float pj = p[j], *vj = vt + (size_t)j * kv_cols + i0;
      AT_PV_ADD(a0, vj, pj, 0);
    }
    AT_PV_FOLD(a0, o, f, 0);
  }
  /* a head dim that is not a multiple of 8 */
  for (int32_t i = i0; i < hd; i++) {
    float u = 0.0f;
    for (int32_t j = 0; j < n; j++) u += p[j] * vt[(size_t)j * kv_cols + (size_t)i];
    o[i] = at_fold1(o[i], u, f, first);
  }
}

/* One tile (keys j0 .. j0+n-1, values from 'vt' = value row j0) for one (head, row) pair: the
 * reference's tile and fold. 's' holds the tile's scores (overwritten with their exponentials);
 * o (hd) is the pair's output row, holding its running weighted sum; *max and *sum are its
 * running maximum and sum. */
static inline __attribute__((always_inline)) void
at_step(float *restrict o, float *restrict s, int32_t n, const float *restrict vt, size_t kv_cols,
        int32_t hd, float *restrict max, float *restrict sum, bool first) {
  float m, l;
  at_softmax(s, n, &m, &l);
  at_pv(o, s, n, vt, kv_cols, 0, hd, at_fold_sum(m, l, max, sum, first), first);
}

/* at_step for two pairs at once, rows o0 and o1 (n0 <= n1 keys): each value row loaded serves
 * both (32 head-dim elements at a time, eight accumulators: the adds of one row no longer wait on
 * each other), with the same bits, since every lane still adds in key order. */
static inline __attribute__((always_inline)) void
at_step2(float *restrict o0, float *restrict o1, float *restrict s0, float *restrict s1,
         int32_t n0, int32_t n1, const float *restrict vt, size_t kv_cols, int32_t hd,
         float *restrict max0, float *restrict sum0, float *restrict max1, float *restrict sum1,
         bool first) {
  float m0, l0, m1, l1;
  at_softmax(s0, n0, &m0, &l0);
  at_softmax(s1, n1, &m1, &l1);
  const struct at_fold f0 = at_fold_sum(m0, l0, max0, sum0, first);
  const struct at_fold f1 = at_fold_sum(m1, l1, max1, sum1, first);
  int32_t i0 = 0;
  for (; i0 + 32 <= hd; i0 += 32) {
    npu_v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    int32_t j = 0;
    for (; j < n0; j++) {
      const float p0 = s0[j], p1 = s1[j], *vj = vt + (size_t)j * kv_cols + i0;
      AT_PV_ADD4(a, vj, p0);
      AT_PV_ADD4(b, vj, p1);
    }
    for (; j < n1; j++) { /* the keys only row 1 sees */
      const float p1 = s1[j], *vj = vt + (size_t)j * kv_cols + i0;
      AT_PV_ADD4(b, vj, p1);
    }
    AT_PV_FOLD4(a, o0, f0);
    AT_PV_FOLD4(b, o1, f1);
  }
  at_pv(o0, s0, n0, vt, kv_cols, i0, hd, f0, first);
  at_pv(o1, s1, n1, vt, kv_cols, i0, hd, f1, first);
}

/* o (hd) /= sum. */
static inline __attribute__((always_inline)) void at_normalize(float *restrict o, int32_t hd,
                                                               float sum) {
  int32_t i = 0;
  for (; i + 8 <= hd; i += 8) {
    npu_v8f x;
    LOAD8(x, o + i);
    x /= sum;
    memcpy(o + i, &x, sizeof(x));
  }
  for (; i < hd; i++) o[i] /= sum;
}

/* Blocks of up to AT_PAIRS (query head, row) pairs of one KV head walk the keys a tile at a time,
 * each pair taking and folding the reference's tile on each tile it sees; a pair's output row
 * in 'out' holds its running weighted sum until it is normalized. Memory beyond q, the caches and
 * out: one tile's scores and AT_PAIRS running maxima and sums, on the stack. */
static inline __attribute__((always_inline)) void
at_impl(float *restrict out, const float *restrict q, const float *restrict k,
        const float *restrict v, int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows,
        int32_t pos0, int32_t n_valid, float scale, bool avx2) {
  const int32_t group = heads / kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)kv_heads * (size_t)hd;
  const int32_t nh = group < AT_PAIRS ? group : AT_PAIRS, nt = AT_PAIRS / nh;
  float s[AT_KEYS], s1[AT_KEYS], max[AT_PAIRS], sum[AT_PAIRS];
  for (int32_t kvh = 0; kvh < kv_heads; kvh++) {
    const float *kh = k + (size_t)kvh * (size_t)hd, *vh = v + (size_t)kvh * (size_t)hd;
    const int32_t h_end = (kvh + 1) * group;
    for (int32_t h0 = kvh * group; h0 < h_end; h0 += nh) {
      const int32_t h1 = h_end - h0 < nh ? h_end : h0 + nh;
      for (int32_t t0 = 0; t0 < rows; t0 += nt) {
        const int32_t t1 = rows - t0 < nt ? rows : t0 + nt, bt = t1 - t0;
        /* the block's last row sees the most keys */
        const int32_t block_len = npu_attn_len(pos0, n_valid, t1 - 1);
        for (int32_t p = 0; p < AT_PAIRS; p++) {
          max[p] = -INFINITY;
          sum[p] = 0.0f;
        }
        for (int32_t j0 = 0; j0 < block_len; j0 += AT_KEYS) {
          const float *kt = kh + (size_t)j0 * kv_cols, *vt = vh + (size_t)j0 * kv_cols;
          for (int32_t t = t0; t < t1; t++) {
            const int32_t len = npu_attn_len(pos0, n_valid, t);
            if (len <= j0) continue;
            const int32_t n = len - j0 < AT_KEYS ? len - j0 : AT_KEYS;
#ifdef NPU_HAVE_AVX2_CLONE
            if (avx2 && t + 1 < t1) {
              /* rows t and t + 1 together: their scores share the loads of each key row (row
               * t + 1 sees at least the keys row t sees; row t ignores the scores past its own) */
              const int32_t len1 = npu_attn_len(pos0, n_valid, t + 1);
              const int32_t n1 = len1 - j0 < AT_KEYS ? len1 - j0 : AT_KEYS;
              for (int32_t h = h0; h < h1; h++) {
                const int32_t pair = (h - h0) * bt + (t - t0);
                const size_t at = (size_t)t * q_cols + (size_t)h * (size_t)hd;
                at_scores2_avx2(s, s1, q + at, q + at + q_cols, kt, kv_cols, hd, n1, scale);
                at_step2(out + at, out + at + q_cols, s, s1, n, n1, vt, kv_cols, hd, &max[pair],
                         &sum[pair], &max[pair + 1], &sum[pair + 1], j0 == 0);
              }
              t++;
              continue;
            }
#endif
            for (int32_t h = h0; h < h1; h++) {
              const int32_t pair = (h - h0) * bt + (t - t0);
              const size_t at = (size_t)t * q_cols + (size_t)h * (size_t)hd;
#ifdef NPU_HAVE_AVX2_CLONE
              if (avx2) at_scores_avx2(s, q + at, kt, kv_cols, hd, n, scale);
              else
#endif
                at_scores_generic(s, q + at, kt, kv_cols, hd, n, scale);
              at_step(out + at, s, n, vt, kv_cols, hd, &max[pair], &sum[pair], j0 == 0);
            }
          }
        }
        for (int32_t t = t0; t < t1; t++) {
          for (int32_t h = h0; h < h1; h++) {
            at_normalize(out + (size_t)t * q_cols + (size_t)h * (size_t)hd, hd,
                         sum[(h - h0) * bt + (t - t0)]);
          }
        }
      }
    }
  }
  (void)avx2;
}

/* Units u0 .. u1-1 (tile u / heads of head u % heads) of one query row's keys 0 .. len-1, each
 * tile on its own as the reference takes it (npu_f32_attention_tiles). */
static inline __attribute__((always_inline)) void
at_tiles_impl(float *restrict part, const float *restrict q, const float *restrict k,
              const float *restrict v, int32_t heads, int32_t kv_heads, int32_t hd, int32_t len,
              int32_t u0, int32_t u1, float scale, bool avx2) {
  const int32_t group = heads / kv_heads;
  const size_t kv_cols = (size_t)kv_heads * (size_t)hd, stride = (size_t)hd + 2;
  float s[AT_KEYS];
  for (int32_t u = u0; u < u1; u++) {
    const int32_t h = u % heads, j0 = u / heads * AT_KEYS;
    const int32_t n = len - j0 < AT_KEYS ? len - j0 : AT_KEYS;
    const size_t kv_off = (size_t)(h / group) * (size_t)hd;
    const float *kt = k + (size_t)j0 * kv_cols + kv_off, *qh = q + (size_t)h * (size_t)hd;
    float *r = part + (size_t)u * stride;
#ifdef NPU_HAVE_AVX2_CLONE
    if (avx2) at_scores_avx2(s, qh, kt, kv_cols, hd, n, scale);
    else
#endif
      at_scores_generic(s, qh, kt, kv_cols, hd, n, scale);
    at_softmax(s, n, &r[0], &r[1]);
    at_pv(r + 2, s, n, v + (size_t)j0 * kv_cols + kv_off, kv_cols, 0, hd,
          (struct at_fold){0.0f, 0.0f}, true);
  }
  (void)avx2;
}

void npu_f32_attention_tiles__generic(float *restrict part, const float *restrict q,
                                      const float *restrict k, const float *restrict v,
                                      int32_t heads, int32_t kv_heads, int32_t hd, int32_t len,
                                      int32_t u0, int32_t u1, float scale) {
  at_tiles_impl(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale, false);
}

#ifdef NPU_HAVE_AVX2_CLONE
__attribute__((target("avx2"))) void
npu_f32_attention_tiles__avx2(float *restrict part, const float *restrict q,
                              const float *restrict k, const float *restrict v, int32_t heads,
                              int32_t kv_heads, int32_t hd, int32_t len, int32_t u0,
                              int32_t u1, float scale) {
  at_tiles_impl(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale, true);
}
#else
void npu_f32_attention_tiles__avx2(float *restrict part, const float *restrict q,
                                   const float *restrict k, const float *restrict v,
                                   int32_t heads, int32_t kv_heads, int32_t hd, int32_t len,
                                   int32_t u0, int32_t u1, float scale) {
  npu_f32_attention_tiles__generic(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale);
}
#endif

void npu_f32_attention_tiles(float *restrict part, const float *restrict q,
                             const float *restrict k, const float *restrict v, int32_t heads,
                             int32_t kv_heads, int32_t hd, int32_t len, int32_t u0,
                             int32_t u1, float scale) {
#ifdef NPU_HAVE_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) {
    npu_f32_attention_tiles__avx2(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale);
    return;
  }
#endif
  npu_f32_attention_tiles__generic(part, q, k, v, heads, kv_heads, hd, len, u0, u1, scale);
}

void npu_f32_attention_fold(float *restrict out, const float *restrict part, int32_t heads,
                            int32_t hd, int32_t n_tiles) {
  const size_t stride = (size_t)hd + 2;
  for (int32_t h = 0; h < heads; h++) {
    float *o = out + (size_t)h * (size_t)hd, max = -INFINITY, sum = 0.0f;
    for (int32_t tile = 0; tile < n_tiles; tile++) {
      const float *r = part + ((size_t)tile * (size_t)heads + (size_t)h) * stride, *u = r + 2;
      const bool first = tile == 0;
      const struct at_fold f = at_fold_sum(r[0], r[1], &max, &sum, first);
      int32_t i0 = 0;
      for (; i0 + 8 <= hd; i0 += 8) {
        npu_v8f y;
        LOAD8(y, u + i0);
        AT_PV_FOLD(y, o, f, 0);
      }
      for (int32_t i = i0; i < hd; i++) o[i] = at_fold1(o[i], u[i], f, first);
    }
    at_normalize(o, hd, sum);
  }
}

void npu_f32_attention__generic(float *restrict out, const float *restrict q,
                                const float *restrict k, const float *restrict v, int32_t heads,
                                int32_t kv_heads, int32_t hd, int32_t rows, int32_t pos0,
                                int32_t n_valid, float scale) {
  at_impl(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale, false);
}

#ifdef NPU_HAVE_AVX2_CLONE
__attribute__((target("avx2"))) void
npu_f32_attention__avx2(float *restrict out, const float *restrict q, const float *restrict k,
                        const float *restrict v, int32_t heads, int32_t kv_heads, int32_t hd,
                        int32_t rows, int32_t pos0, int32_t n_valid, float scale) {
  at_impl(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale, true);
}
#else
void npu_f32_attention__avx2(float *restrict out, const float *restrict q, const float *restrict k,
                             const float *restrict v, int32_t heads, int32_t kv_heads, int32_t hd,
                             int32_t rows, int32_t pos0, int32_t n_valid, float scale) {
  npu_f32_attention__generic(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale);
}
#endif

void npu_f32_attention(float *restrict out, const float *restrict q, const float *restrict k,
                       const float *restrict v, int32_t heads, int32_t kv_heads, int32_t hd,
                       int32_t rows, int32_t pos0, int32_t n_valid, float scale) {
#ifdef NPU_HAVE_AVX2_CLONE
  if (__builtin_cpu_supports("avx2")) {
    npu_f32_attention__avx2(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale);
    return;
  }
#endif
  npu_f32_attention__generic(out, q, k, v, heads, kv_heads, hd, rows, pos0, n_valid, scale);
}

/* ---- Element-wise --------------------------------------------------------------------------- */

/* out[i] = a[i] OP b[i], eight at a time. */
#define ELEMENTWISE(OP)                                                                           \
  do {                                                                                           \
    size_t i = 0;                                                                                \
    for (; i + 8 <= n; i += 8) {                                                                 \
      npu_v8f va, vb;                                                                            \
      LOAD8(va, a + i);                                                                          \
      LOAD8(vb, b + i);                                                                          \
      va = va OP vb;                                                                             \
      memcpy(out + i, &va, sizeof(va));                                                          \
    }                                                                                            \
    for (; i < n; i++) out[i] = a[i] OP b[i];                                                    \
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
