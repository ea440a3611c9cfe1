/* NPU integer kernels: the requantization definition on its edge cases, the compile-time
 * quantization helpers, and every kernel variant of src/kernels/npu/npu_ukernels.inc against a
 * naive reference, bit for bit, on awkward shapes, zero-point extremes, both output types and
 * sub-ranges; plus the scalar GEMM against plain floating-point math of the same dequantized
 * computation (within one output LSB). The transfers' conversions are checked here through their
 * scalar variants; test_cpu_kernels.c holds each other variant to those bits. */
#include <math.h>
#include <string.h>

#include "backends/npu_emu.h"
#include "base/pool.h"
#include "kernels/cpu/cpu_ukernels.h" /* npu_quantize_s8__scalar, ...: the transfers' conversions */
#include "kernels/npu/fixedpoint.h"
#include "kernels/npu/npu_ukernels.h"
#include "program/qparams.h"
#include "test_util.h"

/* ---- helpers ----------------------------------------------------------------------------------*/

static int32_t rand_range(uint64_t *rng, int32_t lo, int32_t hi) { /* inclusive */
  return lo + (int32_t)(test_rand(rng) % (uint64_t)((int64_t)hi - lo + 1));
}

static double rand_unit(uint64_t *rng) { return (double)(test_rand(rng) >> 11) * 0x1p-53; }

static void *xmalloc(size_t n) {
  void *p = malloc(n > 0 ? n : 1);
  assert_non_null(p);
  return p;
}

/* Skip a variant whose instruction set this CPU lacks. */
static void require_isa(uint32_t need) {
  if ((need & ~npu_isa_detect()) != 0) {
    print_message("CPU lacks the variant's instruction set: skipped\n");
    skip();
  }
}

/* Exact round-half-up of acc * mult * 2^(shift - 31) from the mathematical definition (no
 * left/right split), valid when no saturating left shift is involved. */
static int64_t exact_requant(int32_t acc, int32_t mult, int32_t shift) {
  const __int128 num = (__int128)acc * mult; /* value = num / 2^(31 - shift) */
  const int t = 31 - shift;                  /* >= 1 */
  return (int64_t)((2 * num + ((__int128)1 << t)) >> (t + 1));
}

static bool left_saturates(int32_t acc, int32_t shift) {
  const int64_t v = (int64_t)acc * ((int64_t)1 << npu_requant_left(shift));
  return v > INT32_MAX || v < INT32_MIN;
}

/* ---- requantization: the one definition -------------------------------------------------------*/

static void test_requantize_ties(void **state) {
  (void)state;
  /* real = 0.5 (mult 2^30, shift 0): x.5 rounds towards +infinity. */
  assert_int_equal(npu_requantize(5, 1 << 30, 0), 3);
  assert_int_equal(npu_requantize(-5, 1 << 30, 0), -2);
  assert_int_equal(npu_requantize(3, 1 << 30, 0), 2);
  assert_int_equal(npu_requantize(-3, 1 << 30, 0), -1);
  assert_int_equal(npu_requantize(1, 1 << 30, 0), 1);
  assert_int_equal(npu_requantize(-1, 1 << 30, 0), 0);
  /* real = 2^-6 (shift -5): 96 / 64 = 1.5 -> 2, -1.5 -> -1; just off the ties. */
  assert_int_equal(npu_requantize(96, 1 << 30, -5), 2);
  assert_int_equal(npu_requantize(-96, 1 << 30, -5), -1);
  assert_int_equal(npu_requantize(95, 1 << 30, -5), 1);
  assert_int_equal(npu_requantize(-97, 1 << 30, -5), -2);
  /* The largest right shift: real = 2^-32. */
  assert_int_equal(npu_requantize(INT32_MIN, 1 << 30, -31), 0);    /* -0.5 -> 0 */
  assert_int_equal(npu_requantize(INT32_MAX, 1 << 30, -31), 0);    /* 0.49999... */
  assert_int_equal(npu_requantize(INT32_MIN, INT32_MAX, -31), -1); /* -(1 - 2^-31) */
  /* Ties through the saturating int8 / int16 paths with zero points. */
  assert_int_equal(npu_requantize_s8(5, 1 << 30, 0, -128), -125);
  assert_int_equal(npu_requantize_s8(-5, 1 << 30, 0, 127), 125);
  assert_int_equal(npu_requantize_s16(-5, 1 << 30, 0, 0), -2);
  /* Identity: real = 1 - 2^-31 is not exactly 1, but round() of it is for small acc. */
  for (int32_t a = -1000; a <= 1000; a++) assert_int_equal(npu_requantize(a, INT32_MAX, 0), a);
  /* real = 1 exactly as (2^30, 1). */
  assert_int_equal(npu_requantize(123456789, 1 << 30, 1), 123456789);
  assert_int_equal(npu_requantize((1 << 29) - 1, 1 << 30, 1), (1 << 29) - 1);
  assert_int_equal(npu_requantize(-(1 << 29), 1 << 30, 1), -(1 << 29));
  /* Beyond that the left shift (by 2) saturates: the magnitude stays at mult / 2 = 2^29. */
  assert_int_equal(npu_requantize(INT32_MIN, 1 << 30, 1), -(1 << 29));
  assert_int_equal(npu_requantize(INT32_MAX, 1 << 30, 1), 1 << 29);
}

static void test_requantize_extremes(void **state) {
  (void)state;
  const int32_t accs[] = {
      INT32_MIN, INT32_MIN + 1, -(1 << 30), -65536, -32769,  -255,          -1,       0,
      1,         255,           32768,      65535,  1 << 30, INT32_MAX - 1, INT32_MAX};
  const int32_t mults[] = {0, 1, 1 << 30, (1 << 30) + 1, INT32_MAX - 1, INT32_MAX};
  for (size_t ia = 0; ia < sizeof(accs) / sizeof(accs[0]); ia++)
    for (size_t im = 0; im < sizeof(mults) / sizeof(mults[0]); im++)
      for (int32_t shift = -31; shift <= 30; shift++) {
        const int32_t acc = accs[ia], mult = mults[im];
        const int32_t r = npu_requantize(acc, mult, shift);
        if (!left_saturates(acc, shift)) {
          assert_true(r == exact_requant(acc, mult, shift));
        } else {
          /* Saturated left shift: the magnitude is still at least about mult / 2. */
          assert_true(acc > 0 ? r >= mult / 2 - 1 : r <= -(mult / 2));
        }
        if (mult == 0) assert_int_equal(r, 0);
        /* Saturation to int8 / int16 at the extreme zero points. */
        const int64_t r8lo = (int64_t)r - 128, r8hi = (int64_t)r + 127;
        assert_int_equal(npu_requantize_s8(acc, mult, shift, -128), r8lo < -128  ? -128
                                                                    : r8lo > 127 ? 127
                                                                                 : r8lo);
        assert_int_equal(npu_requantize_s8(acc, mult, shift, 127), r8hi < -128  ? -128
                                                                   : r8hi > 127 ? 127
                                                                                : r8hi);
        const int64_t r16lo = (int64_t)r - 32768, r16hi = (int64_t)r + 32767;
        assert_int_equal(npu_requantize_s16(acc, mult, shift, -32768), r16lo < -32768  ? -32768
                                                                       : r16lo > 32767 ? 32767
                                                                                       : r16lo);
        assert_int_equal(npu_requantize_s16(acc, mult, shift, 32767), r16hi < -32768  ? -32768
                                                                      : r16hi > 32767 ? 32767
                                                                                      : r16hi);
      }
  /* Full-scale accumulators saturate both output types. */
  assert_int_equal(npu_requantize_s8(INT32_MAX, INT32_MAX, 30, 0), 127);
  assert_int_equal(npu_requantize_s8(INT32_MIN, INT32_MAX, 30, 0), -128);
  assert_int_equal(npu_requantize_s16(INT32_MAX, 1 << 30, 0, 0), 32767);
  assert_int_equal(npu_requantize_s16(INT32_MIN, 1 << 30, 0, 0), -32768);
  assert_int_equal(npu_requantize_s8(INT32_MIN, INT32_MAX, -1, 127), -128);
}

static void test_requantize_random(void **state) {
  (void)state;
  uint64_t rng = 0x5eed;
  for (int i = 0; i < 200000; i++) {
    const int32_t acc = (int32_t)(uint32_t)test_rand(&rng) >> rand_range(&rng, 0, 31);
    const int32_t mult = rand_range(&rng, 1 << 30, INT32_MAX);
    const int32_t shift = rand_range(&rng, -31, 30);
    if (!left_saturates(acc, shift))
      assert_true(npu_requantize(acc, mult, shift) == exact_requant(acc, mult, shift));
  }
}

/* ---- compile-time helpers ---------------------------------------------------------------------*/

static void test_quantize_multiplier(void **state) {
  (void)state;
  int32_t m, s;
  assert_true(npu_quantize_multiplier(0.0, &m, &s));
  assert_int_equal(m, 0);
  assert_int_equal(s, 0);
  assert_true(npu_quantize_multiplier(0.5, &m, &s));
  assert_int_equal(m, 1 << 30);
  assert_int_equal(s, 0);
  assert_true(npu_quantize_multiplier(1.0, &m, &s));
  assert_int_equal(m, 1 << 30);
  assert_int_equal(s, 1);
  /* Rounds up to 1.0 -> renormalized. */
  assert_true(npu_quantize_multiplier(1.0 - 0x1p-40, &m, &s));
  assert_int_equal(m, 1 << 30);
  assert_int_equal(s, 1);
  /* Tiny: denormal multiplier at shift -31. */
  assert_true(npu_quantize_multiplier(0x1p-40, &m, &s));
  assert_int_equal(s, -31);
  assert_int_equal(m, 1 << 22);
  assert_true(npu_quantize_multiplier(1e-30, &m, &s));
  assert_int_equal(m, 0);
  /* Large, and out of range. */
  assert_true(npu_quantize_multiplier(0x1p29 * 1.5, &m, &s));
  assert_int_equal(s, 30);
  assert_false(npu_quantize_multiplier(0x1p30, &m, &s));
  assert_false(npu_quantize_multiplier(-1.0, &m, &s));
  assert_false(npu_quantize_multiplier(NAN, &m, &s));
  assert_false(npu_quantize_multiplier(INFINITY, &m, &s));
  /* Round trips over the whole range: within half a Q31 ulp. */
  uint64_t rng = 42;
  for (int i = 0; i < 100000; i++) {
    const double real = ldexp(0.5 + 0.5 * rand_unit(&rng), rand_range(&rng, -45, 29));
    assert_true(npu_quantize_multiplier(real, &m, &s));
    assert_true(s >= -31 && s <= 30 && m >= 0);
    if (s > -31) assert_true(m >= (1 << 30));
    const double back = ldexp((double)m, s - 31);
    assert_true(fabs(back - real) <= ldexp(1.0, s - 32));
  }
}

static void test_quantize_weights(void **state) {
  (void)state;
  uint64_t rng = 3;
  enum { R = 9, C = 33 };
  float w[R * C], scales[R];
  int8_t q[R * C];
  for (int i = 0; i < R * C; i++) w[i] = (float)(rand_unit(&rng) * 2.0 - 1.0) * (float)(1 + i / C);
  for (int c = 0; c < C; c++) w[4 * C + c] = 0.0f; /* an all-zero row */
  w[2 * C + 5] = -100.0f;                          /* the absmax of row 2 is negative */
  assert_true(npu_quantize_weights_per_channel(w, R, C, q, scales));
  for (int r = 0; r < R; r++) {
    float absmax = 0.0f;
    for (int c = 0; c < C; c++) absmax = fmaxf(absmax, fabsf(w[r * C + c]));
    assert_true(scales[r] == absmax / 127.0f);
    for (int c = 0; c < C; c++) {
      assert_true(q[r * C + c] >= -127 && q[r * C + c] <= 127);
      assert_true(fabsf(w[r * C + c] - scales[r] * q[r * C + c]) <= 0.5001f * scales[r]);
    }
  }
  assert_int_equal(q[2 * C + 5], -127);
  assert_true(scales[4] == 0.0f);
  w[7] = NAN;
  assert_false(npu_quantize_weights_per_channel(w, R, C, q, scales));
  w[7] = INFINITY;
  assert_false(npu_quantize_weights_per_channel(w, R, C, q, scales));
}

static void test_quantize_activations(void **state) {
  (void)state;
  /* Round half away from zero, saturation, NaN. */
  const float x[] = {1.25f,    -1.25f, 0.75f,    -0.75f,    1000.0f,
                     -1000.0f, NAN,    INFINITY, -INFINITY, 0.0f};
  int8_t q[10];
  npu_quantize_s8__scalar(x, 10, 0.5f, 3, q);
  const int8_t want[] = {6, 0, 5, 1, 127, -128, 3, 127, -128, 3};
  assert_memory_equal(q, want, sizeof(want));
  int16_t q16[10];
  npu_quantize_s16__scalar(x, 10, 0.5f, 0, q16);
  assert_int_equal(q16[0], 3);
  assert_int_equal(q16[1], -3);
  assert_int_equal(q16[4], 2000);
  assert_int_equal(q16[7], 32767);
  /* Asymmetric params: 0 exact, round trip within half a step. */
  float scale;
  int32_t zp;
  npu_choose_qparams_s8(-0.3f, 2.7f, &scale, &zp);
  assert_true(fabsf(scale - 3.0f / 255.0f) < 1e-7f);
  const float zero = 0.0f;
  int8_t qz;
  npu_quantize_s8__scalar(&zero, 1, scale, zp, &qz);
  assert_int_equal(qz, zp);
  float back;
  npu_dequantize_s8__scalar(&qz, 1, scale, zp, &back);
  assert_true(back == 0.0f);
  uint64_t rng = 11;
  for (int i = 0; i < 1000; i++) {
    const float v = (float)(-0.3 + 3.0 * rand_unit(&rng));
    int8_t qv;
    npu_quantize_s8__scalar(&v, 1, scale, zp, &qv);
    npu_dequantize_s8__scalar(&qv, 1, scale, zp, &back);
    assert_true(fabsf(back - v) <= 0.5001f * scale);
  }
  npu_choose_qparams_s8(0.5f, 2.0f, &scale, &zp); /* widened to contain 0 */
  assert_int_equal(zp, -128);
  npu_choose_qparams_s8(-4.0f, -1.0f, &scale, &zp);
  assert_int_equal(zp, 127);
  npu_choose_qparams_s8(0.0f, 0.0f, &scale, &zp);
  assert_true(scale == 1.0f && zp == 0);
  assert_true(npu_choose_scale_sym(254.0f, 127) == 2.0f);
  int16_t s16 = -32768;
  npu_dequantize_s16__scalar(&s16, 1, 0.5f, 0, &back);
  assert_true(back == -16384.0f);
  /* Bias: range check. */
  const float bias[2] = {1.0f, 1e12f};
  const float ws[2] = {0.01f, 0.01f};
  int32_t qb[2];
  assert_true(npu_quantize_bias(bias, 1, 0.1f, ws, qb));
  assert_int_equal(qb[0], 1000);
  assert_false(npu_quantize_bias(bias, 2, 0.1f, ws, qb));
}

static void test_lut_build_silu(void **state) {
  (void)state;
  int8_t table[256];
  const float xs = 8.0f / 128, ys = 8.0f / 128;
  npu_lut_s8_build(npu_silu, xs, 0, ys, -20, table);
  for (int q = -128; q <= 127; q++) {
    const double want = npu_silu(xs * q) / ys - 20;
    assert_true(fabs(table[q + 128] - fmin(fmax(round(want), -128), 127)) < 1e-9);
  }
  assert_int_equal(table[128], -20); /* silu(0) = 0 */
}

/* ---- GEMM -------------------------------------------------------------------------------------*/

struct gemm_case {
  size_t m, n, k, x_stride, y_stride;
  int8_t *x, *w;
  int32_t *bias; /* NULL: none */
  int32_t *mult, *shift;
  int32_t zx, zy;
  void *packed;
};

static void gemm_case_make(struct gemm_case *c, size_t m, size_t n, size_t k, bool with_bias,
                           int32_t zx, int32_t zy, uint64_t *rng) {
  c->m = m;
  c->n = n;
  c->k = k;
  c->x_stride = k + (size_t)rand_range(rng, 0, 5);
  c->y_stride = n + (size_t)rand_range(rng, 0, 3);
  c->x = xmalloc(m * c->x_stride);
  c->w = xmalloc(n * k);
  c->bias = with_bias ? xmalloc(n * sizeof(int32_t)) : NULL;
  c->mult = xmalloc(n * sizeof(int32_t));
  c->shift = xmalloc(n * sizeof(int32_t));
  c->zx = zx;
  c->zy = zy;
  const int mode = rand_range(rng, 0, 3); /* 0: extreme values, else random */
  for (size_t i = 0; i < m * c->x_stride; i++)
    c->x[i] = mode == 0 ? (int8_t)(i % 3 == 0 ? 127 : -128) : (int8_t)rand_range(rng, -128, 127);
  for (size_t i = 0; i < n * k; i++)
    c->w[i] = mode == 0 ? (int8_t)(i % 2 ? 127 : -127) : (int8_t)rand_range(rng, -127, 127);
  /* Multipliers that spread the outputs over the int8 range, plus some extremes. */
  const double typical = 1.0 / (64.0 * 128.0 * sqrt((double)k));
  for (size_t j = 0; j < n; j++) {
    if (c->bias != NULL)
      c->bias[j] = rand_range(rng, -(1 << 30), 1 << 30) >> rand_range(rng, 0, 30);
    if (rand_range(rng, 0, 9) == 0) {
      c->mult[j] = rand_range(rng, 0, 1) ? INT32_MAX : (1 << 30);
      c->shift[j] = rand_range(rng, -31, 30);
    } else {
      assert_true(npu_quantize_multiplier(typical * (0.25 + 4.0 * rand_unit(rng)), &c->mult[j],
                                          &c->shift[j]));
    }
  }
  c->packed = xmalloc(npu_qs8_gemm_packed_size(n, k));
  assert_true(npu_qs8_gemm_pack(n, k, c->w, c->bias, c->packed));
}

/* Pack the case's weights again: as they are (int8), or for the w4a8 kernels first mapped to
 * int4 as w >> 4 (so that +-127 become the int4 extremes 7 and -8) and packed in the qc4w layout
 * (block 0). */
static void gemm_case_pack(struct gemm_case *c, bool int4) {
  if (!int4) {
    assert_true(npu_qs8_gemm_pack(c->n, c->k, c->w, c->bias, c->packed));
    return;
  }
  for (size_t i = 0; i < c->n * c->k; i++) c->w[i] = (int8_t)(c->w[i] >> 4);
  free(c->packed);
  c->packed = xmalloc(npu_qc4w_gemm_packed_size(c->n, c->k, 0));
  assert_true(npu_qc4w_gemm_pack(c->n, c->k, c->w, c->bias, 0, NULL, c->packed));
}

static void gemm_case_free(struct gemm_case *c) {
  free(c->x);
  free(c->w);
  free(c->bias);
  free(c->mult);
  free(c->shift);
  free(c->packed);
}

/* The naive reference: y[i, j] from unpacked weights. */
static int32_t gemm_ref(const struct gemm_case *c, size_t i, size_t j, bool out16) {
  int32_t acc = c->bias != NULL ? c->bias[j] : 0;
  for (size_t kk = 0; kk < c->k; kk++)
    acc += (c->x[i * c->x_stride + kk] - c->zx) * c->w[j * c->k + kk];
  return out16 ? npu_requantize_s16(acc, c->mult[j], c->shift[j], c->zy)
               : npu_requantize_s8(acc, c->mult[j], c->shift[j], c->zy);
}

