/* The attention kernels' shared body (QK, SOFTMAX, PV and the fused attention): each variant is
 * one of these functions inlined with a constant 'avx2', which picks the AVX2 score helpers
 * (compiled for AVX2 only inside an AVX2 variant). Every lane adds in the reference's order
 * (f32_util.h), so the variants give the same bits. */
#ifndef NPU_KERNELS_CPU_F32_ATTENTION_IMPL_H
#define NPU_KERNELS_CPU_F32_ATTENTION_IMPL_H

#include <math.h>

#include "kernels/cpu/f32_avx2_util.h"

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
  /* the masked rest of every row */
  for (int32_t h = 0; h < heads; h++) {
    for (int32_t t = 0; t < rows; t++) {
      float *row = s + ((size_t)h * (size_t)rows + (size_t)t) * (size_t)ctx;
      for (int32_t j = npu_attn_len(pos0, n_valid, t); j < ctx; j++) row[j] = -INFINITY;
    }
  }
  (void)avx2;
}

/* out[i0 .. i0 + 8*NV) of one (row, head), summed over keys in order: the accumulators stay in
 * registers for the whole sum. */
#define PV_ACC(NV)                                                                                 \
  do {                                                                                             \
    npu_v8f a_[NV];                                                                                \
    for (int v_ = 0; v_ < (NV); v_++) a_[v_] = (npu_v8f){0};                                       \
    for (int32_t j = 0; j < len; j++) {                                                            \
      const float pj = pr[j];                                                                      \
      const float *vj = vh + (size_t)j * kv_cols + i0;                                             \
      for (int v_ = 0; v_ < (NV); v_++) {                                                          \
        npu_v8f x_;                                                                                \
        LOAD8(x_, vj + 8 * v_);                                                                    \
        a_[v_] += x_ * pj;                                                                         \
      }                                                                                            \
    }                                                                                              \
    memcpy(o + i0, a_, sizeof(a_));                                                                \
    i0 += 8 * (NV);                                                                                \
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

/* (head, row) pairs per block: they walk the keys together, so each tile of keys and values is
 * read from memory once per block and from L1 by every pair of it. */
#define AT_PAIRS 16

/* A PV accumulator of eight output elements: key j's weighted value (vj = its value row at i0,
 * pj = its probability) added to it. */
#define AT_PV_ADD(a, vj, pj, off)                                                                  \
  do {                                                                                             \
    npu_v8f x_;                                                                                    \
    LOAD8(x_, (vj) + (off));                                                                       \
    (a) += x_ * (pj);                                                                              \
  } while (0)
/* A tile's weighted sum 'a' of eight elements folded into row o from o + i0 + off, as the
 * reference folds it: o * f.run + a * f.tile, or a on the first tile ('first'). */
#define AT_PV_FOLD(a, o, f, off)                                                                   \
  do {                                                                                             \
    if (!first) {                                                                                  \
      npu_v8f o_;                                                                                  \
      LOAD8(o_, (o) + i0 + (off));                                                                 \
      (a) = o_ * (f).run + (a) * (f).tile;                                                         \
    }                                                                                              \
    memcpy((o) + i0 + (off), &(a), sizeof(a));                                                     \
  } while (0)
/* STEP (AT_PV_ADD or AT_PV_FOLD) on four accumulators a0 .. a3 of 'a': head-dim elements i0 ..
 * i0+31. */
#define AT_PV_EACH4(STEP, a, x, y)                                                                 \
  do {                                                                                             \
    STEP(a##0, x, y, 0);                                                                           \
    STEP(a##1, x, y, 8);                                                                           \
    STEP(a##2, x, y, 16);                                                                          \
    STEP(a##3, x, y, 24);                                                                          \
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
                                                             float *restrict m, float *restrict l) {
  *m = max_of(s, n, -INFINITY);
  *l = exp_sum(s, s, n, *m, 0.0f);
}

/* Head-dim elements i0 .. hd-1 of one pair's output row o (hd): the tile's n values (from 'vt',
 * value row j0) weighted by the exponentials p, folded into o by 'f' (or o's first tile).
 * Vector lanes are head-dim elements: each adds in key order. */
static inline __attribute__((always_inline)) void at_pv(float *restrict o, const float *restrict p,
                                                        int32_t n, const float *restrict vt,
                                                        size_t kv_cols, int32_t i0, int32_t hd,
                                                        struct at_fold f, bool first) {
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
at_step2(float *restrict o0, float *restrict o1, float *restrict s0, float *restrict s1, int32_t n0,
         int32_t n1, const float *restrict vt, size_t kv_cols, int32_t hd, float *restrict max0,
         float *restrict sum0, float *restrict max1, float *restrict sum1, bool first) {
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
  float s[AT_KEYS], max[AT_PAIRS], sum[AT_PAIRS];
#ifdef NPU_HAVE_AVX2_CLONE
  float s1[AT_KEYS]; /* the second row's scores of the two-row AVX2 step */
#endif
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

#endif /* NPU_KERNELS_CPU_F32_ATTENTION_IMPL_H */
