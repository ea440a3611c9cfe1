/* FP32 kernels of the CPU backend (see kernels.h). The order of floating-point operations of each
 * output element is exactly the reference forward's: the matmul keeps eight partial sums over k
 * (lane j takes elements i = j mod 8), adds the tail sequentially and reduces the lanes pairwise;
 * attention dots and sums run sequentially over their index. Speed comes from what does not
 * change that order: tiling over rows and weight rows, independent accumulators side by side,
 * and 8-lane vector arithmetic (GCC/Clang vector extensions, AVX2 when the CPU has it). */
#include "cpu/kernels.h"

#include <math.h>
#include <string.h>

/* Eight floats: lane-wise arithmetic is IEEE single precision, as the scalar code is. */
typedef float npu_v8f __attribute__((vector_size(32)));

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

void npu_f32_rmsnorm(float *restrict out, const float *restrict x, const float *restrict w,
                     int32_t rows, int32_t cols, float eps) {
  for (int32_t t = 0; t < rows; t++) {
    const float *xr = x + (size_t)t * (size_t)cols;
    float *o = out + (size_t)t * (size_t)cols;
    float ss = 0.0f;
    for (int32_t i = 0; i < cols; i++) ss += xr[i] * xr[i];
    float scale = 1.0f / sqrtf(ss / (float)cols + eps);
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
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
               b3 = a0;
        for (int32_t i = 0; i < k8; i += 8) {
          __m256 v0 = _mm256_loadu_ps(w0 + i), v1 = _mm256_loadu_ps(w1 + i);
          __m256 xv = _mm256_loadu_ps(xs[0] + i);
          a0 = _mm256_add_ps(a0, _mm256_mul_ps(v0, xv));
          b0 = _mm256_add_ps(b0, _mm256_mul_ps(v1, xv));
          xv = _mm256_loadu_ps(xs[1] + i);
          a1 = _mm256_add_ps(a1, _mm256_mul_ps(v0, xv));
          b1 = _mm256_add_ps(b1, _mm256_mul_ps(v1, xv));
          xv = _mm256_loadu_ps(xs[2] + i);
          a2 = _mm256_add_ps(a2, _mm256_mul_ps(v0, xv));
          b2 = _mm256_add_ps(b2, _mm256_mul_ps(v1, xv));
          xv = _mm256_loadu_ps(xs[3] + i);
          a3 = _mm256_add_ps(a3, _mm256_mul_ps(v0, xv));
          b3 = _mm256_add_ps(b3, _mm256_mul_ps(v1, xv));
        }
        /* lanes: tokens 0..3 of weight row j, then of row j+1 */
        __m256 r = hsum8x8(a0, a1, a2, a3, b0, b1, b2, b3);
        if (k8 < k) {
          for (int q = 0; q < 4; q++) {
            tv[q] = tail_dot(w0, xs[q], k8, k);
            tv[4 + q] = tail_dot(w1, xs[q], k8, k);
          }
          r = _mm256_add_ps(_mm256_loadu_ps(tv), r);
        } else {
          r = _mm256_add_ps(_mm256_setzero_ps(), r); /* 0 + sum, as the reference's '+=' */
        }
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

void npu_f32_rope(float *restrict out, const float *restrict x, const float *restrict cos_tab,
                  const float *restrict sin_tab, const struct npu_config *c, int32_t rows,
                  int32_t heads, int32_t pos0) {
  const int32_t hd = c->head_dim, half = c->rope_dim / 2;
  const size_t cols = (size_t)heads * (size_t)hd;
  const bool norm = c->rope_type == NPU_ROPE_NORM;
  memcpy(out, x, (size_t)rows * cols * sizeof(float)); /* the dimensions RoPE leaves alone */
  for (int32_t t = 0; t < rows; t++) {
    const float *cs = cos_tab + (size_t)(pos0 + t) * (size_t)half;
    const float *sn = sin_tab + (size_t)(pos0 + t) * (size_t)half;
    for (int32_t h = 0; h < heads; h++) {
      const float *v = x + (size_t)t * cols + (size_t)h * (size_t)hd;
      float *o = out + (size_t)t * cols + (size_t)h * (size_t)hd;
      for (int32_t i = 0; i < half; i++) {
        int32_t a = norm ? 2 * i : i, b = norm ? 2 * i + 1 : i + half;
        float v0 = v[a], v1 = v[b];
        o[a] = v0 * cs[i] - v1 * sn[i];
        o[b] = v0 * sn[i] + v1 * cs[i];
      }
    }
  }
}

/* ---- KV cache and attention ----------------------------------------------------------------- */

void npu_f32_kv_write(float *restrict cache, const float *restrict x, int32_t pos0,
                      int32_t n_valid, int32_t cols) {
  memcpy(cache + (size_t)pos0 * (size_t)cols, x, (size_t)n_valid * (size_t)cols * sizeof(float));
}

/* Keys per block of the score kernel: one vector lane each. */
#define QK_KEYS 8
/* Head dims up to this use the vector score kernel (its transposed key block lives on the stack). */
#define QK_MAX_HD 256

/* Scores of rows t0 .. rows-1 for keys j0 .. j0+7, from 'kt' (hd, 8): key block transposed so that
 * lane l of kt[i] holds element i of key j0 + l. Each dot sums over i in order, as the reference
 * does; four rows at a time keep four independent chains in flight. */
static inline __attribute__((always_inline)) void
qk_block(float *restrict s, const float *restrict q, const float *restrict kt, int32_t hd,
         size_t q_cols, int32_t t0, int32_t rows, int32_t ctx, int32_t j0, int32_t pos0,
         int32_t n_valid, float scale) {
  int32_t t = t0;
  for (; t < rows; t += 4) {
    int32_t nt = rows - t < 4 ? rows - t : 4;
    const float *q0 = q + (size_t)t * q_cols;
    const float *q1 = nt > 1 ? q0 + q_cols : q0, *q2 = nt > 2 ? q1 + q_cols : q0,
                *q3 = nt > 3 ? q2 + q_cols : q0;
    npu_v8f d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0};
    for (int32_t i = 0; i < hd; i++) {
      npu_v8f kv;
      LOAD8(kv, kt + (size_t)i * QK_KEYS);
      d0 += kv * q0[i];
      d1 += kv * q1[i];
      d2 += kv * q2[i];
      d3 += kv * q3[i];
    }
    d0 *= scale;
    d1 *= scale;
    d2 *= scale;
    d3 *= scale;
    for (int32_t r = 0; r < nt; r++) {
      const npu_v8f *d = r == 0 ? &d0 : r == 1 ? &d1 : r == 2 ? &d2 : &d3;
      int32_t len = npu_attn_len(pos0, n_valid, t + r);
      float *row = s + (size_t)(t + r) * (size_t)ctx;
      for (int32_t l = 0; l < QK_KEYS && j0 + l < len; l++) row[j0 + l] = (*d)[l];
    }
  }
}

static inline __attribute__((always_inline)) void
qk_impl(float *restrict s, const float *restrict q, const float *restrict k, int32_t heads,
        int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx, int32_t pos0, int32_t n_valid,
        float scale) {
  const int32_t group = heads / kv_heads, n_keys = pos0 + n_valid;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)kv_heads * (size_t)hd;
  float kt[QK_MAX_HD * QK_KEYS];
  for (int32_t kvh = 0; kvh < kv_heads; kvh++) {
    const float *kh = k + (size_t)kvh * (size_t)hd;
    for (int32_t j0 = 0; j0 < n_keys; j0 += QK_KEYS) {
      /* transpose the block; lanes past the last key hold zeros and are never stored */
      for (int32_t l = 0; l < QK_KEYS; l++) {
        const float *kj = kh + (size_t)(j0 + l) * kv_cols;
        for (int32_t i = 0; i < hd; i++) kt[(size_t)i * QK_KEYS + (size_t)l] = j0 + l < n_keys ? kj[i] : 0.0f;
      }
      /* the first row that sees key j0 */
      int32_t t0 = j0 - pos0 > 0 ? j0 - pos0 : 0;
      for (int32_t h = kvh * group; h < (kvh + 1) * group; h++) {
        qk_block(s + (size_t)h * (size_t)rows * (size_t)ctx, q + (size_t)h * (size_t)hd, kt, hd,
                 q_cols, t0, rows, ctx, j0, pos0, n_valid, scale);
      }
    }
  }
}