/* Run columns [n_begin, n_end) of case 'c' through fn8 or fn16; compare with the reference and
 * check that nothing else in y was written. */
static void gemm_check(const struct gemm_case *c, npu_qs8_gemm_fn *fn8, npu_qs8_gemm_qs16_fn *fn16,
                       size_t n_begin, size_t n_end) {
  const bool out16 = fn16 != NULL;
  const size_t esize = out16 ? 2 : 1;
  const size_t ysize = c->m * c->y_stride * esize;
  uint8_t *y = xmalloc(ysize);
  memset(y, 0x5a, ysize);
  const struct npu_qs8_gemm_params p = {c->mult, c->shift, c->zx, c->zy};
  if (out16)
    fn16(c->m, n_begin, n_end, c->k, c->x, c->x_stride, c->packed, (int16_t *)y, c->y_stride, &p);
  else fn8(c->m, n_begin, n_end, c->k, c->x, c->x_stride, c->packed, (int8_t *)y, c->y_stride, &p);
  for (size_t i = 0; i < c->m; i++)
    for (size_t j = 0; j < c->y_stride; j++) {
      const uint8_t *e = y + (i * c->y_stride + j) * esize;
      if (j >= n_begin && j < n_end) {
        const int32_t got = out16 ? ((const int16_t *)y)[i * c->y_stride + j]
                                  : ((const int8_t *)y)[i * c->y_stride + j];
        const int32_t want = gemm_ref(c, i, j, out16);
        if (got != want)
          fail_msg("m=%zu n=%zu k=%zu zx=%d zy=%d bias=%d out16=%d [%zu,%zu): y[%zu,%zu] = %d, "
                   "want %d (mult %d shift %d)",
                   c->m, c->n, c->k, c->zx, c->zy, c->bias != NULL, out16, n_begin, n_end, i, j,
                   got, want, c->mult[j], c->shift[j]);
      } else {
        for (size_t b = 0; b < esize; b++) assert_int_equal(e[b], 0x5a);
      }
    }
  free(y);
}

/* The largest accumulators the ranges allow: k up to 32768, x and w at their extremes (all of one
 * sign, or the signs flipping halfway along k so that a kernel's running sum swings the furthest
 * from its start), zero points -128 / 127 and biases +-2^30: |acc| reaches 2^30 + 255 * 127 *
 * 32768, just below 2^31. Multipliers near 2^-24 keep such sums inside the int8 and int16 ranges
 * (others saturate), so every bit of the accumulator shows. */
static void gemm_extreme_check(npu_qs8_gemm_fn *fn8, npu_qs8_gemm_qs16_fn *fn16, bool int4,
                               uint64_t *rng) {
  static const size_t ks[] = {32768, 32767, 32765, 20001};
  static const size_t ms[] = {1, 7};
  for (int rep = 0; rep < 8; rep++) {
    const size_t k = ks[rep % 4], m = ms[rep % 2], n = 37;
    const int32_t zx = rep % 2 ? 127 : -128;
    struct gemm_case c;
    gemm_case_make(&c, m, n, k, true, zx, 0, rng);
    const int x_mode = rep / 2 % 4; /* x: the far end from zx, the near end, alternating, random */
    for (size_t i = 0; i < m * c.x_stride; i++) {
      const int8_t far = zx < 0 ? 127 : -128, near = zx < 0 ? -128 : 127;
      c.x[i] = x_mode == 0   ? far
               : x_mode == 1 ? near
               : x_mode == 2 ? (i % 2 ? far : near)
                             : (int8_t)rand_range(rng, -128, 127);
    }
    for (size_t j = 0; j < n; j++) {
      const int w_mode = (int)(j % 4); /* +127, -127, sign flip at k / 2, either way */
      for (size_t kk = 0; kk < k; kk++) {
        const bool first_half = kk < k / 2;
        c.w[j * k + kk] = w_mode == 0   ? 127
                          : w_mode == 1 ? -127
                          : w_mode == 2 ? (first_half ? 127 : -127)
                                        : (first_half ? -127 : 127);
      }
      c.bias[j] = j % 3 == 0 ? (1 << 30) : j % 3 == 1 ? -(1 << 30) : rand_range(rng, -2, 2);
      c.mult[j] = (1 << 30) + rand_range(rng, 0, (1 << 30) - 1);
      c.shift[j] = rand_range(rng, -24, -15);
    }
    gemm_case_pack(&c, int4);
    gemm_check(&c, fn8, fn16, 0, n);
    gemm_check(&c, fn8, fn16, NPU_QS8_GEMM_NR, n - 3);
    gemm_case_free(&c);
  }
}

static void gemm_family_check(npu_qs8_gemm_fn *fn8, npu_qs8_gemm_qs16_fn *fn16, bool int4) {
  /* Rows: every remainder of the SIMD kernels' row tiles (1..7) and several whole tiles. Columns:
   * partial and whole 16-channel blocks in runs of 1 to 11 (the kernels take one or two at a
   * time). */
  static const size_t ms[] = {1, 2, 3, 4, 5, 6, 7, 13, 33};
  static const size_t ns[] = {1, 7, 8, 9, 16, 48, 63, 100, 172};
  static const size_t ks[] = {1, 7, 31, 32, 33, 64, 172, 704};
  enum { N_MS = sizeof(ms) / sizeof(ms[0]), N_NS = sizeof(ns) / sizeof(ns[0]) };
  const bool out16 = fn16 != NULL;
  uint64_t rng = out16 ? 1234 : 4321;
  int idx = 0;
  for (size_t im = 0; im < N_MS; im++)
    for (size_t in = 0; in < N_NS; in++)
      for (size_t ik = 0; ik < 8; ik++, idx++) {
        static const int32_t zxs[] = {-128, 127, 0, 5};
        const int32_t zx = zxs[idx % 4];
        const int32_t zy = out16 ? (idx % 3 == 0   ? -32768
                                    : idx % 3 == 1 ? 32767
                                                   : 0)
                                 : (idx % 3 == 0   ? -128
                                    : idx % 3 == 1 ? 127
                                                   : 3);
        struct gemm_case c;
        gemm_case_make(&c, ms[im], ns[in], ks[ik], idx % 2 == 0, zx, zy, &rng);
        if (int4) gemm_case_pack(&c, true);
        gemm_check(&c, fn8, fn16, 0, c.n);
        /* A sub-range of columns starting at a block boundary. */
        const size_t nb = (size_t)rand_range(&rng, 0, (int32_t)((c.n - 1) / NPU_QS8_GEMM_NR));
        const size_t n_begin = nb * NPU_QS8_GEMM_NR;
        const size_t n_end =
            n_begin + 1 + (size_t)rand_range(&rng, 0, (int32_t)(c.n - n_begin - 1));
        gemm_check(&c, fn8, fn16, n_begin, n_end);
        gemm_check(&c, fn8, fn16, n_begin, n_begin); /* empty */
        gemm_case_free(&c);
      }
  /* Random shapes and zero points. */
  for (int rep = 0; rep < 60; rep++) {
    struct gemm_case c;
    const int32_t zy = out16 ? rand_range(&rng, -32768, 32767) : rand_range(&rng, -128, 127);
    gemm_case_make(&c, (size_t)rand_range(&rng, 1, 40), (size_t)rand_range(&rng, 1, 200),
                   (size_t)rand_range(&rng, 1, 800), rep % 3 != 0, rand_range(&rng, -128, 127), zy,
                   &rng);
    if (int4) gemm_case_pack(&c, true);
    gemm_check(&c, fn8, fn16, 0, c.n);
    gemm_case_free(&c);
  }
  gemm_extreme_check(fn8, fn16, int4, &rng);
}

static void check_qs8_gemm(npu_qs8_gemm_fn *fn) { gemm_family_check(fn, NULL, false); }
static void check_qs8_gemm_qs16(npu_qs8_gemm_qs16_fn *fn) { gemm_family_check(NULL, fn, false); }
static void check_qs8_qc4w_gemm(npu_qs8_qc4w_gemm_fn *fn) { gemm_family_check(fn, NULL, true); }
static void check_qs8_qc4w_gemm_qs16(npu_qs8_qc4w_gemm_qs16_fn *fn) {
  gemm_family_check(NULL, fn, true);
}

/* Matmuls on one input run as one loop (npu_emu_exec_matmuls): each member's output equals the
 * reference's, whatever the members' widths (awkward ones: a thread's range crosses from one into
 * the next) and output types, on one to three threads (three on this host's cores: threads fall
 * behind and are helped with the end of their ranges); nothing past a member's columns is
 * written; npu_emu_matmul_group counts only the matmuls on the same input, up to
 * NPU_MATMUL_GROUP_MAX. */
static void test_matmul_group(void **state) {
  (void)state;
  enum { MAX = NPU_MATMUL_GROUP_MAX, SLACK = 64 };
  uint64_t rng = 4242;
  struct npu_pool *pools[3];
  npulm_error err;
  for (int t = 0; t < 3; t++)
    assert_int_equal(npu_pool_create(t + 1, t, &pools[t], &err), NPULM_OK);
  struct npu_ukernels uk;
  npu_ukernels_select(npu_isa_detect(), &uk);
  for (int trial = 0; trial < 60; trial++) {
    const int32_t count = rand_range(&rng, 1, MAX);
    const size_t m = trial % 3 == 0 ? (size_t)rand_range(&rng, 2, 9) : 1;
    const size_t k = (size_t)rand_range(&rng, 1, 300);
    struct gemm_case c[MAX];
    struct npu_qsite sites[MAX];
    struct npu_ir_tensor tensors[MAX + 2];
    struct npu_ir_node nodes[MAX + 1];
    int32_t node_site[MAX + 1];
    memset(sites, 0, sizeof(sites));
    memset(tensors, 0, sizeof(tensors));
    memset(nodes, 0, sizeof(nodes));
    int8_t *x = xmalloc(m * k);
    for (size_t i = 0; i < m * k; i++) x[i] = (int8_t)rand_range(&rng, -128, 127);
    tensors[0] = (struct npu_ir_tensor){
        .dtype = NPU_DT_I8, .backend = NPU_BE_NPU, .ne = {(int32_t)m, (int32_t)k, 1}};
    size_t arena_size = m * k;
    for (int32_t i = 0; i < count; i++) {
      const size_t n = (size_t)(rand_range(&rng, 0, 2) == 0 ? rand_range(&rng, 1, 40)
                                                            : rand_range(&rng, 1, 200));
      gemm_case_make(&c[i], m, n, k, i % 2 == 0, rand_range(&rng, -128, 127), 0, &rng);
      free(c[i].x); /* every member reads the shared input */
      c[i].x = x;
      c[i].x_stride = k;
      c[i].y_stride = n;
      const bool wide = rand_range(&rng, 0, 1) == 1;
      arena_size = (arena_size + 63) / 64 * 64; /* the planner's alignment */
      sites[i].k = (int32_t)k;
      sites[i].w_bits = 8;
      sites[i].packed = c[i].packed;
      sites[i].gemm = (struct npu_qs8_gemm_params){c[i].mult, c[i].shift, c[i].zx, 0};
      tensors[i + 1] = (struct npu_ir_tensor){.dtype = wide ? NPU_DT_I16 : NPU_DT_I8,
                                              .backend = NPU_BE_NPU,
                                              .ne = {(int32_t)m, (int32_t)n, 1},
                                              .offset = arena_size};
      arena_size += m * n * (wide ? 2 : 1) + SLACK;
      nodes[i] = (struct npu_ir_node){
          .op = NPU_OP_MATMUL, .backend = NPU_BE_NPU, .in = {0, -1, -1}, .out = i + 1};
      node_site[i] = i;
    }
    /* a last matmul on another input ends the group */
    nodes[count] = (struct npu_ir_node){
        .op = NPU_OP_MATMUL, .backend = NPU_BE_NPU, .in = {count + 1, -1, -1}, .out = count + 1};
    node_site[count] = 0;
    struct npu_graph g = {.rows = (int32_t)m,
                          .n_tensors = count + 2,
                          .n_nodes = count + 1,
                          .tensors = tensors,
                          .nodes = nodes,
                          .node_site = node_site};
    assert_int_equal(npu_emu_matmul_group(&g, 0, count + 1), count);
    assert_int_equal(npu_emu_matmul_group(&g, 0, count), count);
    uint8_t *buf = xmalloc(arena_size);
    uint8_t *arena[NPU_BE_COUNT] = {NULL};
    arena[NPU_BE_NPU] = buf;
    for (int t = 0; t < 3; t++) {
      memset(buf + m * k, 0x5a, arena_size - m * k);
      memcpy(buf, x, m * k);
      npu_emu_exec_matmuls(&g, 0, count, sites, &uk, pools[t], arena);
      for (int32_t i = 0; i < count; i++) {
        const struct npu_ir_tensor *y = &tensors[i + 1];
        const bool wide = y->dtype == NPU_DT_I16;
        const uint8_t *yb = buf + y->offset;
        for (size_t r = 0; r < m; r++)
          for (size_t j = 0; j < c[i].n; j++) {
            const int32_t got = wide ? ((const int16_t *)(const void *)yb)[r * c[i].n + j]
                                     : ((const int8_t *)yb)[r * c[i].n + j];
            if (got != gemm_ref(&c[i], r, j, wide))
              fail_msg("trial %d, %d threads, member %d of %d (n %zu, k %zu, m %zu): y[%zu, %zu]",
                       trial, t + 1, i, count, c[i].n, k, m, r, j);
          }
        const size_t bytes = m * c[i].n * (wide ? 2 : 1);
        for (size_t b = 0; b < SLACK; b++) assert_int_equal(yb[bytes + b], 0x5a);
      }
    }
    free(buf);
    for (int32_t i = 0; i < count; i++) {
      c[i].x = NULL;
      gemm_case_free(&c[i]);
    }
    free(x);
  }
  for (int t = 0; t < 3; t++) npu_pool_free(pools[t]);
}

/* Unpacking a row gives back the packed matrix's row, over any column range, for awkward n, k. */
static void test_gemm_unpack_row(void **state) {
  (void)state;
  uint64_t rng = 99;
  static const size_t shapes[][2] = {{1, 1}, {3, 5}, {17, 7}, {33, 64}, {40, 1030}, {16, 4}};
  for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
    size_t n = shapes[s][0], k = shapes[s][1];
    int8_t *w = malloc(n * k), *row = malloc(k);
    void *packed = malloc(npu_qs8_gemm_packed_size(n, k));
    assert_true(w && row && packed);
    for (size_t i = 0; i < n * k; i++) w[i] = (int8_t)(test_rand(&rng) % 255 - 127);
    assert_true(npu_qs8_gemm_pack(n, k, w, NULL, packed));
    for (size_t r = 0; r < n; r++) {
      npu_qs8_gemm_unpack_row(k, packed, r, 0, k, row);
      assert_memory_equal(row, w + r * k, k);
      size_t c0 = (size_t)(test_rand(&rng) % k), c1 = c0 + (size_t)(test_rand(&rng) % (k - c0 + 1));
      memset(row, 0x55, k);
      npu_qs8_gemm_unpack_row(k, packed, r, c0, c1, row);
      if (c1 > c0) assert_memory_equal(row, w + r * k + c0, c1 - c0);
    }
    free(w);
    free(row);
    free(packed);
  }
}

static void test_gemm_pack(void **state) {
  (void)state;
  int8_t w[3 * 5] = {0};
  int32_t bias[3] = {0, 1 << 30, -(1 << 30)};
  uint8_t packed[1024];
  assert_true(npu_qs8_gemm_packed_size(3, 5) == 128 + 16 * 8);
  assert_true(npu_qs8_gemm_packed_size(17, 4) == 2 * (128 + 16 * 4));
  assert_true(npu_qs8_gemm_pack(3, 5, w, bias, packed));
  assert_false(npu_qs8_gemm_pack(3, 0, w, NULL, packed));
  w[7] = -128;
  assert_false(npu_qs8_gemm_pack(3, 5, w, NULL, packed));
  w[7] = -127;
  bias[1] = (1 << 30) + 1;
  assert_false(npu_qs8_gemm_pack(3, 5, w, bias, packed));
  /* Layout: bias, wsum, then w[n][k] at group k/4, channel n, byte k%4. */
  for (int i = 0; i < 15; i++) w[i] = (int8_t)(i + 1);
  bias[1] = 7;
  assert_true(npu_qs8_gemm_pack(3, 5, w, bias, packed));
  int32_t head[32];
  memcpy(head, packed, sizeof(head));
  assert_int_equal(head[1], 7);
  assert_int_equal(head[16 + 2], 11 + 12 + 13 + 14 + 15);
  const int8_t *wq = (const int8_t *)(packed + 128);
  assert_int_equal(wq[0 * 64 + 2 * 4 + 3], 14); /* w[2][3] */
  assert_int_equal(wq[1 * 64 + 1 * 4 + 0], 10); /* w[1][4] */
  assert_int_equal(wq[1 * 64 + 1 * 4 + 1], 0);  /* k padding */
  assert_int_equal(wq[0 * 64 + 5 * 4 + 0], 0);  /* n padding */
}

/* The scalar GEMM against the dequantized computation in double: within one output LSB. */
static void test_gemm_vs_float(void **state) {
  (void)state;
  uint64_t rng = 99;
  static const size_t shapes[][3] = {{1, 172, 64}, {5, 64, 172}, {3, 33, 704}, {17, 9, 256}};
  for (size_t s = 0; s < 4; s++) {
    const size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    float *wf = xmalloc(n * k * sizeof(float)), *wscale = xmalloc(n * sizeof(float));
    float *xf = xmalloc(m * k * sizeof(float)), *bf = xmalloc(n * sizeof(float));
    int8_t *wq = xmalloc(n * k), *xq = xmalloc(m * k), *y = xmalloc(m * n);
    int32_t *bq = xmalloc(n * sizeof(int32_t)), *mult = xmalloc(n * sizeof(int32_t));
    int32_t *shift = xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n * k; i++)
      wf[i] = (float)((rand_unit(&rng) - 0.5) * (1.0 + (double)(i / k % 5)));
    for (size_t i = 0; i < m * k; i++) xf[i] = (float)(rand_unit(&rng) * 3.0 - 1.0);
    for (size_t j = 0; j < n; j++) bf[j] = (float)(rand_unit(&rng) - 0.5);
    assert_true(npu_quantize_weights_per_channel(wf, n, k, wq, wscale));
    float sx, sy;
    int32_t zx, zy;
    npu_choose_qparams_s8(-1.0f, 2.0f, &sx, &zx);
    npu_quantize_s8__scalar(xf, m * k, sx, zx, xq);
    const float yr = 3.0f * sqrtf((float)k);
    npu_choose_qparams_s8(-yr, yr * 0.7f, &sy, &zy);
    assert_true(npu_quantize_bias(bf, n, sx, wscale, bq));
    assert_true(npu_quantize_multipliers(sx, wscale, n, sy, mult, shift));
    void *packed = xmalloc(npu_qs8_gemm_packed_size(n, k));
    assert_true(npu_qs8_gemm_pack(n, k, wq, bq, packed));
    const struct npu_qs8_gemm_params p = {mult, shift, zx, zy};
    npu_qs8_gemm__scalar(m, 0, n, k, xq, k, packed, y, n, &p);
    int saturated = 0;
    for (size_t i = 0; i < m; i++)
      for (size_t j = 0; j < n; j++) {
        double acc = (double)bq[j] * sx * wscale[j];
        for (size_t kk = 0; kk < k; kk++)
          acc += ((double)sx * (xq[i * k + kk] - zx)) * ((double)wscale[j] * wq[j * k + kk]);
        const double want = fmin(fmax(round(acc / sy) + zy, -128.0), 127.0);
        saturated += want == -128.0 || want == 127.0;
        if (fabs(y[i * n + j] - want) > 1.0)
          fail_msg("shape %zu: y[%zu,%zu] = %d, float %g", s, i, j, y[i * n + j], want);
      }
    assert_true(saturated < (int)(m * n / 4)); /* the test spans the range, not just the ends */
    free(wf), free(wscale), free(xf), free(bf), free(wq), free(xq), free(y);
    free(bq), free(mult), free(shift), free(packed);
  }
}

/* ---- standalone requantization ----------------------------------------------------------------*/

/* Every shift x extreme multipliers x extreme and random accumulators, n with SIMD body and tail.
 */
static void requant_inputs(size_t n, int32_t *acc, int32_t *mult, int32_t *shift, uint64_t *rng) {
  static const int32_t accs[] = {
      INT32_MIN, INT32_MIN + 1, -(1 << 30), -65537, -32768,  -129,     -1, 0,
      1,         127,           32767,      65536,  1 << 30, INT32_MAX};
  static const int32_t mults[] = {0, 1, 1 << 30, (1 << 30) + 1, INT32_MAX};
  for (size_t i = 0; i < n; i++) {
    const size_t r = (size_t)rand_range(rng, 0, 3);
    acc[i] = r == 0 ? accs[i % 14] : (int32_t)(uint32_t)test_rand(rng) >> rand_range(rng, 0, 31);
    mult[i] = r == 1 ? mults[i % 5] : rand_range(rng, 0, INT32_MAX);
    shift[i] = (int32_t)(i / 5 % 62) - 31;
  }
}

static void check_qs32_requant_qs8(npu_qs32_requant_qs8_fn *fn) {
  uint64_t rng = 77;
  enum { N = 62 * 5 * 16 + 13 };
  int32_t *acc = xmalloc(N * 4), *mult = xmalloc(N * 4), *shift = xmalloc(N * 4);
  int8_t *y = xmalloc(N);
  for (int rep = 0; rep < 20; rep++) {
    requant_inputs(N, acc, mult, shift, &rng);
    const int32_t zp = rep % 3 == 0 ? -128 : rep % 3 == 1 ? 127 : rand_range(&rng, -128, 127);
    const size_t n = rep == 0 ? N : (size_t)rand_range(&rng, 0, N);
    fn(n, acc, mult, shift, zp, y);
    for (size_t i = 0; i < n; i++)
      if (y[i] != npu_requantize_s8(acc[i], mult[i], shift[i], zp))
        fail_msg("acc %d mult %d shift %d zp %d: got %d want %d", acc[i], mult[i], shift[i], zp,
                 y[i], npu_requantize_s8(acc[i], mult[i], shift[i], zp));
  }
  free(acc), free(mult), free(shift), free(y);
}

static void check_qs32_requant_qs16(npu_qs32_requant_qs16_fn *fn) {
  uint64_t rng = 78;
  enum { N = 62 * 5 * 16 + 13 };
  int32_t *acc = xmalloc(N * 4), *mult = xmalloc(N * 4), *shift = xmalloc(N * 4);
  int16_t *y = xmalloc(N * 2);
  for (int rep = 0; rep < 20; rep++) {
    requant_inputs(N, acc, mult, shift, &rng);
    const int32_t zp = rep % 3 == 0   ? -32768
                       : rep % 3 == 1 ? 32767
                                      : rand_range(&rng, -32768, 32767);
    const size_t n = rep == 0 ? N : (size_t)rand_range(&rng, 0, N);
    fn(n, acc, mult, shift, zp, y);
    for (size_t i = 0; i < n; i++)
      if (y[i] != npu_requantize_s16(acc[i], mult[i], shift[i], zp))
        fail_msg("acc %d mult %d shift %d zp %d: got %d want %d", acc[i], mult[i], shift[i], zp,
                 y[i], npu_requantize_s16(acc[i], mult[i], shift[i], zp));
  }
  free(acc), free(mult), free(shift), free(y);
}

/* ---- element-wise add / mul -------------------------------------------------------------------*/

static const size_t elem_sizes[] = {0, 1, 15, 16, 17, 31, 32, 33, 100, 1000};
#define N_ELEM_SIZES (sizeof(elem_sizes) / sizeof(elem_sizes[0]))

static float rand_scale(uint64_t *rng) {
  return (float)ldexp(0.5 + rand_unit(rng), rand_range(rng, -12, 6));
}

static int32_t add_ref(int32_t a, int32_t b, const struct npu_qadd_params *p, int32_t lo,
                       int32_t hi) {
  const int32_t ta =
      npu_requantize((a - p->a_zero_point) * (1 << p->left_shift), p->a_mult, p->a_shift);
  const int32_t tb =
      npu_requantize((b - p->b_zero_point) * (1 << p->left_shift), p->b_mult, p->b_shift);
  return npu_clamp_i64((int64_t)npu_requantize(ta + tb, p->y_mult, p->y_shift) + p->y_zero_point,
                       lo, hi);
}

static void check_qs8_vadd(npu_qs8_vadd_fn *fn) {
  uint64_t rng = 5;
  int8_t a[1000], b[1000], y[1000];
  for (int rep = 0; rep < 60; rep++) {
    const float sa = rand_scale(&rng), sb = rep % 5 == 0 ? sa : rand_scale(&rng);
    const float sy = rep % 7 == 0 ? (float)ldexp(1.0, -20) : rand_scale(&rng) * 4;
    const int32_t za = rep % 4 == 0 ? -128 : rep % 4 == 1 ? 127 : rand_range(&rng, -128, 127);
    const int32_t zb = rep % 3 == 0 ? 127 : rand_range(&rng, -128, 127);
    const int32_t zy = rep % 2 == 0 ? -128 : 127;
    struct npu_qadd_params p;
    assert_true(npu_qadd_params_make(sa, za, sb, zb, sy, zy, false, &p));
    for (size_t s = 0; s < N_ELEM_SIZES; s++) {
      const size_t n = elem_sizes[s];
      for (size_t i = 0; i < n; i++) {
        a[i] = (int8_t)rand_range(&rng, -128, 127);
        b[i] = (int8_t)(i % 17 == 0 ? -128 : rand_range(&rng, -128, 127));
      }
      fn(n, a, b, y, &p);
      for (size_t i = 0; i < n; i++) {
        assert_int_equal(y[i], add_ref(a[i], b[i], &p, INT8_MIN, INT8_MAX));
        /* Within one LSB of the real sum, unless saturated. */
        const double real = (sa * (a[i] - za) + sb * (b[i] - zb)) / sy + zy;
        if (real > -128 && real < 127) assert_true(fabs(y[i] - real) <= 1.0);
      }
      /* In place. */
      int8_t want[1000];
      memcpy(want, y, n);
      fn(n, a, b, a, &p);
      assert_memory_equal(a, want, n);
    }
  }
}

static void check_qs16_vadd(npu_qs16_vadd_fn *fn) {
  uint64_t rng = 6;
  int16_t a[1000], b[1000], y[1000];
  for (int rep = 0; rep < 60; rep++) {
    const float sa = rand_scale(&rng), sb = rand_scale(&rng), sy = rand_scale(&rng) * 2;
    const int32_t za = rep % 4 == 0 ? 0 : rep % 4 == 1 ? -32768 : rand_range(&rng, -100, 100);
    const int32_t zb = rep % 4 == 2 ? 32767 : 0;
    const int32_t zy = rep % 3 == 0 ? -32768 : rep % 3 == 1 ? 32767 : 0;
    struct npu_qadd_params p;
    assert_true(npu_qadd_params_make(sa, za, sb, zb, sy, zy, true, &p));
    for (size_t s = 0; s < N_ELEM_SIZES; s++) {
      const size_t n = elem_sizes[s];
      for (size_t i = 0; i < n; i++) {
        a[i] = (int16_t)(i % 13 == 0 ? 32767 : rand_range(&rng, -32768, 32767));
        b[i] = (int16_t)(i % 11 == 0 ? -32768 : rand_range(&rng, -32768, 32767));
      }
      fn(n, a, b, y, &p);
      for (size_t i = 0; i < n; i++) {
        assert_int_equal(y[i], add_ref(a[i], b[i], &p, INT16_MIN, INT16_MAX));
        const double real = (sa * (a[i] - za) + sb * (b[i] - zb)) / sy + zy;
        if (real > -32768 && real < 32767) assert_true(fabs(y[i] - real) <= 1.0);
      }
      int16_t want[1000];
      memcpy(want, y, n * 2);
      fn(n, a, b, b, &p);
      assert_memory_equal(b, want, n * 2);
    }
  }
}

static void check_qs8_vmul(npu_qs8_vmul_fn *fn) {
  uint64_t rng = 7;
  int8_t a[1000], b[1000], y[1000];
  for (int rep = 0; rep < 60; rep++) {
    const float sa = rand_scale(&rng), sb = rand_scale(&rng);
    const float sy =
        rep % 5 == 0 ? sa * sb * 1e-3f : sa * sb * (float)(100 + 200 * rand_unit(&rng));
    const int32_t za = rep % 3 == 0 ? -128 : rep % 3 == 1 ? 127 : rand_range(&rng, -128, 127);
    const int32_t zb = rep % 2 == 0 ? -128 : rand_range(&rng, -128, 127);
    const int32_t zy = rep % 4 == 0 ? 127 : rep % 4 == 1 ? -128 : 0;
    struct npu_qmul_params p;
    assert_true(npu_qmul_params_make(sa, za, sb, zb, sy, zy, &p));
    for (size_t s = 0; s < N_ELEM_SIZES; s++) {
      const size_t n = elem_sizes[s];
      for (size_t i = 0; i < n; i++) {
        a[i] = (int8_t)rand_range(&rng, -128, 127);
        b[i] = (int8_t)rand_range(&rng, -128, 127);
      }
      fn(n, a, b, y, &p);
      for (size_t i = 0; i < n; i++) {
        assert_int_equal(y[i],
                         npu_requantize_s8((a[i] - za) * (b[i] - zb), p.y_mult, p.y_shift, zy));
        const double real = (double)sa * (a[i] - za) * sb * (b[i] - zb) / sy + zy;
        if (real > -128 && real < 127) assert_true(fabs(y[i] - real) <= 0.5 + 1e-6);
      }
    }
  }
}

static void check_qs16_vmul(npu_qs16_vmul_fn *fn) {
  uint64_t rng = 8;
  int16_t a[1000], b[1000], y[1000];
  for (int rep = 0; rep < 60; rep++) {
    const float sa = rand_scale(&rng), sb = rand_scale(&rng);
    const float sy = sa * sb * (float)ldexp(1.0 + rand_unit(&rng), rand_range(&rng, 0, 20));
    const int32_t zy = rep % 3 == 0 ? 32767 : rep % 3 == 1 ? -32768 : 0;
    struct npu_qmul_params p;
    assert_true(npu_qmul_params_make(sa, 0, sb, 0, sy, zy, &p));
    for (size_t s = 0; s < N_ELEM_SIZES; s++) {
      const size_t n = elem_sizes[s];
      for (size_t i = 0; i < n; i++) {
        a[i] = (int16_t)(i % 9 == 0 ? -32768 : rand_range(&rng, -32768, 32767));
        b[i] = (int16_t)(i % 7 == 0 ? -32768
                                    : rand_range(&rng, -32768, 32767) >> rand_range(&rng, 0, 15));
      }
      fn(n, a, b, y, &p);
      for (size_t i = 0; i < n; i++)
        assert_int_equal(y[i], npu_requantize_s16(a[i] * b[i], p.y_mult, p.y_shift, zy));
      int16_t want[1000];
      memcpy(want, y, n * 2);
      fn(n, a, b, a, &p);
      assert_memory_equal(a, want, n * 2);
    }
  }
}

/* ---- LUT and gather ---------------------------------------------------------------------------*/

static void check_x8_lut(npu_x8_lut_fn *fn) {
  uint64_t rng = 9;
  int8_t table[256], x[1000], y[1000];
  for (int rep = 0; rep < 50; rep++) {
    for (int i = 0; i < 256; i++)
      table[i] = (int8_t)(rep == 0 ? i - 128 : rep == 1 ? 127 - i : rand_range(&rng, -128, 127));
    for (size_t s = 0; s < N_ELEM_SIZES; s++) {
      const size_t n = elem_sizes[s] > 0 ? elem_sizes[s] : 256;
      for (size_t i = 0; i < n; i++) /* every code, then random */
        x[i] = (int8_t)(i < 256 && n >= 256 ? (int)i - 128 : rand_range(&rng, -128, 127));
      fn(n, x, y, table);
      for (size_t i = 0; i < n; i++)
        if (y[i] != table[x[i] + 128])
          fail_msg("x = %d: got %d, want %d (n = %zu)", x[i], y[i], table[x[i] + 128], n);
      fn(n, x, x, table); /* in place */
      assert_memory_equal(x, y, n);
    }
  }
}

static void gather_family_check(npu_qs8_gather_fn *fn8, npu_qs8_gather_qs16_fn *fn16) {
  static const size_t colss[] = {1, 15, 16, 17, 64, 172, 257};
  const bool out16 = fn16 != NULL;
  uint64_t rng = out16 ? 10 : 11;
  enum { ROWS = 37, IDS = 9 };
  for (size_t ic = 0; ic < 7; ic++) {
    const size_t cols = colss[ic], y_stride = cols + ic;
    int8_t *table = xmalloc(ROWS * cols);
    int32_t mult[ROWS], shift[ROWS], ids[IDS];
    for (size_t i = 0; i < ROWS * cols; i++)
      table[i] = (int8_t)(i % 29 == 0 ? -128 : rand_range(&rng, -127, 127));
    for (int r = 0; r < ROWS; r++) {
      if (r % 6 == 0) {
        mult[r] = r % 12 == 0 ? INT32_MAX : 1 << 30;
        shift[r] = rand_range(&rng, -31, 30);
      } else {
        assert_true(npu_quantize_multiplier(out16 ? 100.0 * rand_unit(&rng) : 2.0 * rand_unit(&rng),
                                            &mult[r], &shift[r]));
      }
    }
    for (int t = 0; t < IDS; t++)
      ids[t] = t == 0 ? 0 : t == 1 ? ROWS - 1 : rand_range(&rng, 0, ROWS - 1);
    const int32_t zy = out16 ? (ic % 2 ? -32768 : 32767) : (ic % 2 ? -128 : 127);
    const struct npu_qs8_gather_params p = {mult, shift, out16 ? zy : (ic == 3 ? 0 : zy)};
    const size_t esize = out16 ? 2 : 1;
    uint8_t *y = xmalloc(IDS * y_stride * esize);
    memset(y, 0x5a, IDS * y_stride * esize);
    if (out16) fn16(IDS, ids, ROWS, cols, table, (int16_t *)y, y_stride, &p);
    else fn8(IDS, ids, ROWS, cols, table, (int8_t *)y, y_stride, &p);
    for (int t = 0; t < IDS; t++)
      for (size_t c = 0; c < y_stride; c++) {
        const size_t at = t * y_stride + c;
        if (c >= cols) {
          assert_int_equal(y[at * esize], 0x5a);
          continue;
        }
        const int8_t v = table[ids[t] * cols + c];
        if (out16)
          assert_int_equal(((int16_t *)y)[at],
                           npu_requantize_s16(v, mult[ids[t]], shift[ids[t]], p.y_zero_point));
        else
          assert_int_equal(((int8_t *)y)[at],
                           npu_requantize_s8(v, mult[ids[t]], shift[ids[t]], p.y_zero_point));
      }
    free(table);
    free(y);
  }
}

static void check_qs8_gather(npu_qs8_gather_fn *fn) { gather_family_check(fn, NULL); }
static void check_qs8_gather_qs16(npu_qs8_gather_qs16_fn *fn) { gather_family_check(NULL, fn); }

/* ---- attention --------------------------------------------------------------------------------*/

/* Shapes: heads/kv_heads, head dims around the SIMD blocks (and past the AVX2 kernel's 256), steps
 * of one and many rows with padding, keys around blocks of 8 and 16. */
struct attn_case {
  struct npu_attn_shape sh;
  size_t q_cols, kv_cols, n_keys; /* caches hold exactly n_keys = pos0 + n_valid rows */
};

static struct attn_case attn_case_make(int32_t heads, int32_t kv_heads, int32_t hd, int32_t rows,
                                       int32_t ctx, int32_t pos0, int32_t n_valid) {
  struct attn_case c = {.sh = {heads, kv_heads, hd, rows, ctx, pos0, n_valid}};
  c.q_cols = (size_t)heads * (size_t)hd;
  c.kv_cols = (size_t)kv_heads * (size_t)hd;
  c.n_keys = (size_t)pos0 + (size_t)n_valid;
  return c;
}

/* A list of cases: fixed awkward ones, then random. */
static int attn_cases(struct attn_case *out, uint64_t *rng) {
  static const int32_t fixed[][7] = {
      /* heads, kv_heads, hd, rows, ctx, pos0, n_valid */
      {1, 1, 1, 1, 1, 0, 1},         {8, 4, 8, 1, 128, 77, 1},   {8, 4, 8, 32, 128, 0, 32},
      {8, 4, 8, 32, 256, 100, 17},   {4, 2, 16, 5, 40, 3, 5},    {6, 1, 24, 3, 64, 60, 2},
      {2, 2, 33, 7, 50, 11, 7},      {4, 4, 64, 9, 200, 130, 9}, {2, 1, 72, 4, 33, 20, 3},
      {3, 3, 7, 2, 9, 0, 1},         {2, 1, 300, 3, 20, 10, 3},  {1, 1, 128, 1, 1100, 1099, 1},
      {4, 2, 8, 16, 2100, 2070, 16},
  };
  int n = 0;
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
    const int32_t *f = fixed[i];
    out[n++] = attn_case_make(f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
  }
  for (int i = 0; i < 20; i++) {
    const int32_t kv = rand_range(rng, 1, 4), heads = kv * rand_range(rng, 1, 3);
    const int32_t rows = rand_range(rng, 1, 20), n_valid = rand_range(rng, 1, rows);
    const int32_t pos0 = rand_range(rng, 0, 90), ctx = pos0 + rows + rand_range(rng, 0, 40);
    out[n++] = attn_case_make(heads, kv, rand_range(rng, 1, 80), rows, ctx, pos0, n_valid);
  }
  return n;
}

static void fill_s8(int8_t *x, size_t n, int mode, uint64_t *rng) {
  for (size_t i = 0; i < n; i++)
    x[i] = mode == 0 ? (int8_t)(i % 3 == 0 ? 127 : -128) : (int8_t)rand_range(rng, -128, 127);
}