static void qk_generic(float *restrict s, const float *restrict q, const float *restrict k,
                       int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                       int32_t pos0, int32_t n_valid, float scale) {
  qk_impl(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
}

#ifdef NPU_HAVE_AVX2_CLONE
__attribute__((target("avx2"))) static void qk_avx2(float *restrict s, const float *restrict q,
                                                    const float *restrict k, int32_t heads,
                                                    int32_t kv_heads, int32_t hd, int32_t rows,
                                                    int32_t ctx, int32_t pos0, int32_t n_valid,
                                                    float scale) {
  qk_impl(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
}
#endif

/* The plain version, for head dims past QK_MAX_HD. */
static void qk_scalar(float *restrict s, const float *restrict q, const float *restrict k,
                      int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx,
                      int32_t pos0, int32_t n_valid, float scale) {
  const int32_t group = heads / kv_heads;
  const size_t q_cols = (size_t)heads * (size_t)hd, kv_cols = (size_t)kv_heads * (size_t)hd;
  for (int32_t h = 0; h < heads; h++) {
    const float *kh = k + (size_t)(h / group) * (size_t)hd;
    for (int32_t t = 0; t < rows; t++) {
      const float *qt = q + (size_t)t * q_cols + (size_t)h * (size_t)hd;
      float *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      const int32_t len = npu_attn_len(pos0, n_valid, t);
      for (int32_t j = 0; j < len; j++) {
        const float *kj = kh + (size_t)j * kv_cols;
        float d = 0.0f;
        for (int32_t i = 0; i < hd; i++) d += qt[i] * kj[i];
        row[j] = d * scale;
      }
    }
  }
}

void npu_f32_qk(float *restrict s, const float *restrict q, const float *restrict k, int32_t heads,
                int32_t kv_heads, int32_t hd, int32_t rows, int32_t ctx, int32_t pos0,
                int32_t n_valid, float scale) {
  if (hd > QK_MAX_HD) {
    qk_scalar(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
  } else {
#ifdef NPU_HAVE_AVX2_CLONE
    if (__builtin_cpu_supports("avx2")) {
      qk_avx2(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
    } else
#endif
      qk_generic(s, q, k, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
  }
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
      /* the maximum, four chains at a time (the order cannot change a maximum; a tie between
       * -0 and +0 cannot change x - max either) */
      float m[4] = {x[0], x[0], x[0], x[0]};
      int32_t j = 1;
      for (; j + 4 <= len; j += 4) {
        for (int l = 0; l < 4; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
      }
      for (; j < len; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
      float max = m[0];
      for (int l = 1; l < 4; l++) max = m[l] > max ? m[l] : max;
      /* exponentials, summed in order as the reference does */
      float sum = 0.0f;
      for (j = 0; j < len; j++) {
        o[j] = expf(x[j] - max);
        sum += o[j];
      }
      for (j = 0; j + 8 <= len; j += 8) {
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
  for (size_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + expf(-x[i]));
}