static void check_qs8_qk_qs16(npu_qs8_qk_qs16_fn *fn) {
  uint64_t rng = 21;
  struct attn_case cases[64];
  const int n_cases = attn_cases(cases, &rng);
  for (int ci = 0; ci < n_cases; ci++) {
    const struct attn_case *c = &cases[ci];
    const struct npu_attn_shape *sh = &c->sh;
    const size_t n_s = (size_t)sh->heads * (size_t)sh->rows * (size_t)sh->ctx;
    int8_t *q = xmalloc((size_t)sh->rows * c->q_cols), *k = xmalloc(c->n_keys * c->kv_cols);
    int16_t *s = xmalloc(n_s * sizeof(int16_t));
    const int mode = ci % 4;
    fill_s8(q, (size_t)sh->rows * c->q_cols, mode, &rng);
    fill_s8(k, c->n_keys * c->kv_cols, mode, &rng);
    struct npu_qs8_qk_params p = {.q_zero_point = ci % 5 == 0 ? -128 : rand_range(&rng, -128, 127),
                                  .k_zero_point = ci % 5 == 1 ? 127 : rand_range(&rng, -128, 127),
                                  .s_zero_point = ci % 3 == 0 ? 0 : rand_range(&rng, -300, 300)};
    if (ci % 7 == 3) {
      p.mult = INT32_MAX, p.shift = rand_range(&rng, -31, 30); /* extremes, saturating */
    } else {
      const double typical = 8000.0 / (255.0 * 255.0 * sh->head_dim);
      assert_true(
          npu_quantize_multiplier(typical * (0.1 + 2.0 * rand_unit(&rng)), &p.mult, &p.shift));
    }
    fn(sh, q, k, s, &p);
    const int32_t group = sh->heads / sh->kv_heads;
    for (int32_t h = 0; h < sh->heads; h++)
      for (int32_t t = 0; t < sh->rows; t++) {
        const int32_t len = sh->pos0 + (t < sh->n_valid ? t : sh->n_valid - 1) + 1;
        for (int32_t j = 0; j < sh->ctx; j++) {
          int32_t want = INT16_MIN;
          if (j < len) {
            int32_t acc = 0;
            for (int32_t i = 0; i < sh->head_dim; i++)
              acc += (q[(size_t)t * c->q_cols + (size_t)(h * sh->head_dim + i)] - p.q_zero_point) *
                     (k[(size_t)j * c->kv_cols + (size_t)((h / group) * sh->head_dim + i)] -
                      p.k_zero_point);
            want = npu_requantize_s16(acc, p.mult, p.shift, p.s_zero_point);
          }
          const int32_t got =
              s[((size_t)h * (size_t)sh->rows + (size_t)t) * (size_t)sh->ctx + (size_t)j];
          if (got != want)
            fail_msg(
                "case %d (heads %d/%d hd %d rows %d ctx %d pos0 %d valid %d): s[%d,%d,%d] = %d, "
                "want %d",
                ci, sh->heads, sh->kv_heads, sh->head_dim, sh->rows, sh->ctx, sh->pos0, sh->n_valid,
                h, t, j, got, want);
        }
      }
    free(q), free(k), free(s);
  }
}

/* The integer softmax of one row, step by step from its definition in npu_ukernels.h. */
static void softmax_row_ref(const int16_t *x, int32_t len, const struct npu_qs16_softmax_params *p,
                            int32_t *out) {
  int32_t r = 1;
  while ((len >> r) != 0) r++;
  int32_t m = INT16_MIN;
  for (int32_t j = 0; j < len; j++) m = x[j] > m ? x[j] : m;
  int64_t e[4096], sum = 0;
  assert_true(len <= 4096);
  for (int32_t j = 0; j < len; j++) {
    const int32_t u = npu_requantize(m - x[j], p->mult, p->shift);
    const int64_t n = (int64_t)(u >> 8) + r;
    e[j] = n > 31 ? 0 : npu_exp2_q30[u & 255] >> n;
    sum += e[j];
  }
  assert_true(sum < (1 << 30));
  const int64_t inv = ((int64_t)1 << (60 - r)) / sum;
  assert_true(inv <= (1 << 30));
  for (int32_t j = 0; j < len; j++) {
    const int64_t v = (e[j] * inv + ((int64_t)1 << (44 - r))) >> (45 - r);
    out[j] = v > 32767 ? 32767 : (int32_t)v;
  }
}

static void check_qs16_softmax(npu_qs16_softmax_fn *fn) {
  uint64_t rng = 22;
  struct attn_case cases[64];
  const int n_cases = attn_cases(cases, &rng);
  int32_t want[4096];
  for (int ci = 0; ci < n_cases; ci++) {
    const struct npu_attn_shape *sh = &cases[ci].sh;
    const size_t n_s = (size_t)sh->heads * (size_t)sh->rows * (size_t)sh->ctx;
    int16_t *s = xmalloc(n_s * sizeof(int16_t)), *p = xmalloc(n_s * sizeof(int16_t));
    const int mode = ci % 4;
    for (size_t i = 0; i < n_s; i++) {
      s[i] = mode == 0   ? (int16_t)(i % 5 == 0 ? INT16_MAX : INT16_MIN)
             : mode == 1 ? (int16_t)rand_range(&rng, -2000, 2000)
             : mode == 2 ? (int16_t)(i % 7) /* ties and a flat row */
                         : (int16_t)rand_range(&rng, INT16_MIN, INT16_MAX);
    }
    /* score scales from fine to coarse, and the extremes of the multiplier */
    const double s_scale = ldexp(1.0, rand_range(&rng, -14, 0)) * (1.0 + rand_unit(&rng));
    struct npu_qs16_softmax_params prm;
    if (ci % 9 == 4) {
      prm.mult = ci % 2 ? 0 : INT32_MAX, prm.shift = ci % 2 ? 0 : 30;
    } else {
      assert_true(npu_quantize_multiplier(s_scale * 256.0 / log(2.0), &prm.mult, &prm.shift));
    }
    fn(sh, s, p, &prm);
    for (int32_t h = 0; h < sh->heads; h++)
      for (int32_t t = 0; t < sh->rows; t++) {
        const size_t off = ((size_t)h * (size_t)sh->rows + (size_t)t) * (size_t)sh->ctx;
        const int32_t len = sh->pos0 + (t < sh->n_valid ? t : sh->n_valid - 1) + 1;
        softmax_row_ref(s + off, len, &prm, want);
        int64_t total = 0;
        for (int32_t j = 0; j < sh->ctx; j++) {
          const int32_t w = j < len ? want[j] : 0;
          if (p[off + (size_t)j] != w)
            fail_msg("case %d (len %d ctx %d): p[%d,%d,%d] = %d, want %d", ci, len, sh->ctx, h, t,
                     j, p[off + (size_t)j], w);
          total += w;
        }
        /* probabilities: they sum to 1 within the rounding of each */
        assert_true(total >= 32768 - len && total <= 32768 + len);
      }
    free(s), free(p);
  }
}

/* The fixed-point softmax against the real one: within 2e-3 per probability at scores of any
 * spread, rows long and short. */
static void test_softmax_vs_float(void **state) {
  (void)state;
  for (int f = 0; f < 256; f++) /* the table is 2^30 * 2^(-f/256), rounded */
    assert_true(llabs(npu_exp2_q30[f] - llround(ldexp(exp2(-f / 256.0), 30))) == 0);
  uint64_t rng = 23;
  enum { CTX = 3000 };
  int16_t *s = xmalloc(CTX * 2), *p = xmalloc(CTX * 2);
  double *want = xmalloc(CTX * sizeof(double));
  for (int rep = 0; rep < 60; rep++) {
    const int32_t len = rep < 3 ? rep + 1 : rand_range(&rng, 1, CTX);
    const double spread =
        ldexp(1.0, rand_range(&rng, -2, 5)); /* real scores in [-spread, spread] */
    const double s_scale = 2.0 * spread / 32767.0;
    for (int32_t j = 0; j < len; j++)
      s[j] = (int16_t)lround((2.0 * rand_unit(&rng) - 1.0) * spread / s_scale);
    struct npu_qs16_softmax_params prm;
    assert_true(npu_quantize_multiplier(s_scale * 256.0 / log(2.0), &prm.mult, &prm.shift));
    const struct npu_attn_shape sh = {1, 1, 1, 1, len, len - 1, 1};
    npu_qs16_softmax__scalar(&sh, s, p, &prm);
    double m = -1e300, sum = 0;
    for (int32_t j = 0; j < len; j++) m = fmax(m, s[j] * s_scale);
    for (int32_t j = 0; j < len; j++) sum += want[j] = exp(s[j] * s_scale - m);
    for (int32_t j = 0; j < len; j++) {
      const double got = p[j] / 32768.0, w = want[j] / sum;
      if (fabs(got - w) > 2e-3 + 4e-3 * w)
        fail_msg("len %d spread %g: p[%d] = %g, real %g", len, spread, j, got, w);
    }
  }
  free(s), free(p), free(want);
}

static void check_qs16_pv_qs8(npu_qs16_pv_qs8_fn *fn) {
  uint64_t rng = 24;
  struct attn_case cases[64];
  const int n_cases = attn_cases(cases, &rng);
  for (int ci = 0; ci < n_cases; ci++) {
    const struct attn_case *c = &cases[ci];
    const struct npu_attn_shape *sh = &c->sh;
    const size_t n_p = (size_t)sh->heads * (size_t)sh->rows * (size_t)sh->ctx;
    const size_t n_out = (size_t)sh->rows * c->q_cols;
    int16_t *p = xmalloc(n_p * sizeof(int16_t));
    int8_t *v = xmalloc(c->n_keys * c->kv_cols), *out = xmalloc(n_out);
    const int mode = ci % 4;
    fill_s8(v, c->n_keys * c->kv_cols, mode, &rng);
    /* rows of probabilities: random weights summing to at most 2^16, one-hot rows, garbage past
     * the row's length (never read) */
    for (int32_t h = 0; h < sh->heads; h++)
      for (int32_t t = 0; t < sh->rows; t++) {
        int16_t *pr = p + ((size_t)h * (size_t)sh->rows + (size_t)t) * (size_t)sh->ctx;
        const int32_t len = sh->pos0 + (t < sh->n_valid ? t : sh->n_valid - 1) + 1;
        int64_t total = 0;
        for (int32_t j = 0; j < sh->ctx; j++) {
          pr[j] = (int16_t)(mode == 0 ? 32767 : rand_range(&rng, 0, 32767));
          if (j < len) total += pr[j];
        }
        if (mode == 1) {
          for (int32_t j = 0; j < len; j++) pr[j] = 0;
          pr[rand_range(&rng, 0, len - 1)] = 32767;
        } else if (total > 65536) {
          for (int32_t j = 0; j < len; j++) pr[j] = (int16_t)(pr[j] * 65536 / total);
        }
      }
    struct npu_qs16_pv_params prm = {
        .v_zero_point = ci % 5 == 0 ? -128 : rand_range(&rng, -128, 127),
        .y_zero_point = ci % 5 == 1 ? 127 : rand_range(&rng, -128, 127)};
    if (ci % 7 == 3) {
      prm.mult = INT32_MAX, prm.shift = rand_range(&rng, -31, 30);
    } else {
      assert_true(npu_quantize_multiplier((1.0 + 4.0 * rand_unit(&rng)) / (32768.0 * 4.0),
                                          &prm.mult, &prm.shift));
    }
    fn(sh, p, v, out, &prm);
    const int32_t group = sh->heads / sh->kv_heads;
    for (int32_t t = 0; t < sh->rows; t++) {
      const int32_t len = sh->pos0 + (t < sh->n_valid ? t : sh->n_valid - 1) + 1;
      for (int32_t h = 0; h < sh->heads; h++)
        for (int32_t i = 0; i < sh->head_dim; i++) {
          const int16_t *pr = p + ((size_t)h * (size_t)sh->rows + (size_t)t) * (size_t)sh->ctx;
          int32_t acc = 0;
          for (int32_t j = 0; j < len; j++)
            acc += pr[j] * (v[(size_t)j * c->kv_cols + (size_t)((h / group) * sh->head_dim + i)] -
                            prm.v_zero_point);
          const int32_t want = npu_requantize_s8(acc, prm.mult, prm.shift, prm.y_zero_point);
          const int32_t got = out[(size_t)t * c->q_cols + (size_t)(h * sh->head_dim + i)];
          if (got != want)
            fail_msg("case %d (heads %d/%d hd %d rows %d ctx %d pos0 %d valid %d): out[%d,%d,%d] "
                     "= %d, want %d",
                     ci, sh->heads, sh->kv_heads, sh->head_dim, sh->rows, sh->ctx, sh->pos0,
                     sh->n_valid, t, h, i, got, want);
        }
    }
    free(p), free(v), free(out);
  }
}

/* ---- RMSNorm ----------------------------------------------------------------------------------*/

/* A multiplier in [-INT32_MAX, INT32_MAX] (wider than rand_range can take). */
static int32_t rand_mult(uint64_t *rng) {
  const int32_t m = (int32_t)(test_rand(rng) >> 33);
  return test_rand(rng) & 1 ? m : -m;
}

/* One row of the RMSNorm from its definition in npu_ukernels.h, in 128-bit arithmetic, so that the
 * shift by s needs no case of its own past 62. */
static void rmsnorm_row_ref(const int16_t *x, size_t cols, const struct npu_qs16_rmsnorm_params *p,
                            int8_t *out) {
  int64_t v = p->eps;
  for (size_t c = 0; c < cols; c++) v += (int64_t)x[c] * x[c];
  int32_t e;
  const int64_t r = npu_rsqrt_q61(v, &e);
  const int32_t s = 77 - e - p->shift;
  assert_true(s >= 1);
  for (size_t c = 0; c < cols; c++) {
    const __int128 u = ((__int128)x[c] * r + (1 << 14)) >> 15;
    const __int128 o = ((u * p->mult[c] + ((__int128)1 << (s - 1))) >> s) + p->y_zero_point;
    out[c] = (int8_t)(o < INT8_MIN ? INT8_MIN : o > INT8_MAX ? INT8_MAX : o);
  }
}

/* Single rows whose every output sits on a rounding edge, its value known by construction (so
 * the scalar kernel is checked too): (a) x in +-[1, 3] and mult chosen so that
 * u * mult / 2^s lies in [o - 1/2, o - 1/2 + |u| / 2^s) with |mult| > |u|: any u one off (its
 * own rounding, ties of it included) moves the output; (b) x in {0, sg} with eps searched until
 * u = +-2^a * b, b odd and small, and mult = k * 2^(s - 1 - a): then u * mult / 2^s = +-b * k / 2
 * exactly, a tie for odd k, which must round up (towards +infinity) for either sign. */
static void rmsnorm_edge_check(npu_qs16_rmsnorm_qs8_fn *fn, uint64_t *rng) {
  enum { MAXC = 40 };
  int16_t x[MAXC];
  int32_t mult[MAXC];
  int8_t y[MAXC], want[MAXC], expect[MAXC];
  for (int rep = 0; rep < 600; rep++) {
    const size_t cols = (size_t)rand_range(rng, 1, MAXC);
    const int32_t zp = rand_range(rng, -20, 20);
    struct npu_qs16_rmsnorm_params p = {.mult = mult, .y_zero_point = zp};
    int32_t e, out[MAXC];
    if (rep % 2 == 0) {
      const bool tie = rep % 40 == 0; /* x = +-1, eps searched until x * r is a tie for u */
      int64_t v = 0;
      for (size_t c = 0; c < cols; c++) {
        x[c] = (int16_t)((tie ? 1 : rand_range(rng, 1, 3)) * (rand_range(rng, 0, 1) ? 1 : -1));
        v += x[c] * x[c];
      }
      int64_t r;
      for (p.eps = rand_range(rng, 1, 64);; p.eps++) {
        r = npu_rsqrt_q61(v + p.eps, &e);
        if (!tie || (r & 0x7FFF) == 0x4000) break;
      }
      const int32_t s = 37;
      p.shift = 77 - e - s;
      for (size_t c = 0; c < cols; c++) {
        const int64_t u = ((int64_t)x[c] * r + (1 << 14)) >> 15, au = llabs(u);
        out[c] = rand_range(rng, -100, 100);
        const int64_t t = out[c] * ((int64_t)1 << s) - ((int64_t)1 << (s - 1));
        const int64_t m = t / au + (t % au > 0); /* ceil: au * m in [t, t + au) */
        assert_true(llabs(m) > au && llabs(m) <= INT32_MAX);
        mult[c] = (int32_t)(u > 0 ? m : -m);
      }
    } else {
      const int16_t sg = rep % 4 == 1 ? 1 : -1;
      int64_t n1 = 0;
      for (size_t c = 0; c < cols; c++) {
        x[c] = rand_range(rng, 0, 3) != 0 || c == cols / 2 ? sg : 0;
        n1 += x[c] != 0;
      }
      int64_t u;
      int32_t a;
      for (p.eps = rand_range(rng, 1, 1000);; p.eps++) {
        u = ((int64_t)sg * npu_rsqrt_q61(n1 + p.eps, &e) + (1 << 14)) >> 15;
        a = __builtin_ctzll((unsigned long long)llabs(u));
        if ((llabs(u) >> a) <= 127) break;
      }
      const int32_t b = (int32_t)(llabs(u) >> a), j = rand_range(rng, 0, 12), s = a + 1 + j;
      p.shift = 77 - e - s;
      for (size_t c = 0; c < cols; c++) {
        const int32_t kmax = 250 / b, k = rand_range(rng, -kmax, kmax);
        mult[c] = x[c] != 0 ? k * (1 << j) : rand_mult(rng);
        out[c] = x[c] != 0 ? (int32_t)floor(((u > 0 ? b : -b) * k + 1) / 2.0) : 0;
      }
    }
    assert_true(p.shift >= -16 && p.shift <= 46);
    for (size_t c = 0; c < cols; c++)
      expect[c] = (int8_t)npu_clamp_i64(out[c] + zp, INT8_MIN, INT8_MAX);
    fn(1, cols, x, y, &p);
    npu_qs16_rmsnorm_qs8__scalar(1, cols, x, want, &p);
    for (size_t c = 0; c < cols; c++)
      if (y[c] != expect[c] || want[c] != expect[c])
        fail_msg("edge rep %d cols %zu (shift %d eps %lld zp %d): y[%zu] = %d, scalar %d, want %d "
                 "(x %d mult %d)",
                 rep, cols, p.shift, (long long)p.eps, zp, c, y[c], want[c], expect[c], x[c],
                 mult[c]);
  }
}

/* Awkward widths (SIMD body, its 8-wide step and the scalar tail), rows of extremes, zeros (with
 * eps 1) and random values, multipliers of both signs up to +-INT32_MAX, every shift and eps from
 * 1 to 2^62: bit for bit against the scalar kernel and the definition. The buffers are exactly
 * the tensors' sizes (plus a guard after y), so a sanitizer build sees any stray access. */
static void check_qs16_rmsnorm_qs8(npu_qs16_rmsnorm_qs8_fn *fn) {
  uint64_t rng = 25;
  static const size_t widths[] = {1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 768, 1000, 4103};
  enum { GUARD = 32 };
  long inside = 0; /* outputs strictly between the int8 bounds and off the zero point */
  for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++)
    for (int rep = 0; rep < (widths[wi] < 64 ? 280 : 28); rep++) { /* more where cheap */
      const size_t cols = widths[wi], rows = (size_t)rand_range(&rng, 1, 5), n = rows * cols;
      int16_t *x = xmalloc(n * sizeof(int16_t));
      int32_t *mult = xmalloc(cols * sizeof(int32_t));
      int8_t *y = xmalloc(n + GUARD), *want = xmalloc(n), *ref = xmalloc(cols);
      const int mode = rep % 7; /* 6: a mode per row */
      for (size_t t = 0; t < rows; t++) {
        const int m = mode == 6 ? rand_range(&rng, 0, 5) : mode;
        for (size_t c = 0; c < cols; c++) {
          int16_t *xi = &x[t * cols + c];
          *xi = m == 0   ? (int16_t)rand_range(&rng, INT16_MIN, INT16_MAX)
                : m == 1 ? (int16_t)(c % 3 == 0 ? INT16_MAX : INT16_MIN)
                : m == 2 ? INT16_MIN /* every vpmaddwd pair sum is 2^31 */
                : m == 3 ? 0
                : m == 4 ? (int16_t)rand_range(&rng, -300, 300)
                         : (int16_t)rand_range(&rng, -3, 3);
        }
      }
      for (size_t c = 0; c < cols; c++) {
        const int k = rand_range(&rng, 0, 9);
        const int32_t mag = (int32_t)(test_rand(&rng) >> rand_range(&rng, 33, 63)); /* < 2^31 */
        mult[c] = k == 0   ? 0
                  : k == 1 ? INT32_MAX
                  : k == 2 ? -INT32_MAX
                  : k <= 4 ? rand_mult(&rng)
                           : (rand_range(&rng, 0, 1) ? mag : -mag);
      }
      /* shift: an end, anything, or where most outputs are inside int8; eps: 1 (always for
       * some zero rows), 2^62 or anything, but small for the tiny values, whose u = x * r / 2^15
       * is only ~2^15 |x|, so that its rounding moves outputs by up to 2^-7 LSB and shows */
      const int ek = rand_range(&rng, 0, 3), sk = rep % 4;
      const bool tiny = mode == 5;
      struct npu_qs16_rmsnorm_params p = {
          .mult = mult,
          .eps = ek == 0 || (mode == 3 && rep % 2 == 1) ? 1
                 : tiny                                 ? rand_range(&rng, 1, 16)
                 : ek == 1                              ? (int64_t)1 << 62
                           : (int64_t)(test_rand(&rng) >> rand_range(&rng, 2, 63)) + 1,
          .shift = sk == 0   ? (rep % 8 == 0 ? -16 : 46)
                   : sk == 1 ? rand_range(&rng, -16, 46)
                   : tiny    ? rand_range(&rng, 4, 20)
                             : rand_range(&rng, 0, 16),
          .y_zero_point = rep % 3 == 0   ? INT8_MIN
                          : rep % 3 == 1 ? INT8_MAX
                                         : rand_range(&rng, INT8_MIN, INT8_MAX)};
      memset(y + n, 0x5A, GUARD);
      fn(rows, cols, x, y, &p);
      npu_qs16_rmsnorm_qs8__scalar(rows, cols, x, want, &p);
      for (size_t i = 0; i < n; i++)
        if (y[i] != want[i])
          fail_msg("cols %zu rows %zu rep %d (shift %d eps %lld zp %d): y[%zu,%zu] = %d, scalar "
                   "%d (x %d, mult %d)",
                   cols, rows, rep, p.shift, (long long)p.eps, p.y_zero_point, i / cols, i % cols,
                   y[i], want[i], x[i], mult[i % cols]);
      for (size_t i = 0; i < GUARD; i++) assert_int_equal(y[n + i], 0x5A);
      for (size_t t = 0; t < rows; t++) {
        rmsnorm_row_ref(x + t * cols, cols, &p, ref);
        assert_memory_equal(want + t * cols, ref, cols);
      }
      for (size_t i = 0; i < n; i++)
        inside += y[i] != INT8_MIN && y[i] != INT8_MAX && y[i] != p.y_zero_point;
      free(x), free(mult), free(y), free(want), free(ref);
    }
  assert_true(inside > 20000); /* the cases reach the rounding, not only the ends */
  rmsnorm_edge_check(fn, &rng);
}

static double rand_normal(uint64_t *rng) { /* Box-Muller */
  const double u1 = 1.0 - rand_unit(rng), u2 = rand_unit(rng);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

/* npu_rsqrt_q61's contract, then the integer RMSNorm against the real one in double: gains of
 * either sign (and 0), outlier channels, rows of very different sizes and an all-zero row, with
 * the params made the way the quantizer makes them (one shift from the largest gain, eps in units
 * of the squared input): within one output LSB everywhere. */
static void test_rmsnorm_vs_float(void **state) {
  (void)state;
  uint64_t rng = 26;
  for (int i = 0; i < 4000; i++) {
    static const int64_t fixed[] = {1,
                                    2,
                                    3,
                                    4,
                                    5,
                                    ((int64_t)1 << 60) - 1,
                                    (int64_t)1 << 60,
                                    ((int64_t)1 << 62) - 1,
                                    (int64_t)1 << 62,
                                    INT64_MAX};
    const uint64_t w = test_rand(&rng) >> rand_range(&rng, 1, 63); /* [0, 2^63) */
    const int64_t v = i < 10 ? fixed[i] : w == 0 ? 1 : (int64_t)w;
    int32_t e;
    const int32_t r = npu_rsqrt_q61(v, &e);
    assert_true(e >= -1 && e <= 30 && r >= (1 << 30)); /* 2^30 itself at v' = 2^62 - 1 */
    const double rel = (double)r * ldexp(1.0, e - 61) * sqrt((double)v) - 1.0;
    if (fabs(rel) > 0x1p-29)
      fail_msg("npu_rsqrt_q61(%lld) = %d * 2^(%d - 61): relative error %g", (long long)v, r, e,
               rel);
  }
  static const size_t widths[] = {1, 2, 7, 64, 100, 768, 1000, 2048, 4096};
  int checked = 0, saturated = 0;
  for (int rep = 0; rep < 45; rep++) {
    const size_t cols = widths[rep % 9], rows = (size_t)rand_range(&rng, 1, 3), n = rows * cols;
    int16_t *x = xmalloc(n * sizeof(int16_t));
    int8_t *y = xmalloc(n);
    int32_t *mult = xmalloc(cols * sizeof(int32_t));
    double *g = xmalloc(cols * sizeof(double)), *yr = xmalloc(n * sizeof(double));
    /* the real residual stream: x * sx, the int16 amplitude and the real one independent */
    const double sx =
        ldexp(1.0 + rand_unit(&rng), rand_range(&rng, -3, 6)) / ldexp(1.0, rand_range(&rng, 5, 13));
    const double eps_real = rep % 2 ? 1e-5 : 1e-6;
    for (size_t t = 0; t < rows; t++) {
      const double amp = ldexp(1.0 + rand_unit(&rng), rand_range(&rng, 5, 12));
      int64_t sq = 0;
      for (size_t c = 0; c < cols; c++) {
        const double v = rand_normal(&rng) * amp * (c % 97 == 5 ? 8.0 : 1.0);
        x[t * cols + c] = (int16_t)fmin(fmax(round(v), INT16_MIN), INT16_MAX);
        sq += (int64_t)x[t * cols + c] * x[t * cols + c];
      }
      /* a real row is never so small that eps's rounding to an integer would show ... */
      if (sq < 4096) x[t * cols] = 64;
      /* ... except an all-zero one, which is 0 (+ the zero point) either way */
      if (rep % 10 == 9 && t == rows - 1) memset(x + t * cols, 0, cols * sizeof(int16_t));
    }
    double gmax = 0.0;
    for (size_t c = 0; c < cols; c++) {
      g[c] = rep % 3 == 0 ? 1.0 : (0.2 + 1.5 * rand_unit(&rng)) * (c % 10 == 7 ? -1.0 : 1.0);
      if (c % 50 == 3) g[c] = 0.0;
      gmax = fmax(gmax, fabs(g[c]));
    }
    double ymax = 0.0;
    for (size_t t = 0; t < rows; t++) {
      double ms = 0.0;
      for (size_t c = 0; c < cols; c++) ms += (x[t * cols + c] * sx) * (x[t * cols + c] * sx);
      const double inv = 1.0 / sqrt(ms / (double)cols + eps_real);
      for (size_t c = 0; c < cols; c++) {
        yr[t * cols + c] = x[t * cols + c] * sx * inv * g[c];
        ymax = fmax(ymax, fabs(yr[t * cols + c]));
      }
    }
    /* the output scale from the tensor's range, sometimes too small (saturating) */
    const double sy = (ymax > 0.0 ? ymax : 1.0) / (64.0 + 192.0 * rand_unit(&rng));
    const int32_t zp = rep % 4 == 0 ? 0 : rand_range(&rng, -60, 60);
    /* mult[c] * 2^(shift - 31) ~ g[c] * sqrt(cols) / sy with the largest |mult| in [2^30, 2^31) */
    int32_t shift;
    frexp(gmax * sqrt((double)cols) / sy, &shift);
    for (;;) {
      bool fits = true;
      for (size_t c = 0; c < cols; c++) {
        const double m = round(ldexp(g[c] * sqrt((double)cols) / sy, 31 - shift));
        fits = fits && fabs(m) <= INT32_MAX;
        mult[c] = fabs(m) <= INT32_MAX ? (int32_t)m : 0;
      }
      if (fits) break;
      shift++; /* the largest rounded up to 2^31 */
    }
    assert_true(shift >= -16 && shift <= 46);
    const double eps_units = round((double)cols * eps_real / (sx * sx));
    assert_true(eps_units <= ldexp(1.0, 62));
    const struct npu_qs16_rmsnorm_params p = {.mult = mult,
                                              .eps = eps_units < 1.0 ? 1 : (int64_t)eps_units,
                                              .shift = shift,
                                              .y_zero_point = zp};
    npu_qs16_rmsnorm_qs8__scalar(rows, cols, x, y, &p);
    for (size_t i = 0; i < n; i++) {
      const double want = fmin(fmax(round(yr[i] / sy) + zp, INT8_MIN), INT8_MAX);
      saturated += want == INT8_MIN || want == INT8_MAX;
      checked++;
      if (fabs(y[i] - want) > 1.0)
        fail_msg("rep %d (cols %zu shift %d eps %lld): y[%zu,%zu] = %d, real %g", rep, cols, shift,
                 (long long)p.eps, i / cols, i % cols, y[i], yr[i] / sy + zp);
    }
    free(x), free(y), free(mult), free(g), free(yr);
  }
  assert_true(saturated < checked / 50); /* the test spans the range, not just the ends */
}

/* ---- int16-activation GEMMs (w8a16, w4a16) and the qc4w packing ------------------------------*/

static void test_narrow(void **state) {
  (void)state;
  assert_int_equal(npu_narrow(0, 0), 0);
  assert_int_equal(npu_narrow(123456789, 0), 123456789);
  assert_int_equal(npu_narrow(INT32_MAX, 0), INT32_MAX);
  assert_int_equal(npu_narrow(INT32_MIN, 0), INT32_MIN);
  assert_int_equal(npu_narrow((int64_t)INT32_MAX + 1, 0), INT32_MAX); /* saturates */
  assert_int_equal(npu_narrow((int64_t)INT32_MIN - 1, 0), INT32_MIN);
  assert_int_equal(npu_narrow(INT64_MAX, 0), INT32_MAX);
  assert_int_equal(npu_narrow(INT64_MIN, 0), INT32_MIN);
  /* ties round up (towards +infinity), like npu_requantize */
  assert_int_equal(npu_narrow(5, 1), 3);
  assert_int_equal(npu_narrow(-5, 1), -2);
  assert_int_equal(npu_narrow(3, 1), 2);
  assert_int_equal(npu_narrow(-3, 1), -1);
  assert_int_equal(npu_narrow(-1, 1), 0);
  assert_int_equal(npu_narrow(-2, 2), 0);  /* -0.5 -> 0 */
  assert_int_equal(npu_narrow(-3, 2), -1); /* -0.75 -> -1 */
  assert_int_equal(npu_narrow(6, 2), 2);   /* 1.5 -> 2 */
  /* the largest shift */
  assert_int_equal(npu_narrow((int64_t)1 << 31, 32), 1); /* 0.5 -> 1 */
  assert_int_equal(npu_narrow(((int64_t)1 << 31) - 1, 32), 0);
  assert_int_equal(npu_narrow(-((int64_t)1 << 31), 32), 0);
  assert_int_equal(npu_narrow(-((int64_t)1 << 31) - 1, 32), -1);
  assert_int_equal(npu_narrow(INT64_MAX, 32), INT32_MAX); /* 2^31 - 2^-32 rounds to 2^31 */
  assert_int_equal(npu_narrow(INT64_MIN, 32), INT32_MIN);
  assert_int_equal(npu_narrow((int64_t)INT32_MAX << 32, 32), INT32_MAX);
  /* random: the definition floor((acc + 2^(s - 1)) / 2^s) in 128 bits */
  uint64_t rng = 77;
  for (int i = 0; i < 200000; i++) {
    const int64_t acc = (int64_t)test_rand(&rng) >> rand_range(&rng, 0, 63);
    const int32_t s = rand_range(&rng, 0, 32);
    __int128 v = s == 0 ? acc : ((__int128)acc + ((__int128)1 << (s - 1))) >> s;
    v = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v;
    assert_true(npu_narrow(acc, s) == (int32_t)v);
  }
}

static void test_qc4w_pack(void **state) {
  (void)state;
  uint64_t rng = 404;
  static const size_t ns[] = {1, 15, 16, 17, 40};
  static const size_t ks[] = {1, 7, 8, 9, 31, 32, 33, 100, 257};
  for (size_t in = 0; in < 5; in++)
    for (size_t ik = 0; ik < 9; ik++)
      for (size_t block = 0; block <= NPU_QC4W_BLOCK; block += NPU_QC4W_BLOCK) {
        const size_t n = ns[in], k = ks[ik], nb = (k + 31) / 32;
        int8_t *w = xmalloc(n * k), *row = xmalloc(k);
        uint8_t *q = xmalloc(n * nb);
        int32_t *bias = xmalloc(n * sizeof(int32_t));
        for (size_t i = 0; i < n * k; i++) w[i] = (int8_t)rand_range(&rng, -8, 7);
        for (size_t i = 0; i < n * nb; i++) q[i] = (uint8_t)rand_range(&rng, 0, 15);
        for (size_t j = 0; j < n; j++) bias[j] = rand_range(&rng, -(1 << 30), 1 << 30);
        const size_t size = npu_qc4w_gemm_packed_size(n, k, block);
        assert_int_equal(size, (n + 15) / 16 * npu_qc4w_gemm_block_size(k, block));
        uint8_t *packed = xmalloc(size);
        const uint8_t *qs = block != 0 ? q : NULL;
        assert_true(npu_qc4w_gemm_pack(n, k, w, bias, block, qs, packed));
        for (size_t r = 0; r < n; r++) {
          npu_qc4w_gemm_unpack_row(k, block, packed, r, 0, k, row);
          assert_memory_equal(row, w + r * k, k);
          const size_t c0 = (size_t)rand_range(&rng, 0, (int32_t)k - 1);
          const size_t c1 = c0 + (size_t)rand_range(&rng, 0, (int32_t)(k - c0));
          npu_qc4w_gemm_unpack_row(k, block, packed, r, c0, c1, row);
          assert_memory_equal(row, w + r * k + c0, c1 - c0);
          /* the head: bias and the (scaled) weight sum */
          const uint8_t *blk = packed + r / 16 * npu_qc4w_gemm_block_size(k, block);
          int32_t head[32];
          memcpy(head, blk, sizeof(head));
          int32_t sum = 0;
          for (size_t kk = 0; kk < k; kk++)
            sum += (block != 0 ? q[r * nb + kk / 32] : 1) * w[r * k + kk];
          assert_int_equal(head[r % 16], bias[r]);
          assert_int_equal(head[16 + r % 16], sum);
          if (block != 0) /* the scales of each chunk */
            for (size_t b = 0; b < nb; b++)
              assert_int_equal(blk[128 + b * 272 + r % 16], q[r * nb + b]);
        }
        /* the padding: weight 0 (nibble 8) past k and past n, scale 0 past n */
        const uint8_t *last = packed + (n - 1) / 16 * npu_qc4w_gemm_block_size(k, block) + 128;
        for (size_t j = n % 16 == 0 ? 16 : n % 16; j < 16; j++) {
          for (size_t kk = 0; kk < npu_qc4w_gemm_kp(k, block); kk++) {
            const size_t off = block != 0 ? kk / 32 * 272 + 16 + kk % 32 / 8 * 64 : kk / 8 * 64;
            const uint8_t b = last[off + j * 4 + kk % 4];
            assert_int_equal(kk % 8 >= 4 ? b >> 4 : b & 15, 8);
          }
          if (block != 0) assert_int_equal(last[j], 0);
        }
        /* the packer's refusals */
        assert_false(npu_qc4w_gemm_pack(n, 0, w, bias, block, qs, packed));
        assert_false(npu_qc4w_gemm_pack(n, k, w, bias, 16, q, packed));
        assert_false(npu_qc4w_gemm_pack(n, k, w, bias, block, block != 0 ? NULL : q, packed));
        const size_t at = (size_t)rand_range(&rng, 0, (int32_t)(n * k - 1));
        const int8_t keep = w[at];
        w[at] = rand_range(&rng, 0, 1) ? 8 : -9;
        assert_false(npu_qc4w_gemm_pack(n, k, w, bias, block, qs, packed));
        w[at] = keep;
        const int32_t keep_bias = bias[n - 1];
        bias[n - 1] = rand_range(&rng, 0, 1) ? (1 << 30) + 1 : -(1 << 30) - 1;
        assert_false(npu_qc4w_gemm_pack(n, k, w, bias, block, qs, packed));
        bias[n - 1] = keep_bias;
        if (block != 0) {
          q[n * nb - 1] = 16;
          assert_false(npu_qc4w_gemm_pack(n, k, w, bias, block, q, packed));
        }
        assert_true(npu_qc4w_gemm_pack(n, k, w, NULL, 0, NULL, packed));
        free(w), free(row), free(q), free(bias), free(packed);
      }
  int8_t w1[2] = {0, 0};
  uint8_t out[1024];
  assert_false(npu_qc4w_gemm_pack(1, NPU_QS8_GEMM_MAX_K + 1, w1, NULL, 0, NULL, out));
}

struct qs16_case {
  size_t m, n, k, x_stride, y_stride, block;
  bool int4;
  int16_t *x;
  int8_t *w;     /* int8 [-127, 127] or int4 [-8, 7] */
  uint8_t *q;    /* [n][ceil(k / 32)] block scales (block 32), else NULL */
  int32_t *bias; /* NULL: none */
  int32_t *mult, *shift;
  int32_t acc_shift, zy;
  void *packed;
};

/* The largest |acc| of the case's ranges. */
static int64_t qs16_acc_bound(size_t k, bool int4, size_t block) {
  return ((int64_t)1 << 30) + (int64_t)k * 32768 * (int4 ? 8 * (block != 0 ? 15 : 1) : 127);
}

/* x_mode 0: random; 1: all -32768; 2: alternating extremes. w_mode 0: random; 1: the most
 * negative weight (with x = -32768 the largest positive products); 2: mixed extremes. q: random,
 * with 0 and 15 among them, or all 15 with w_mode 1. acc_shift: the bound's, or anything. */
static void qs16_case_make(struct qs16_case *c, size_t m, size_t n, size_t k, bool int4,
                           size_t block, int x_mode, int w_mode, uint64_t *rng) {
  c->m = m, c->n = n, c->k = k, c->int4 = int4, c->block = block;
  c->x_stride = k + (size_t)rand_range(rng, 0, 5);
  c->y_stride = n + (size_t)rand_range(rng, 0, 3);
  c->x = xmalloc(m * c->x_stride * sizeof(int16_t));
  c->w = xmalloc(n * k);
  const size_t nb = (k + 31) / 32;
  c->q = block != 0 ? xmalloc(n * nb) : NULL;
  c->bias = rand_range(rng, 0, 3) != 0 || w_mode != 0 ? xmalloc(n * sizeof(int32_t)) : NULL;
  c->mult = xmalloc(n * sizeof(int32_t));
  c->shift = xmalloc(n * sizeof(int32_t));
  for (size_t i = 0; i < m * c->x_stride; i++)
    c->x[i] = x_mode == 1   ? INT16_MIN
              : x_mode == 2 ? (int16_t)(i % 3 == 0 ? INT16_MAX : INT16_MIN)
                            : (int16_t)rand_range(rng, INT16_MIN, INT16_MAX);
  const int32_t wlo = int4 ? -8 : -127, whi = int4 ? 7 : 127;
  for (size_t i = 0; i < n * k; i++)
    c->w[i] = (int8_t)(w_mode == 1   ? wlo
                       : w_mode == 2 ? (i % 5 < 2 ? whi : wlo)
                                     : rand_range(rng, wlo, whi));
  if (c->q != NULL)
    for (size_t i = 0; i < n * nb; i++)
      c->q[i] = (uint8_t)(w_mode == 1 ? 15 : i % 7 == 0 ? 0 : rand_range(rng, 0, 15));
  const int64_t bound = qs16_acc_bound(k, int4, block);
  int32_t proper = 0;
  while ((bound >> proper) > INT32_MAX) proper++;
  c->acc_shift = rand_range(rng, 0, 3) == 0 ? rand_range(rng, 0, 32) : proper;
  c->zy = rand_range(rng, 0, 2) == 0 ? rand_range(rng, INT16_MIN, INT16_MAX)
                                     : (rand_range(rng, 0, 1) ? INT16_MIN : INT16_MAX);
  if (rand_range(rng, 0, 1)) c->zy = rand_range(rng, -100, 100);
  /* multipliers that spread the typical outputs over the int16 range, plus some extremes */
  const double wrms = int4 ? 4.6 * (block != 0 ? 8.8 : 1.0) : 73.0;
  const double acc_rms = sqrt((double)k) * 18918.0 * wrms / ldexp(1.0, c->acc_shift);
  for (size_t j = 0; j < n; j++) {
    if (c->bias != NULL)
      c->bias[j] = w_mode != 0 ? (j % 2 ? 1 << 30 : -(1 << 30))
                               : rand_range(rng, -(1 << 30), 1 << 30) >> rand_range(rng, 0, 30);
    if (rand_range(rng, 0, 9) == 0) {
      c->mult[j] = rand_range(rng, 0, 1) ? INT32_MAX : (1 << 30);
      c->shift[j] = rand_range(rng, -31, 30);
    } else {
      const double real = fmax(8192.0 / (acc_rms + 1.0) * (0.25 + 4.0 * rand_unit(rng)), 1e-9);
      assert_true(npu_quantize_multiplier(fmin(real, 0x1p29), &c->mult[j], &c->shift[j]));
    }
  }
  if (int4) {
    c->packed = xmalloc(npu_qc4w_gemm_packed_size(n, k, block));
    assert_true(npu_qc4w_gemm_pack(n, k, c->w, c->bias, block, c->q, c->packed));
  } else {
    c->packed = xmalloc(npu_qs8_gemm_packed_size(n, k));
    assert_true(npu_qs8_gemm_pack(n, k, c->w, c->bias, c->packed));
  }
}

static void qs16_case_free(struct qs16_case *c) {
  free(c->x), free(c->w), free(c->q), free(c->bias), free(c->mult), free(c->shift);
  free(c->packed);
}

/* The naive reference: the definition of npu_ukernels.h on unpacked weights. */
static int16_t qs16_ref(const struct qs16_case *c, size_t i, size_t j) {
  const size_t nb = (c->k + 31) / 32;
  int64_t acc = c->bias != NULL ? c->bias[j] : 0;
  for (size_t kk = 0; kk < c->k; kk++)
    acc += (int64_t)(c->q != NULL ? c->q[j * nb + kk / 32] : 1) * c->x[i * c->x_stride + kk] *
           c->w[j * c->k + kk];
  return npu_requantize_s16(npu_narrow(acc, c->acc_shift), c->mult[j], c->shift[j], c->zy);
}

static void qs16_check(const struct qs16_case *c, npu_qs16_gemm_qs16_fn *fn, size_t n_begin,
                       size_t n_end) {
  const size_t ysize = c->m * c->y_stride;
  int16_t *y = xmalloc(ysize * sizeof(int16_t));
  for (size_t i = 0; i < ysize; i++) y[i] = 0x5a5a;
  const struct npu_qs16_gemm_params p = {c->mult, c->shift, c->acc_shift, c->zy, (int32_t)c->block};
  fn(c->m, n_begin, n_end, c->k, c->x, c->x_stride, c->packed, y, c->y_stride, &p);
  for (size_t i = 0; i < c->m; i++)
    for (size_t j = 0; j < c->y_stride; j++) {
      const int16_t got = y[i * c->y_stride + j];
      if (j >= n_begin && j < n_end) {
        const int16_t want = qs16_ref(c, i, j);
        if (got != want)
          fail_msg("m=%zu n=%zu k=%zu int4=%d block=%zu acc_shift=%d zy=%d [%zu,%zu): y[%zu,%zu] "
                   "= %d, want %d (mult %d shift %d)",
                   c->m, c->n, c->k, c->int4, c->block, c->acc_shift, c->zy, n_begin, n_end, i, j,
                   got, want, c->mult[j], c->shift[j]);
      } else {
        assert_int_equal(got, 0x5a5a);
      }
    }
  free(y);
}

/* Every variant of a qs16 GEMM family: m 1..9 and a few whole tiles, n around the 16-channel
 * blocks, k around the 4 / 8 / 32 groupings and the 512-k int32 spans of the SIMD kernels,
 * sub-ranges from a block boundary, then the extremes at k up to 32768 (the largest int32
 * partial sums the documented bounds allow). */
static void qs16_family_check(npu_qs16_gemm_qs16_fn *fn, bool int4, size_t block) {
  static const size_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  static const size_t ns[] = {1, 7, 16, 17, 33, 63};
  static const size_t ks[] = {1, 3, 7, 8, 9, 31, 32, 33, 100, 511, 512, 513, 1100};
  uint64_t rng = 1000 + (int4 ? 1 : 0) + block;
  int idx = 0;
  for (size_t im = 0; im < sizeof(ms) / sizeof(ms[0]); im++)
    for (size_t in = 0; in < sizeof(ns) / sizeof(ns[0]); in++)
      for (size_t ik = 0; ik < sizeof(ks) / sizeof(ks[0]); ik++, idx++) {
        if (ks[ik] > 100 && idx % 3 != 0) continue; /* fewer of the long ones */
        struct qs16_case c;
        qs16_case_make(&c, ms[im], ns[in], ks[ik], int4, block, idx % 5 == 0 ? 2 : 0,
                       idx % 7 == 0 ? 2 : 0, &rng);
        qs16_check(&c, fn, 0, c.n);
        const size_t nb = (size_t)rand_range(&rng, 0, (int32_t)((c.n - 1) / 16));
        const size_t n_end =
            nb * 16 + 1 + (size_t)rand_range(&rng, 0, (int32_t)(c.n - nb * 16 - 1));
        qs16_check(&c, fn, nb * 16, n_end);
        qs16_check(&c, fn, nb * 16, nb * 16);
        qs16_case_free(&c);
      }
  static const size_t big[] = {32768, 32767, 4097, 20001};
  for (int rep = 0; rep < 8; rep++) {
    struct qs16_case c;
    qs16_case_make(&c, rep % 2 ? 3 : 1, 21, big[rep % 4], int4, block, 1 + rep / 2 % 2, 1 + rep / 4,
                   &rng);
    qs16_check(&c, fn, 0, c.n);
    qs16_check(&c, fn, 16, c.n - 2);
    qs16_case_free(&c);
  }
}

static void check_qs16_gemm_qs16(npu_qs16_gemm_qs16_fn *fn) { qs16_family_check(fn, false, 0); }

static void check_qs16_qc4w_gemm_qs16(npu_qs16_qc4w_gemm_qs16_fn *fn) {
  qs16_family_check(fn, true, 0);
  qs16_family_check(fn, true, NPU_QC4W_BLOCK);
}

/* ---- int16 lookup table and RMSNorm into int16 -----------------------------------------------*/

static int16_t lut16_ref(int16_t x, const int16_t *t) {
  const int32_t u = x + 32768, i = u / 128, f = u % 128;
  return (int16_t)(t[i] + (int32_t)floor(((double)(t[i + 1] - t[i]) * f + 64) / 128.0));
}

/* Every int16 input, tables random, of extremes and smooth (SiLU), lengths around the SIMD width,
 * in place too. */
static void check_qs16_lut(npu_qs16_lut_fn *fn) {
  uint64_t rng = 16;
  int16_t table[NPU_QS16_LUT_SIZE];
  enum { N = 65536 + 40 };
  int16_t *x = xmalloc(N * sizeof(int16_t)), *y = xmalloc(N * sizeof(int16_t));
  for (int rep = 0; rep < 6; rep++) {
    for (int i = 0; i < NPU_QS16_LUT_SIZE; i++)
      table[i] = rep == 0   ? (int16_t)rand_range(&rng, INT16_MIN, INT16_MAX)
                 : rep == 1 ? (int16_t)(i % 2 ? INT16_MAX : INT16_MIN)
                 : rep == 2 ? (int16_t)(i % 3 ? INT16_MIN : INT16_MAX)
                            : 0;
    if (rep >= 3) npu_lut_s16_build(npu_silu, 8.0f / (rep * 4096), 8.0f / 32768, table);
    for (size_t i = 0; i < N; i++)
      x[i] = (int16_t)(i < 65536 ? (int32_t)i - 32768 : rand_range(&rng, -9, 9));
    static const size_t lens[] = {N, 0, 1, 7, 8, 9, 15, 16, 17, 33};
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
      const size_t n = lens[li], off = li == 0 ? 0 : (size_t)rand_range(&rng, 0, 60000);
      for (size_t i = 0; i < n + 8 && off + i < N; i++) y[off + i] = 0x5a5a;
      fn(n, x + off, y + off, table);
      for (size_t i = 0; i < n; i++)
        if (y[off + i] != lut16_ref(x[off + i], table))
          fail_msg("rep %d n %zu: y(%d) = %d, want %d", rep, n, x[off + i], y[off + i],
                   lut16_ref(x[off + i], table));
      for (size_t i = n; i < n + 8 && off + i < N; i++) assert_int_equal(y[off + i], 0x5a5a);
    }
    memcpy(y, x, N * sizeof(int16_t));
    fn(N, y, y, table); /* in place */
    for (size_t i = 0; i < N; i++) assert_int_equal(y[i], lut16_ref(x[i], table));
  }
  free(x), free(y);
}

/* SiLU's knots: within half an LSB of the function at each knot (rounding), and the interpolation
 * between them within 1 LSB + the chord error (SiLU'' <= 0.5: (128 x_scale)^2 / 16 real units)
 * at every int16 input. */
static void test_lut_s16_build_silu(void **state) {
  (void)state;
  int16_t table[NPU_QS16_LUT_SIZE], y[256];
  const float xs = 12.0f / 32768, ys = 12.0f / 32768;
  npu_lut_s16_build(npu_silu, xs, ys, table);
  for (int i = 0; i < NPU_QS16_LUT_SIZE; i++) /* knot 512 (silu(12) / ys > 32767) saturates */
    assert_true(fabs(table[i] - fmin(npu_silu((double)xs * (i * 128 - 32768)) / ys, INT16_MAX)) <=
                0.5 + 1e-6);
  assert_int_equal(table[256], 0);                                    /* silu(0) = 0 */
  const double bound = 1.0 + (128.0 * xs) * (128.0 * xs) / 16.0 / ys; /* in output LSBs */
  int16_t xin[256];
  for (int32_t x0 = INT16_MIN; x0 <= INT16_MAX; x0 += 256) {
    for (int j = 0; j < 256; j++) xin[j] = (int16_t)(x0 + j);
    npu_qs16_lut__scalar(256, xin, y, table);
    for (int j = 0; j < 256; j++) {
      const double want = npu_silu((double)xs * xin[j]) / ys;
      if (fabs(y[j] - want) > bound) fail_msg("silu(%d): %d, want %g", xin[j], y[j], want);
    }
  }
  /* saturation of the knots: a scale too small for the function's range */
  npu_lut_s16_build(npu_silu, 1.0f / 256, 1.0f / 32768, table);
  assert_int_equal(table[512], INT16_MAX);
  assert_true(table[0] <= 0 && table[0] > INT16_MIN);
}

/* One row into int16 from the definition, in 128-bit arithmetic. */
static void rmsnorm16_row_ref(const int16_t *x, size_t cols,
                              const struct npu_qs16_rmsnorm_params *p, int16_t *out) {
  int64_t v = p->eps;
  for (size_t c = 0; c < cols; c++) v += (int64_t)x[c] * x[c];
  int32_t e;
  const int64_t r = npu_rsqrt_q61(v, &e);
  const int32_t s = 77 - e - p->shift;
  for (size_t c = 0; c < cols; c++) {
    const __int128 u = ((__int128)x[c] * r + (1 << 14)) >> 15;
    const __int128 o = ((u * p->mult[c] + ((__int128)1 << (s - 1))) >> s) + p->y_zero_point;
    out[c] = (int16_t)(o < INT16_MIN ? INT16_MIN : o > INT16_MAX ? INT16_MAX : o);
  }
}

/* Widths around the SIMD steps, values from extremes to tiny, multipliers of both signs, shifts
 * over the range and int16 zero points at both ends (a clamp that is too narrow before the zero
 * point shows there): bit for bit against the definition. */
static void check_qs16_rmsnorm_qs16(npu_qs16_rmsnorm_qs16_fn *fn) {
  uint64_t rng = 2516;
  static const size_t widths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 768, 1001};
  long inside = 0;
  for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++)
    for (int rep = 0; rep < (widths[wi] < 64 ? 200 : 30); rep++) {
      const size_t cols = widths[wi], rows = (size_t)rand_range(&rng, 1, 4), n = rows * cols;
      int16_t *x = xmalloc(n * sizeof(int16_t)), *y = xmalloc((n + 16) * sizeof(int16_t));
      int16_t *ref = xmalloc(cols * sizeof(int16_t));
      int32_t *mult = xmalloc(cols * sizeof(int32_t));
      const int mode = rep % 5;
      for (size_t i = 0; i < n; i++)
        x[i] = mode == 0   ? (int16_t)rand_range(&rng, INT16_MIN, INT16_MAX)
               : mode == 1 ? (int16_t)(i % 3 == 0 ? INT16_MAX : INT16_MIN)
               : mode == 2 ? 0
               : mode == 3 ? (int16_t)rand_range(&rng, -300, 300)
                           : (int16_t)rand_range(&rng, -3, 3);
      for (size_t c = 0; c < cols; c++) {
        const int k = rand_range(&rng, 0, 6);
        mult[c] = k == 0 ? 0 : k == 1 ? INT32_MAX : k == 2 ? -INT32_MAX : rand_mult(&rng);
      }
      struct npu_qs16_rmsnorm_params p = {
          .mult = mult,
          .eps = rep % 4 == 0 ? 1 : (int64_t)(test_rand(&rng) >> rand_range(&rng, 2, 63)) + 1,
          .shift = rep % 3 == 0 ? rand_range(&rng, -16, 46) : rand_range(&rng, 8, 24),
          .y_zero_point = rep % 3 == 0   ? INT16_MIN
                          : rep % 3 == 1 ? INT16_MAX
                                         : rand_range(&rng, INT16_MIN, INT16_MAX)};
      for (size_t i = 0; i < 16; i++) y[n + i] = 0x5a5a;
      fn(rows, cols, x, y, &p);
      for (size_t i = 0; i < 16; i++) assert_int_equal(y[n + i], 0x5a5a);
      for (size_t t = 0; t < rows; t++) {
        rmsnorm16_row_ref(x + t * cols, cols, &p, ref);
        for (size_t c = 0; c < cols; c++) {
          if (y[t * cols + c] != ref[c])
            fail_msg("cols %zu rep %d (shift %d eps %lld zp %d): y[%zu,%zu] = %d, want %d", cols,
                     rep, p.shift, (long long)p.eps, p.y_zero_point, t, c, y[t * cols + c], ref[c]);
          inside += ref[c] != INT16_MIN && ref[c] != INT16_MAX && ref[c] != p.y_zero_point;
        }
      }
      free(x), free(y), free(ref), free(mult);
    }
  assert_true(inside > 5000);
}

/* ---- neuron bundles (sparse decode) -----------------------------------------------------------*/

static const size_t bundle_ks[] = {1, 3, 31, 63, 64, 65, 100, 257, 1000, 2048 + 13};
static const size_t bundle_counts[] = {0, 1, 2, 3, 7, 33};
#define N_BUNDLE_KS (sizeof(bundle_ks) / sizeof(bundle_ks[0]))
#define N_BUNDLE_COUNTS (sizeof(bundle_counts) / sizeof(bundle_counts[0]))

/* A weight for mode 0: random in [-127, 127]; 1: 127; 2: -127; 3: +-127 at random. */
static int8_t bundle_weight(int mode, uint64_t *rng) {
  switch (mode) {
  case 1: return 127;
  case 2: return -127;
  case 3: return (int8_t)(test_rand(rng) & 1 ? 127 : -127);
  default: return (int8_t)rand_range(rng, -127, 127);
  }
}

/* 'n' bundles of width k side by side (3 kp bytes each, 64-byte aligned, zero past k in each of
 * the three vectors), weights of 'mode'. */
static int8_t *bundles_make(size_t k, size_t n, int mode, uint64_t *rng) {
  const size_t kp = npu_bundle_kp(k), size = n * 3 * kp > 0 ? n * 3 * kp : 64;
  int8_t *b = aligned_alloc(64, size);
  assert_non_null(b);
  memset(b, 0, size);
  for (size_t v = 0; v < 3 * n; v++)
    for (size_t c = 0; c < k; c++) b[v * kp + c] = bundle_weight(mode, rng);
  return b;
}

/* 'count' pointers to bundles of 'base' (n of them) in a random order, with repeats. */
static void bundle_ptrs(const int8_t *base, size_t k, size_t n, size_t count, const int8_t **out,
                        uint64_t *rng) {
  const size_t kp = npu_bundle_kp(k);
  for (size_t i = 0; i < count; i++) out[i] = base + (test_rand(rng) % n) * 3 * kp;
}

/* sum_{c<k} (x[c] - zp) * w[c] in int64: what qs8_rows_dot gives for the row w. */
static int64_t row_dot_ref(size_t k, const int8_t *x, int32_t zp, const int8_t *w) {
  int64_t s = 0;
  for (size_t c = 0; c < k; c++) s += (int64_t)(x[c] - zp) * w[c];
  return s;
}

static void check_qs8_cols_down(npu_qs8_cols_down_fn *fn) {
  uint64_t rng = 43;
  for (size_t ki = 0; ki < N_BUNDLE_KS; ki++) {
    const size_t k = bundle_ks[ki], kp = npu_bundle_kp(k);
    int32_t *acc = xmalloc((k + 16) * sizeof(int32_t)), *want = xmalloc(k * sizeof(int32_t));
    for (int rep = 0; rep < 4; rep++) {
      int8_t *base = bundles_make(k, 40, rep, &rng);
      for (size_t ci = 0; ci < N_BUNDLE_COUNTS; ci++) {
        const size_t count = bundle_counts[ci];
        const int8_t *ptrs[33];
        int32_t coef[33];
        bundle_ptrs(base, k, 40, count, ptrs, &rng);
        for (size_t i = 0; i < count; i++) ptrs[i] += 2 * kp; /* their down columns */
        for (size_t i = 0; i < count; i++)
          coef[i] = rep == 1   ? 255
                    : rep == 2 ? -255
                    : rep == 3 ? (i & 1 ? 255 : -255)
                               : rand_range(&rng, -255, 255);
        for (size_t c = 0; c < k + 16; c++) acc[c] = rand_range(&rng, -(1 << 24), 1 << 24);
        memcpy(want, acc, k * sizeof(int32_t));
        int32_t guard[16];
        memcpy(guard, acc + k, sizeof(guard));
        fn(k, count, ptrs, coef, acc);
        for (size_t c = 0; c < k; c++) {
          int64_t s = want[c];
          for (size_t i = 0; i < count; i++) s += (int64_t)coef[i] * ptrs[i][c];
          assert_int_equal(acc[c], s);
        }
        npu_qs8_cols_down__scalar(k, count, ptrs, coef, want);
        assert_memory_equal(acc, want, k * sizeof(int32_t));
        assert_memory_equal(acc + k, guard, sizeof(guard)); /* nothing written past k */
      }
      free(base);
    }
    free(acc);
    free(want);
  }
  /* the largest sums: 65536 bundles (one, repeated) of weights +-127 times coefficients 255 */
  const size_t k = 65, kp = npu_bundle_kp(k), count = NPU_BUNDLE_DOWN_MAX_COUNT;
  int8_t *b = bundles_make(k, 1, 1, &rng);
  for (size_t c = 0; c < k; c += 2) b[2 * kp + c] = -127;
  const int8_t **ptrs = xmalloc(count * sizeof(*ptrs));
  int32_t *coef = xmalloc(count * sizeof(int32_t)), acc[65];
  for (size_t i = 0; i < count; i++) ptrs[i] = b + 2 * kp, coef[i] = 255;
  for (size_t c = 0; c < k; c++) acc[c] = c & 2 ? 0 : (c & 1 ? 25000000 : -25000000);
  fn(k, count, (const int8_t *const *)ptrs, coef, acc);
  for (size_t c = 0; c < k; c++) {
    const int64_t s =
        (c & 2 ? 0 : (c & 1 ? 25000000 : -25000000)) + (int64_t)count * 255 * (c & 1 ? 127 : -127);
    assert_int_equal(acc[c], s);
  }
  free(coef);
  free(ptrs);
  free(b);
}

/* The rows of qs8_rows_dot: any of the three vectors of the bundles of bundles_make (each
 * 64-byte aligned, kp bytes, zero past k). */
static const size_t rows_counts[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 17, 33};
#define N_ROWS_COUNTS (sizeof(rows_counts) / sizeof(rows_counts[0]))

static void check_qs8_rows_dot(npu_qs8_rows_dot_fn *fn) {
  uint64_t rng = 47;
  for (size_t ki = 0; ki < N_BUNDLE_KS; ki++) {
    const size_t k = bundle_ks[ki], kp = npu_bundle_kp(k);
    int8_t *x = xmalloc(k); /* exactly k bytes: a read past k is out of bounds (SAN=1) */
    /* rep 0-3: extremes with x - zp beyond int8 (the general paths), 4-6: x - zp within int8
     * (the fast paths of the dot product variants), at its extremes in 5 */
    for (int rep = 0; rep < 7; rep++) {
      const int mode = rep < 4 ? rep : rep == 5 ? 3 : 0;
      int8_t *base = bundles_make(k, 20, mode, &rng);
      const int32_t zp = rep == 0               ? -128
                         : rep == 1             ? 127
                         : rep == 4 || rep == 5 ? 0
                                                : rand_range(&rng, -128, 127);
      for (size_t c = 0; c < k; c++) {
        int32_t v;
        switch (rep) {
        case 1: v = -128; break;
        case 2: v = 127; break;
        case 3: v = c & 1 ? -128 : 127; break;
        case 5: v = test_rand(&rng) & 1 ? -128 : 127; break;
        case 6: /* zp + d, d in [-128, 127], within int8 */
          v = zp + rand_range(&rng, zp > 0 ? -128 : -128 - zp, zp > 0 ? 127 - zp : 127);
          break;
        default: v = rand_range(&rng, -128, 127);
        }
        x[c] = (int8_t)v;
      }
      for (size_t ci = 0; ci < N_ROWS_COUNTS; ci++) {
        const size_t count = rows_counts[ci];
        const int8_t *ptrs[33];
        int32_t acc[33 + 2], want[33];
        /* shuffled, with repeats: any of the 60 vectors */
        for (size_t i = 0; i < count; i++) ptrs[i] = base + (test_rand(&rng) % 60) * kp;
        for (size_t i = 0; i < count + 2; i++) acc[i] = 0x5a5a5a5a;
        fn(k, x, zp, count, ptrs, acc);
        npu_qs8_rows_dot__scalar(k, x, zp, count, ptrs, want);
        for (size_t i = 0; i < count; i++) assert_int_equal(acc[i], row_dot_ref(k, x, zp, ptrs[i]));
        assert_memory_equal(acc, want, count * sizeof(int32_t));
        assert_int_equal(acc[count], 0x5a5a5a5a); /* nothing written past count */
        assert_int_equal(acc[count + 1], 0x5a5a5a5a);
      }
      free(base);
    }
    free(x);
  }
  /* the largest sums: k = 32768, |w| = 127 and |x - zp| = 255 (general paths) or x - zp = -128,
   * 127 (fast paths), 9 rows (a full pass and one more) */
  const size_t k = NPU_BUNDLE_MAX_K, kp = npu_bundle_kp(k);
  int8_t *x = xmalloc(k);
  int8_t *b = bundles_make(k, 1, 1, &rng);
  for (size_t c = 0; c < k; c++) b[kp + c] = -127;
  const int8_t *ptrs[9];
  for (int i = 0; i < 9; i++) ptrs[i] = b + (i % 3 == 1 ? kp : 0);
  static const int32_t xs[4] = {-128, 127, -128, 127}, zps[4] = {127, -128, 0, 0};
  for (int s = 0; s < 4; s++) {
    memset(x, xs[s], k);
    int32_t acc[9];
    fn(k, x, zps[s], 9, ptrs, acc);
    for (int i = 0; i < 9; i++)
      assert_int_equal(acc[i], (int64_t)32768 * (xs[s] - zps[s]) * (i % 3 == 1 ? -127 : 127));
  }
  free(b);
  free(x);
}

/* The scalar references against numbers worked out by hand, and npu_bundle_kp. */
static void test_bundle_reference(void **state) {
  (void)state;
  assert_int_equal(npu_bundle_kp(1), 64);
  assert_int_equal(npu_bundle_kp(64), 64);
  assert_int_equal(npu_bundle_kp(65), 128);
  assert_int_equal(npu_bundle_kp(2048 + 13), 2112);
  assert_int_equal(npu_bundle_kp(32768), 32768);
  _Alignas(64) int8_t b[3 * 64] = {0};
  const int8_t gate[3] = {1, -2, 127}, up[3] = {-127, 5, 0}, down[3] = {3, -4, 127};
  memcpy(b, gate, 3), memcpy(b + 64, up, 3), memcpy(b + 128, down, 3);
  const int8_t x[3] = {10, -128, 127};        /* x - (-5) = 15, -123, 132 */
  const int8_t *ptrs[2] = {b + 128, b + 128}; /* the down column */
  int32_t y[4] = {1, 2, 3, 99};
  const int32_t coef[2] = {255, -1};
  npu_qs8_cols_down__scalar(3, 2, ptrs, coef, y);
  assert_int_equal(y[0], 1 + 254 * 3);
  assert_int_equal(y[1], 2 + 254 * -4);
  assert_int_equal(y[2], 3 + 254 * 127);
  assert_int_equal(y[3], 99);                     /* past k: untouched */
  npu_qs8_cols_down__scalar(3, 0, ptrs, coef, y); /* count 0: nothing */
  assert_int_equal(y[0], 763);
  int32_t r[3] = {0, 0, 99};
  const int8_t *rptrs[2] = {b + 64, b};
  npu_qs8_rows_dot__scalar(3, x, -5, 2, rptrs, r);
  assert_int_equal(r[0], 15 * -127 + -123 * 5);           /* the up row: -2520 */
  assert_int_equal(r[1], 15 * 1 + -123 * -2 + 132 * 127); /* the gate row: 17025 */
  assert_int_equal(r[2], 99);                             /* past count: untouched */
}

/* ---- input-sparse GEMV over channel-major weights ---------------------------------------------*/

/* A channel-major matrix of the tests: int8 weights w [n][k] (row j at w + j * k; int8 in
 * [-127, 127] or int4 in [-8, 7]) laid out as npu_ukernels.h's channel rows, row c at
 * cols + c * stride, weight 0 from n up to np and junk from there to the stride (which no kernel
 * may read into a result). w_mode 0: random; 1: random extremes; 2: the most negative weight;
 * 3: the most negative in even outputs, the largest in odd ones. */
struct qcol_case {
  size_t n, k, np, stride;
  unsigned w_bits;
  int8_t *w;
  uint8_t *cols;
};

static void qcol_case_make(struct qcol_case *c, size_t n, size_t k, unsigned w_bits, int w_mode,
                           size_t extra, uint64_t *rng) {
  c->n = n, c->k = k, c->w_bits = w_bits, c->np = npu_qcol_np(n);
  c->stride = npu_qcol_row_bytes(n, w_bits) + extra;
  c->w = xmalloc(n * k);
  const int32_t lo = w_bits == 4 ? -8 : -127, hi = w_bits == 4 ? 7 : 127;
  for (size_t i = 0; i < n * k; i++)
    c->w[i] = (int8_t)(w_mode == 1   ? (test_rand(rng) & 1 ? hi : lo)
                       : w_mode == 2 ? lo
                       : w_mode == 3 ? (i / k % 2 == 0 ? lo : hi)
                                     : rand_range(rng, lo, hi));
  c->cols = xmalloc(k * c->stride);
  for (size_t i = 0; i < k * c->stride; i++) c->cols[i] = (uint8_t)test_rand(rng); /* junk */
  for (size_t ch = 0; ch < k; ch++) {
    uint8_t *row = c->cols + ch * c->stride;
    for (size_t j = 0; j < c->np; j++) {
      const int32_t v = j < n ? c->w[j * k + ch] : 0;
      if (w_bits == 8) {
        row[j] = (uint8_t)v;
      } else { /* chunk j / 64, byte j % 32, the high nibble for j % 64 >= 32 */
        uint8_t *b = row + j / 64 * 32 + j % 32;
        *b = j % 64 < 32 ? (uint8_t)((*b & 0xF0) | (v + 8)) : (uint8_t)((*b & 0x0F) | (v + 8) << 4);
      }
    }
  }
}

static void qcol_case_free(struct qcol_case *c) {
  free(c->w);
  free(c->cols);
}

/* (q ? q[n] : 1) * sum_i d[i] * w[n, idx[i]] in int64: what the kernels add to acc[n - n0]. */
static int64_t qcol_ref(const struct qcol_case *c, size_t n, size_t count, const int32_t *idx,
                        const int16_t *d, const uint8_t *q) {
  int64_t s = 0;
  if (n < c->n)
    for (size_t i = 0; i < count; i++) s += (int64_t)d[i] * c->w[n * c->k + (size_t)idx[i]];
  return (q != NULL ? q[n] : 1) * s;
}

/* One call of fn8 or fn4 (the other NULL) on [n0, n1), acc starting at random values within
 * +-acc_range: the scalar reference against the int64 sum, the variant against the reference,
 * and nothing written past n1 - n0. */
static void qcol_call_check(const struct qcol_case *c, npu_qcol8_gemv_fn *fn8,
                            npu_qcol4_gemv_fn *fn4, size_t n0, size_t n1, size_t count,
                            const int32_t *idx, const int16_t *d, const uint8_t *q,
                            int32_t acc_range, uint64_t *rng) {
  enum { GUARD = 16 };
  const size_t width = n1 - n0, size = (width + GUARD) * sizeof(int32_t);
  int32_t *acc = xmalloc(size), *want = xmalloc(size), *start = xmalloc(size);
  for (size_t j = 0; j < width + GUARD; j++) start[j] = rand_range(rng, -acc_range, acc_range);
  memcpy(acc, start, size);
  memcpy(want, start, size);
  if (fn8 != NULL) {
    fn8(n0, n1, count, idx, d, (const int8_t *)c->cols, c->stride, acc);
    npu_qcol8_gemv__scalar(n0, n1, count, idx, d, (const int8_t *)c->cols, c->stride, want);
  } else {
    fn4(n0, n1, count, idx, d, c->cols, c->stride, q, acc);
    npu_qcol4_gemv__scalar(n0, n1, count, idx, d, c->cols, c->stride, q, want);
  }
  for (size_t j = 0; j < width; j++) {
    const int64_t s = qcol_ref(c, n0 + j, count, idx, d, q);
    assert_true(llabs(s) + llabs(start[j]) < (1ll << 31)); /* the caller's bound holds */
    assert_int_equal(want[j], start[j] + s);
  }
  assert_memory_equal(acc, want, width * sizeof(int32_t));
  assert_memory_equal(acc + width, start + width, GUARD * sizeof(int32_t)); /* untouched */
  assert_memory_equal(want + width, start + width, GUARD * sizeof(int32_t));
  free(acc);
  free(want);
  free(start);
}

static const size_t qcol_ns[] = {1, 63, 64, 65, 200, 300, 2113}; /* the last: tiles of 2048 */
static const size_t qcol_ks[] = {1, 2, 5, 33, 130, 300};
static const size_t qcol_counts[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 17, 22, 31, 33, 100};
#define N_QCOL_NS (sizeof(qcol_ns) / sizeof(qcol_ns[0]))
#define N_QCOL_KS (sizeof(qcol_ks) / sizeof(qcol_ks[0]))
#define N_QCOL_COUNTS (sizeof(qcol_counts) / sizeof(qcol_counts[0]))

/* fn8 or fn4 (the other NULL) against the scalar reference: every shape of qcol_ns x qcol_ks
 * (n not a multiple of 64, k from 1, one n over the x86 variants' 2048-output tile), row strides
 * past the row bytes, weights random, at their extremes or all the most negative, d random,
 * +-extreme or all -32768, counts across the groups of the SIMD variants (idx shuffled, with
 * repeats), all outputs and a sub-range, q NULL and not; then the largest sums the bound allows. */
static void qcol_family_check(npu_qcol8_gemv_fn *fn8, npu_qcol4_gemv_fn *fn4) {
  const unsigned w_bits = fn8 != NULL ? 8 : 4;
  uint64_t rng = 61 + w_bits;
  enum { MAX_COUNT = 100 };
  int32_t idx[MAX_COUNT];
  int16_t d[MAX_COUNT];
  for (size_t in = 0; in < N_QCOL_NS; in++)
    for (size_t ik = 0; ik < N_QCOL_KS; ik++)
      for (int mode = 0; mode < 3; mode++) {
        const size_t n = qcol_ns[in], k = qcol_ks[ik];
        if (n > 1000 && k > 33) continue; /* wide outputs, few channels: enough and quick */
        const size_t extra = (size_t)rand_range(&rng, 0, 2) * (w_bits == 8 ? 64 : 32);
        struct qcol_case c;
        qcol_case_make(&c, n, k, w_bits, mode, extra, &rng);
        uint8_t *q = xmalloc(c.np); /* random block scales, 0 and 15 among them */
        for (size_t j = 0; j < c.np; j++)
          q[j] = (uint8_t)(mode == 2    ? 15
                           : j % 7 == 0 ? (int32_t)(15 * (j % 2))
                                        : rand_range(&rng, 0, 15));
        for (size_t ci = 0; ci < N_QCOL_COUNTS; ci++) {
          const size_t count = qcol_counts[ci];
          for (size_t i = 0; i < count; i++) {
            idx[i] = (int32_t)(test_rand(&rng) % k);
            d[i] = mode == 0   ? (int16_t)rand_range(&rng, INT16_MIN, INT16_MAX)
                   : mode == 1 ? (int16_t)(test_rand(&rng) & 1 ? INT16_MAX : INT16_MIN)
                               : INT16_MIN;
          }
          /* whole 64-output tiles [t0, t1) of the np / 64, possibly none */
          const int32_t tiles = (int32_t)(c.np / NPU_QCOL_NR);
          const size_t t0 = (size_t)rand_range(&rng, 0, tiles);
          const size_t t1 = t0 + (size_t)rand_range(&rng, 0, tiles - (int32_t)t0);
          const uint8_t *qs = w_bits == 4 && (ci + in + (size_t)mode) % 2 == 1 ? q : NULL;
          qcol_call_check(&c, fn8, fn4, 0, c.np, count, idx, d, qs, 1 << 29, &rng);
          qcol_call_check(&c, fn8, fn4, NPU_QCOL_NR * t0, NPU_QCOL_NR * t1, count, idx, d, qs,
                          1 << 29, &rng);
        }
        free(q);
        qcol_case_free(&c);
      }
  /* The largest sums: one channel of the most negative weight in the even outputs and the
   * largest in the odd ones, repeated, times d = -32768 (and q = 15), from acc just inside the
   * bound, so that each output ends at +-(2^31 - 1). */
  struct qcol_case c;
  qcol_case_make(&c, 130, 3, w_bits, 3, w_bits == 8 ? 64 : 32, &rng);
  const int64_t per = w_bits == 8 ? 32768 * 127 : 15 * 8 * 32768; /* the bound per channel */
  const size_t count = (size_t)((INT32_MAX - (1 << 20)) / per);
  int32_t *bidx = xmalloc(count * sizeof(int32_t));
  int16_t *bd = xmalloc(count * sizeof(int16_t));
  for (size_t i = 0; i < count; i++) bidx[i] = 1, bd[i] = INT16_MIN;
  uint8_t *q = xmalloc(c.np);
  memset(q, 15, c.np);
  const uint8_t *qs = w_bits == 4 ? q : NULL;
  int32_t *acc = xmalloc(c.np * sizeof(int32_t)), *want = xmalloc(c.np * sizeof(int32_t));
  for (size_t j = 0; j < c.np; j++) {
    const int64_t s = qcol_ref(&c, j, count, bidx, bd, qs);
    assert_true(llabs(s) < (1ll << 31));
    want[j] = s >= 0 ? INT32_MAX : -INT32_MAX;
    acc[j] = (int32_t)(want[j] - s);
  }
  if (fn8 != NULL) fn8(0, c.np, count, bidx, bd, (const int8_t *)c.cols, c.stride, acc);
  else fn4(0, c.np, count, bidx, bd, c.cols, c.stride, qs, acc);
  assert_memory_equal(acc, want, c.np * sizeof(int32_t));
  free(acc), free(want), free(q), free(bidx), free(bd);
  qcol_case_free(&c);
}

static void check_qcol8_gemv(npu_qcol8_gemv_fn *fn) { qcol_family_check(fn, NULL); }
static void check_qcol4_gemv(npu_qcol4_gemv_fn *fn) { qcol_family_check(NULL, fn); }

/* The scalar references against numbers worked out by hand, and the layout helpers. */
static void test_qcol_reference(void **state) {
  (void)state;
  assert_int_equal(npu_qcol_np(1), 64);
  assert_int_equal(npu_qcol_np(64), 64);
  assert_int_equal(npu_qcol_np(65), 128);
  assert_int_equal(npu_qcol_row_bytes(65, 8), 128);
  assert_int_equal(npu_qcol_row_bytes(65, 4), 64);
  assert_int_equal(npu_qcol_size(65, 3, 8), 3 * 128);
  assert_int_equal(npu_qcol_size(200, 7, 4), 7 * 128);
  /* 8-bit: 2 channels of 64 outputs, w[n, 0] = n - 30, w[n, 1] = -n (n < 64) */
  int8_t cols8[2 * 64];
  for (int j = 0; j < 64; j++) cols8[j] = (int8_t)(j - 30), cols8[64 + j] = (int8_t)-j;
  const int32_t idx[3] = {1, 0, 1};
  const int16_t d[3] = {-3, 100, 32767};
  int32_t acc[65];
  for (int j = 0; j < 65; j++) acc[j] = 7;
  npu_qcol8_gemv__scalar(0, 64, 3, idx, d, cols8, 64, acc);
  for (int j = 0; j < 64; j++) assert_int_equal(acc[j], 7 + 100 * (j - 30) + (32767 - 3) * -j);
  assert_int_equal(acc[64], 7);                              /* past n1 - n0: untouched */
  npu_qcol8_gemv__scalar(0, 64, 0, idx, d, cols8, 64, acc);  /* count 0: nothing */
  npu_qcol8_gemv__scalar(64, 64, 3, idx, d, cols8, 64, acc); /* an empty range: nothing */
  assert_int_equal(acc[1], 7 + 100 * -29 + 32764 * -1);
  /* 4-bit: one channel of 128 outputs, w[n] = n % 16 - 8: byte j of chunk t holds output
   * 64t + j (low nibble) and 64t + 32 + j (high) */
  uint8_t cols4[64];
  for (int t = 0; t < 2; t++)
    for (int j = 0; j < 32; j++)
      cols4[32 * t + j] = (uint8_t)((64 * t + j) % 16 | (64 * t + 32 + j) % 16 << 4);
  uint8_t q[128];
  for (int j = 0; j < 128; j++) q[j] = (uint8_t)(j % 16);
  const int32_t idx4[2] = {0, 0};
  const int16_t d4[2] = {-32768, 5};
  int32_t acc4[64 + 1];
  for (int j = 0; j < 65; j++) acc4[j] = -1;
  npu_qcol4_gemv__scalar(64, 128, 2, idx4, d4, cols4, 64, NULL, acc4);
  for (int j = 0; j < 64; j++) assert_int_equal(acc4[j], -1 + (-32768 + 5) * ((64 + j) % 16 - 8));
  assert_int_equal(acc4[64], -1);
  for (int j = 0; j < 64; j++) acc4[j] = 0;
  npu_qcol4_gemv__scalar(0, 64, 2, idx4, d4, cols4, 64, q, acc4);
  for (int j = 0; j < 64; j++) assert_int_equal(acc4[j], j % 16 * -32763 * (j % 16 - 8));
}

/* npu_qcol8_from_packed / npu_qcol4_from_packed against the row-major weights the packers took,
 * with the padding past n; then the GEMV over every channel with d = x - x_zero_point (8-bit,
 * w4a8) or d = x (w4a16, per 32-k block with its scales) against the int64 sum and, through
 * the requantization, the dense scalar GEMM on the same packed matrix. */
static void test_qcol_from_packed(void **state) {
  (void)state;
  uint64_t rng = 71;
  static const size_t ns[] = {1, 15, 16, 17, 63, 64, 65, 200, 2100}; /* the last: tiles */
  static const size_t ks[] = {1, 3, 4, 5, 8, 9, 31, 32, 33, 100, 257};
  struct npu_ukernels uk;
  npu_ukernels_select(npu_isa_detect(), &uk);
  for (size_t in = 0; in < sizeof(ns) / sizeof(ns[0]); in++)
    for (size_t ik = 0; ik < sizeof(ks) / sizeof(ks[0]); ik++)
      for (int form = 0; form < 3; form++) { /* qs8, qc4w block 0, qc4w block 32 */
        const size_t n = ns[in], k = ks[ik], np = npu_qcol_np(n), nb = (k + 31) / 32;
        if (n > 1000 && k != 9 && k != 257) continue; /* past the conversions' tiles, quickly */
        const unsigned w_bits = form == 0 ? 8 : 4;
        const size_t block = form == 2 ? NPU_QC4W_BLOCK : 0, rb = npu_qcol_row_bytes(n, w_bits);
        int8_t *w = xmalloc(n * k), *x = xmalloc(k);
        int16_t *x16 = xmalloc(k * sizeof(int16_t)), *d = xmalloc(k * sizeof(int16_t));
        uint8_t *q = xmalloc(n * nb), *q_out = xmalloc(nb * np);
        int32_t *bias = xmalloc(n * sizeof(int32_t)), *mult = xmalloc(n * sizeof(int32_t));
        int32_t *shift = xmalloc(n * sizeof(int32_t)), *idx = xmalloc(k * sizeof(int32_t));
        int32_t *acc = xmalloc(np * sizeof(int32_t)), *acc_ref = xmalloc(np * sizeof(int32_t));
        int16_t *y = xmalloc(n * sizeof(int16_t));
        const int32_t wlo = w_bits == 8 ? -127 : -8, whi = w_bits == 8 ? 127 : 7;
        for (size_t i = 0; i < n * k; i++)
          w[i] = (int8_t)(i % 11 == 0 ? (i % 2 ? whi : wlo) : rand_range(&rng, wlo, whi));
        for (size_t i = 0; i < n * nb; i++) q[i] = (uint8_t)rand_range(&rng, 0, 15);
        for (size_t j = 0; j < n; j++) {
          bias[j] = rand_range(&rng, -(1 << 29), 1 << 29);
          mult[j] = rand_range(&rng, 1 << 30, INT32_MAX);
          shift[j] = rand_range(&rng, -24, -4);
        }
        const int32_t zx = rand_range(&rng, -128, 127), zy = rand_range(&rng, -100, 100);
        for (size_t c = 0; c < k; c++) {
          x[c] = (int8_t)rand_range(&rng, -128, 127);
          x16[c] = (int16_t)rand_range(&rng, INT16_MIN, INT16_MAX);
          d[c] = (int16_t)(form == 2 ? x16[c] : x[c] - zx);
          idx[c] = (int32_t)c;
        }
        const size_t psize =
            form == 0 ? npu_qs8_gemm_packed_size(n, k) : npu_qc4w_gemm_packed_size(n, k, block);
        void *packed = xmalloc(psize);
        uint8_t *cols = xmalloc(npu_qcol_size(n, k, w_bits)); /* exactly: SAN=1 sees overruns */
        if (form == 0) {
          assert_true(npu_qs8_gemm_pack(n, k, w, bias, packed));
          assert_true(npu_qcol8_from_packed(n, k, packed, (int8_t *)cols));
        } else {
          assert_true(npu_qc4w_gemm_pack(n, k, w, bias, block, block != 0 ? q : NULL, packed));
          assert_true(npu_qcol4_from_packed(n, k, block, packed, cols, block != 0 ? q_out : NULL));
        }
        /* the channel rows: w[j, c] at output j of row c, weight 0 past n */
        for (size_t c = 0; c < k; c++)
          for (size_t j = 0; j < np; j++) {
            const uint8_t *row = cols + c * rb;
            const int32_t got = w_bits == 8 ? (int8_t)row[j]
                                            : (j % 64 < 32 ? row[j / 64 * 32 + j % 32] & 0x0F
                                                           : row[j / 64 * 32 + j % 32] >> 4) -
                                                  8;
            assert_int_equal(got, j < n ? w[j * k + c] : 0);
          }
        if (block != 0) /* the scales: q_out[b * np + j], 0 past n */
          for (size_t b = 0; b < nb; b++)
            for (size_t j = 0; j < np; j++)
              assert_int_equal(q_out[b * np + j], j < n ? q[j * nb + b] : 0);
        /* the GEMV over all channels: per 32-k block with its scales (block 32), else at once */
        memset(acc, 0, np * sizeof(int32_t));
        memset(acc_ref, 0, np * sizeof(int32_t));
        if (form == 0) {
          uk.qcol8_gemv(0, np, k, idx, d, (const int8_t *)cols, rb, acc);
          npu_qcol8_gemv__scalar(0, np, k, idx, d, (const int8_t *)cols, rb, acc_ref);
        } else if (block == 0) {
          uk.qcol4_gemv(0, np, k, idx, d, cols, rb, NULL, acc);
          npu_qcol4_gemv__scalar(0, np, k, idx, d, cols, rb, NULL, acc_ref);
        } else {
          for (size_t b = 0; b < nb; b++) {
            const size_t c0 = 32 * b, m = k - c0 < 32 ? k - c0 : 32;
            uk.qcol4_gemv(0, np, m, idx + c0, d + c0, cols, rb, q_out + b * np, acc);
            npu_qcol4_gemv__scalar(0, np, m, idx + c0, d + c0, cols, rb, q_out + b * np, acc_ref);
          }
        }
        assert_memory_equal(acc, acc_ref, np * sizeof(int32_t));
        for (size_t j = n; j < np; j++) assert_int_equal(acc[j], 0);
        for (size_t j = 0; j < n; j++) {
          int64_t s = 0;
          for (size_t c = 0; c < k; c++)
            s += (int64_t)(block != 0 ? q[j * nb + c / 32] : 1) * d[c] * w[j * k + c];
          assert_int_equal(acc[j], s);
        }
        /* the dense GEMM's output is the requantization of bias + this accumulator */
        if (form == 2) {
          const struct npu_qs16_gemm_params p = {mult, shift, 0, zy, NPU_QC4W_BLOCK};
          npu_qs16_qc4w_gemm_qs16__scalar(1, 0, n, k, x16, k, packed, y, n, &p);
        } else {
          const struct npu_qs8_gemm_params p = {mult, shift, zx, zy};
          if (form == 0) npu_qs8_gemm_qs16__scalar(1, 0, n, k, x, k, packed, y, n, &p);
          else npu_qs8_qc4w_gemm_qs16__scalar(1, 0, n, k, x, k, packed, y, n, &p);
        }
        for (size_t j = 0; j < n; j++)
          assert_int_equal(y[j], npu_requantize_s16(npu_narrow((int64_t)bias[j] + acc[j], 0),
                                                    mult[j], shift[j], zy));
        free(w), free(x), free(x16), free(d), free(q), free(q_out), free(bias), free(mult);
        free(shift), free(idx), free(acc), free(acc_ref), free(y), free(packed), free(cols);
      }
}

/* ---- dispatch ---------------------------------------------------------------------------------*/

static void test_dispatch(void **state) {
  (void)state;
  struct npu_ukernels uk;
  npu_ukernels_select(0, &uk);
  assert_true(uk.qs8_gemm == npu_qs8_gemm__scalar);
  assert_true(uk.qs8_rows_dot == npu_qs8_rows_dot__scalar);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__scalar);
  assert_true(uk.qcol4_gemv == npu_qcol4_gemv__scalar);
  assert_string_equal(npu_ukernels_variant(&uk, "qcol4_gemv"), "scalar");
  assert_true(uk.x8_lut == npu_x8_lut__scalar);
  assert_true(uk.qs8_gather_qs16 == npu_qs8_gather_qs16__scalar);
  assert_true(uk.qs16_rmsnorm_qs8 == npu_qs16_rmsnorm_qs8__scalar);
  assert_true(uk.qs16_qc4w_gemm_qs16 == npu_qs16_qc4w_gemm_qs16__scalar);
  assert_true(uk.qs16_lut == npu_qs16_lut__scalar);
#if defined(__x86_64__)
  npu_ukernels_select(NPU_ISA_AVX2, &uk);
  assert_true(uk.qs8_gemm == npu_qs8_gemm__avx2);
  assert_true(uk.qs16_vadd == npu_qs16_vadd__avx2);
  assert_true(uk.qs16_rmsnorm_qs8 == npu_qs16_rmsnorm_qs8__avx2);
  assert_true(uk.qs16_gemm_qs16 == npu_qs16_gemm_qs16__avx2);
  assert_true(uk.qs16_rmsnorm_qs16 == npu_qs16_rmsnorm_qs16__avx2);
  assert_true(uk.qs8_cols_down == npu_qs8_cols_down__avx2);
  assert_true(uk.qs8_rows_dot == npu_qs8_rows_dot__avx2);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__avx2);
  assert_true(uk.qcol4_gemv == npu_qcol4_gemv__avx2);
  npu_ukernels_select(NPU_ISA_AVX2 | NPU_ISA_AVX512VNNI, &uk);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__avx512vnni);
  assert_true(uk.qcol4_gemv == npu_qcol4_gemv__avx512vnni);
  assert_string_equal(npu_ukernels_variant(&uk, "qcol8_gemv"), "avx512vnni");
  assert_true(uk.qs8_rows_dot == npu_qs8_rows_dot__avx512vnni);
  assert_true(uk.qs8_cols_down == npu_qs8_cols_down__avx512vnni);
  assert_true(uk.qs8_qc4w_gemm == npu_qs8_qc4w_gemm__avx512vnni);
  assert_true(uk.qs16_qc4w_gemm_qs16 == npu_qs16_qc4w_gemm_qs16__avx512vnni);
  assert_true(uk.qs16_lut == npu_qs16_lut__avx2);
  assert_true(uk.qs8_gemm == npu_qs8_gemm__avx512vnni);
  assert_true(uk.qs8_gemm_qs16 == npu_qs8_gemm_qs16__avx512vnni);
  assert_true(uk.qs16_vadd == npu_qs16_vadd__avx2);
  assert_true(uk.qs16_rmsnorm_qs8 == npu_qs16_rmsnorm_qs8__avx2);
  npu_ukernels_select(NPU_ISA_AVX512VNNI, &uk); /* never detected without AVX2 */
  assert_true(uk.qs8_gemm == npu_qs8_gemm__scalar);
  assert_true(uk.qs8_rows_dot == npu_qs8_rows_dot__scalar);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__scalar);
  assert_true(uk.qcol4_gemv == npu_qcol4_gemv__scalar);
#elif defined(__aarch64__)
  assert_true((npu_isa_detect() & NPU_ISA_NEON) != 0); /* baseline on AArch64 */
  npu_ukernels_select(NPU_ISA_NEON, &uk);
  assert_true(uk.qs8_gemm == npu_qs8_gemm__neon);
  assert_true(uk.qs8_gemm_qs16 == npu_qs8_gemm_qs16__neon);
  assert_true(uk.x8_lut == npu_x8_lut__neon);
  assert_true(uk.qs16_rmsnorm_qs8 == npu_qs16_rmsnorm_qs8__neon);
  assert_true(uk.qs16_qc4w_gemm_qs16 == npu_qs16_qc4w_gemm_qs16__neon);
  assert_true(uk.qs8_rows_dot == npu_qs8_rows_dot__neon);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__neon);
  assert_true(uk.qcol4_gemv == npu_qcol4_gemv__neon);
  /* every family has a NEON variant: none is left to its scalar one */
#define NPU_UKERNEL(family, variant, isa)                                                          \
  assert_string_not_equal(npu_ukernels_variant(&uk, #family), "scalar");
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
#if NPU_NEON_DOTPROD_VARIANTS
  npu_ukernels_select(NPU_ISA_NEON | NPU_ISA_DOTPROD, &uk);
  assert_true(uk.qs8_gemm == npu_qs8_gemm__neondot);
  assert_true(uk.qs8_gemm_qs16 == npu_qs8_gemm_qs16__neondot);
  assert_true(uk.qs8_qc4w_gemm == npu_qs8_qc4w_gemm__neondot);
  assert_true(uk.qs8_qc4w_gemm_qs16 == npu_qs8_qc4w_gemm_qs16__neondot);
  assert_true(uk.qs8_qk_qs16 == npu_qs8_qk_qs16__neondot);
  assert_true(uk.qs8_cols_down == npu_qs8_cols_down__neon);
  assert_true(uk.qs8_rows_dot == npu_qs8_rows_dot__neondot);
  assert_true(uk.qs16_vadd == npu_qs16_vadd__neon);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__neon);
  assert_true(uk.qcol4_gemv == npu_qcol4_gemv__neon);
#endif
#if NPU_NEON_I8MM_VARIANTS
  npu_ukernels_select(NPU_ISA_NEON | NPU_ISA_DOTPROD | NPU_ISA_I8MM, &uk);
  assert_true(uk.qs8_gemm == npu_qs8_gemm__neoni8mm);
  assert_true(uk.qs8_qc4w_gemm_qs16 == npu_qs8_qc4w_gemm_qs16__neoni8mm);
  assert_true(uk.qs16_gemm_qs16 == npu_qs16_gemm_qs16__neon);
#endif
  npu_ukernels_select(NPU_ISA_DOTPROD, &uk); /* never detected without NEON */
  assert_true(uk.qs8_gemm == npu_qs8_gemm__scalar);
  assert_true(uk.qcol8_gemv == npu_qcol8_gemv__scalar);
#endif
  npu_ukernels_select(npu_isa_detect(), &uk);
  /* Every family is filled. */
  const void *const *fns = (const void *const *)&uk;
  for (size_t i = 0; i < sizeof(uk) / sizeof(void *); i++) assert_non_null(fns[i]);
}

/* ---- one test per variant, from the list ------------------------------------------------------*/

#define NPU_UKERNEL(family, variant, isa)                                                          \
  static void test_##family##__##variant(void **state) {                                           \
    (void)state;                                                                                   \
    require_isa(isa);                                                                              \
    check_##family(npu_##family##__##variant);                                                     \
  }
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_requantize_ties),
      cmocka_unit_test(test_requantize_extremes),
      cmocka_unit_test(test_requantize_random),
      cmocka_unit_test(test_quantize_multiplier),
      cmocka_unit_test(test_quantize_weights),
      cmocka_unit_test(test_quantize_activations),
      cmocka_unit_test(test_lut_build_silu),
      cmocka_unit_test(test_gemm_pack),
      cmocka_unit_test(test_gemm_unpack_row),
      cmocka_unit_test(test_matmul_group),
      cmocka_unit_test(test_gemm_vs_float),
      cmocka_unit_test(test_dispatch),
      cmocka_unit_test(test_softmax_vs_float),
      cmocka_unit_test(test_rmsnorm_vs_float),
      cmocka_unit_test(test_narrow),
      cmocka_unit_test(test_qc4w_pack),
      cmocka_unit_test(test_lut_s16_build_silu),
      cmocka_unit_test(test_bundle_reference),
      cmocka_unit_test(test_qcol_reference),
      cmocka_unit_test(test_qcol_from_packed),
#define NPU_UKERNEL(family, variant, isa) cmocka_unit_test(test_##family##__##variant),
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
