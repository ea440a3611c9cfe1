/* CPU float kernels: every variant of src/kernels/cpu/cpu_ukernels.inc that this CPU can run
 * against its family's scalar variant, bit for bit (memcmp), on random data and awkward shapes: k =
 * 1, sizes and head dims that are not a multiple of the 8-lane vector (nor of the 32-wide PV
 * blocks), one row and row counts that leave tile edges, grouped heads, padded rows and long
 * contexts over several attention tiles. Bit-exactness is the kernels' contract
 * (kernels/cpu/kernels.h: every element in the reference forward's order of operations, no FMA), so
 * no tolerance is needed anywhere; test_graph.c checks the scalar variants against the reference
 * itself. The conversions to and from the NPU's int8/int16 activations likewise, byte for byte,
 * with the bytes past the end checked untouched: every length from 0 to 40 (each remainder modulo
 * the 8 lanes), scales from the smallest subnormal to the largest float, zero points at the type's
 * ends, values on and next to the half-way points, past saturation, NaN, infinities and signed
 * zeros. Also the dispatch. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "test_util.h"

/* ---- helpers ----------------------------------------------------------------------------------*/

static float rand_float(uint64_t *rng, float scale) {
  return (float)((int)(test_rand(rng) % 20001) - 10000) / 10000.0f * scale;
}

static float *rand_floats(size_t n, uint64_t *rng, float scale) {
  float *x = malloc((n > 0 ? n : 1) * sizeof(float));
  assert_non_null(x);
  for (size_t i = 0; i < n; i++) x[i] = rand_float(rng, scale);
  return x;
}

/* Two output buffers filled with the same NaN pattern: what a kernel leaves unwritten compares
 * equal, what it writes is compared. */
static void nan_pair(size_t n, float **a_out, float **b_out) {
  *a_out = malloc((n > 0 ? n : 1) * sizeof(float));
  *b_out = malloc((n > 0 ? n : 1) * sizeof(float));
  assert_non_null(*a_out);
  assert_non_null(*b_out);
  for (size_t i = 0; i < n; i++) (*a_out)[i] = (*b_out)[i] = NAN;
}

static void require_isa(uint32_t need) {
  if ((need & ~npu_isa_detect()) != 0) {
    print_message("CPU lacks the variant's instruction set: skipped\n");
    skip();
  }
}

static void assert_same_bits(const float *got, const float *want, size_t n, const char *what,
                             const char *variant, int trial) {
  if (memcmp(got, want, n * sizeof(float)) != 0) {
    size_t i = 0;
    while (memcmp(got + i, want + i, sizeof(float)) == 0) i++;
    fail_msg("%s__%s trial %d: element %zu is %a, the scalar variant's %a", what, variant, trial, i,
             (double)got[i], (double)want[i]);
  }
}

/* ---- one check per family ---------------------------------------------------------------------*/

static void check_f32_matmul(npu_f32_matmul_fn *fn, const char *variant) {
  uint64_t rng = 1;
  /* rows around the 4-token and 2-row tiles, k = 1 and k % 8 != 0, n around 8 and past a tile */
  const int32_t shapes[][3] = {{1, 1, 1},   {1, 1, 9}, {3, 1, 5},   {4, 7, 3},
                               {5, 8, 17},  {7, 9, 8}, {8, 16, 15}, {9, 33, 31},
                               {1, 100, 7}, {2, 3, 1}, {6, 64, 24}, {13, 300, 130}};
  for (int trial = 0; trial < (int)(sizeof(shapes) / sizeof(shapes[0])); trial++) {
    const int32_t rows = shapes[trial][0], k = shapes[trial][1], n = shapes[trial][2];
    float *x = rand_floats((size_t)rows * (size_t)k, &rng, 2.0f);
    float *w = rand_floats((size_t)n * (size_t)k, &rng, 1.0f);
    float *bias = rand_floats((size_t)n, &rng, 10.0f);
    float *got, *want;
    nan_pair((size_t)rows * (size_t)n, &got, &want);
    const float *b = trial % 2 ? bias : NULL;
    npu_f32_matmul__scalar(want, x, w, b, rows, k, n);
    fn(got, x, w, b, rows, k, n);
    assert_same_bits(got, want, (size_t)rows * (size_t)n, "f32_matmul", variant, trial);
    free(x), free(w), free(bias), free(got), free(want);
  }
}

static void check_f32_rope(npu_f32_rope_fn *fn, const char *variant) {
  uint64_t rng = 2;
  const int32_t dims[][2] = {{2, 2}, {8, 8}, {8, 6}, {10, 10}, {64, 64}, {64, 40}, {72, 66}};
  int trial = 0;
  for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++) {
    for (int type = 0; type < 2; type++, trial++) {
      const struct npu_config c = {.head_dim = dims[d][0],
                                   .rope_dim = dims[d][1],
                                   .rope_base = 10000.0f,
                                   .rope_type = type ? NPU_ROPE_NEOX : NPU_ROPE_NORM};
      const int32_t rows = 1 + trial % 5, heads = 1 + trial % 3, pos0 = 3 * trial,
                    half = c.rope_dim / 2;
      const size_t n = (size_t)rows * (size_t)heads * (size_t)c.head_dim;
      const size_t n_tab = (size_t)(pos0 + rows) * (size_t)half;
      float *cs = malloc(n_tab * sizeof(float)), *sn = malloc(n_tab * sizeof(float));
      assert_non_null(cs);
      assert_non_null(sn);
      npu_f32_rope_table(cs, sn, pos0 + rows, &c, NULL);
      float *x = rand_floats(n, &rng, 3.0f), *got, *want;
      nan_pair(n, &got, &want);
      npu_f32_rope__scalar(want, x, cs, sn, &c, rows, heads, pos0);
      fn(got, x, cs, sn, &c, rows, heads, pos0);
      assert_same_bits(got, want, n, "f32_rope", variant, trial);
      free(cs), free(sn), free(x), free(got), free(want);
    }
  }
}

/* An attention case: heads, grouping, head dim, rows and where the step sits in the cache. */
struct attn_shape {
  int32_t heads, kv_heads, hd, rows, pos0, n_valid;
};

static const struct attn_shape attn_shapes[] = {
    {1, 1, 1, 1, 0, 1},     {1, 1, 8, 1, 5, 1},    {2, 1, 3, 2, 0, 2},    {4, 2, 12, 6, 9, 4},
    {4, 4, 40, 3, 1, 3},    {8, 2, 33, 5, 70, 5},  {2, 2, 64, 1, 200, 1}, {6, 3, 7, 9, 2, 6},
    {4, 1, 32, 17, 30, 17}, {3, 3, 17, 2, 129, 1},
};
#define N_ATTN_SHAPES ((int)(sizeof(attn_shapes) / sizeof(attn_shapes[0])))

/* q [rows, heads * hd] and caches of ctx = pos0 + n_valid rows (the rows past the step's keys
 * are never read: there are none). */
struct attn_data {
  float *q, *k, *v;
  int32_t ctx;
  float scale;
};

static struct attn_data attn_data_make(const struct attn_shape *a, uint64_t *rng) {
  struct attn_data d;
  d.ctx = a->pos0 + a->n_valid;
  d.q = rand_floats((size_t)a->rows * (size_t)(a->heads * a->hd), rng, 1.0f);
  d.k = rand_floats((size_t)d.ctx * (size_t)(a->kv_heads * a->hd), rng, 1.0f);
  d.v = rand_floats((size_t)d.ctx * (size_t)(a->kv_heads * a->hd), rng, 1.0f);
  d.scale = 1.0f / sqrtf((float)a->hd);
  return d;
}

static void attn_data_free(struct attn_data *d) { free(d->q), free(d->k), free(d->v); }

static void check_f32_qk(npu_f32_qk_fn *fn, const char *variant) {
  uint64_t rng = 3;
  for (int trial = 0; trial < N_ATTN_SHAPES; trial++) {
    const struct attn_shape *a = &attn_shapes[trial];
    struct attn_data d = attn_data_make(a, &rng);
    const int32_t ctx = d.ctx + trial % 3; /* a bucket a little longer than the keys */
    const size_t n = (size_t)a->heads * (size_t)a->rows * (size_t)ctx;
    float *got, *want;
    nan_pair(n, &got, &want);
    npu_f32_qk__scalar(want, d.q, d.k, a->heads, a->kv_heads, a->hd, a->rows, ctx, a->pos0,
                       a->n_valid, d.scale);
    fn(got, d.q, d.k, a->heads, a->kv_heads, a->hd, a->rows, ctx, a->pos0, a->n_valid, d.scale);
    assert_same_bits(got, want, n, "f32_qk", variant, trial);
    attn_data_free(&d), free(got), free(want);
  }
}

static void check_f32_pv(npu_f32_pv_fn *fn, const char *variant) {
  uint64_t rng = 4;
  for (int trial = 0; trial < N_ATTN_SHAPES; trial++) {
    const struct attn_shape *a = &attn_shapes[trial];
    struct attn_data d = attn_data_make(a, &rng);
    const int32_t ctx = d.ctx;
    float *p = rand_floats((size_t)a->heads * (size_t)a->rows * (size_t)ctx, &rng, 1.0f);
    const size_t n = (size_t)a->rows * (size_t)(a->heads * a->hd);
    float *got, *want;
    nan_pair(n, &got, &want);
    npu_f32_pv__scalar(want, p, d.v, a->heads, a->kv_heads, a->hd, a->rows, ctx, a->pos0,
                       a->n_valid);
    fn(got, p, d.v, a->heads, a->kv_heads, a->hd, a->rows, ctx, a->pos0, a->n_valid);
    assert_same_bits(got, want, n, "f32_pv", variant, trial);
    attn_data_free(&d), free(p), free(got), free(want);
  }
}

static void check_f32_attention(npu_f32_attention_fn *fn, const char *variant) {
  uint64_t rng = 5;
  for (int trial = 0; trial < N_ATTN_SHAPES; trial++) {
    const struct attn_shape *a = &attn_shapes[trial];
    struct attn_data d = attn_data_make(a, &rng);
    const size_t n = (size_t)a->rows * (size_t)(a->heads * a->hd);
    float *got, *want;
    nan_pair(n, &got, &want);
    npu_f32_attention__scalar(want, d.q, d.k, d.v, a->heads, a->kv_heads, a->hd, a->rows, a->pos0,
                              a->n_valid, d.scale);
    fn(got, d.q, d.k, d.v, a->heads, a->kv_heads, a->hd, a->rows, a->pos0, a->n_valid, d.scale);
    assert_same_bits(got, want, n, "f32_attention", variant, trial);
    attn_data_free(&d), free(got), free(want);
  }
}

static void check_f32_attention_tiles(npu_f32_attention_tiles_fn *fn, const char *variant) {
  uint64_t rng = 6;
  for (int trial = 0; trial < N_ATTN_SHAPES; trial++) {
    const struct attn_shape *a = &attn_shapes[trial];
    struct attn_data d = attn_data_make(a, &rng);
    const int32_t len = d.ctx, units = npu_attn_tiles(len) * a->heads;
    const size_t n = (size_t)units * (size_t)(a->hd + 2);
    float *got, *want;
    nan_pair(n, &got, &want);
    /* the last query row, units in two ranges (a cut as threads take them) */
    const float *q = d.q + (size_t)(a->rows - 1) * (size_t)(a->heads * a->hd);
    const int32_t cut = units / 2;
    npu_f32_attention_tiles__scalar(want, q, d.k, d.v, a->heads, a->kv_heads, a->hd, len, 0, units,
                                    d.scale);
    fn(got, q, d.k, d.v, a->heads, a->kv_heads, a->hd, len, cut, units, d.scale);
    fn(got, q, d.k, d.v, a->heads, a->kv_heads, a->hd, len, 0, cut, d.scale);
    assert_same_bits(got, want, n, "f32_attention_tiles", variant, trial);
    attn_data_free(&d), free(got), free(want);
  }
}

/* ---- the conversions: one driver for the four families ---------------------------------------*/

enum { CONV_N = 300, CONV_GUARD = 8, CONV_TRIALS = 400 };

static int32_t rand_range(uint64_t *rng, int32_t lo, int32_t hi) { /* inclusive */
  return lo + (int32_t)(test_rand(rng) % (uint64_t)((int64_t)hi - lo + 1));
}

static double rand_unit(uint64_t *rng) { return (double)(test_rand(rng) >> 11) * 0x1p-53; }

enum conv_kind { CONV_QUANTIZE_S8, CONV_QUANTIZE_S16, CONV_DEQUANTIZE_S8, CONV_DEQUANTIZE_S16 };

union conv_fn {
  npu_quantize_s8_fn *quantize_s8;
  npu_quantize_s16_fn *quantize_s16;
  npu_dequantize_s8_fn *dequantize_s8;
  npu_dequantize_s16_fn *dequantize_s16;
};

/* One trial's input: floats to quantize, or codes to dequantize, with the scale and zero point. */
struct conv_trial {
  size_t n;
  float scale;
  int32_t zero_point;
  float x[CONV_N];
  int8_t q8[CONV_N];
  int16_t q16[CONV_N];
};

/* Trial 'trial' of a conversion into or out of [qmin, qmax]: every length up to 40, then any up
 * to CONV_N; the type's end zero points and 0 by turns; every seventh scale an extreme of float
 * (x / scale then overflows to infinity or underflows to 0), the others 2^-21 .. 2^5. */
static void conv_trial_make(struct conv_trial *t, int trial, int32_t qmin, int32_t qmax,
                            uint64_t *rng) {
  static const float extreme_scale[] = {0x1p-149f, FLT_MIN, 1e-30f, 1.0f, 1e30f, FLT_MAX};
  static const float special[] = {NAN,    INFINITY, -INFINITY, 0.0f,      -0.0f,     1e30f,
                                  -1e30f, FLT_MAX,  -FLT_MAX,  0x1p-149f, -0x1p-149f};
  t->n = trial <= 40 ? (size_t)trial : (size_t)rand_range(rng, 0, CONV_N);
  t->scale = trial % 7 == 6 ? extreme_scale[(trial / 7) % 6]
                            : (float)ldexp(0.5 + rand_unit(rng), rand_range(rng, -20, 4));
  const int32_t zp[] = {qmin, qmax, 0, rand_range(rng, qmin, qmax)};
  t->zero_point = zp[trial % 4];
  for (size_t i = 0; i < CONV_N; i++) {
    /* codes past both ends of int16, on or next to a half-way point */
    const double code = rand_range(rng, -40000, 40000) + 0.5 * rand_range(rng, -1, 1);
    switch (test_rand(rng) % 8) {
    case 0: t->x[i] = (float)(code * t->scale); break;
    case 1: t->x[i] = nextafterf((float)(code * t->scale), INFINITY); break;
    case 2: t->x[i] = nextafterf((float)(code * t->scale), -INFINITY); break;
    case 3: t->x[i] = special[test_rand(rng) % (sizeof(special) / sizeof(special[0]))]; break;
    default: t->x[i] = (float)((rand_unit(rng) * 2.0 - 1.0) * 300.0 * t->scale);
    }
    /* codes at the type's ends now and then */
    const uint64_t end = test_rand(rng) % 8;
    t->q8[i] = (int8_t)(end == 0 ? INT8_MIN : end == 1 ? INT8_MAX : rand_range(rng, -128, 127));
    t->q16[i] = (int16_t)(end == 0   ? INT16_MIN
                          : end == 1 ? INT16_MAX
                                     : rand_range(rng, INT16_MIN, INT16_MAX));
  }
}

static void conv_run(enum conv_kind kind, union conv_fn fn, const struct conv_trial *t, void *out) {
  switch (kind) {
  case CONV_QUANTIZE_S8: fn.quantize_s8(t->x, t->n, t->scale, t->zero_point, out); break;
  case CONV_QUANTIZE_S16: fn.quantize_s16(t->x, t->n, t->scale, t->zero_point, out); break;
  case CONV_DEQUANTIZE_S8: fn.dequantize_s8(t->q8, t->n, t->scale, t->zero_point, out); break;
  case CONV_DEQUANTIZE_S16: fn.dequantize_s16(t->q16, t->n, t->scale, t->zero_point, out); break;
  }
}

/* 'fn' against 'scalar' on every trial: the n outputs and CONV_GUARD elements past them (which
 * neither may write), byte for byte. */
static void check_conversion(enum conv_kind kind, union conv_fn fn, union conv_fn scalar,
                             const char *family, const char *variant) {
  const bool s8 = kind == CONV_QUANTIZE_S8 || kind == CONV_DEQUANTIZE_S8;
  const int32_t qmin = s8 ? INT8_MIN : INT16_MIN, qmax = s8 ? INT8_MAX : INT16_MAX;
  const size_t size = kind == CONV_QUANTIZE_S8 ? 1 : kind == CONV_QUANTIZE_S16 ? 2 : 4;
  static struct conv_trial t;
  unsigned char got[(CONV_N + CONV_GUARD) * 4], want[(CONV_N + CONV_GUARD) * 4];
  uint64_t rng = 7;
  for (int trial = 0; trial < CONV_TRIALS; trial++) {
    conv_trial_make(&t, trial, qmin, qmax, &rng);
    memset(got, 0xA5, sizeof(got));
    memset(want, 0xA5, sizeof(want));
    conv_run(kind, scalar, &t, want);
    conv_run(kind, fn, &t, got);
    const size_t bytes = (t.n + CONV_GUARD) * size;
    if (memcmp(got, want, bytes) != 0) {
      size_t i = 0;
      while (got[i] == want[i]) i++;
      fail_msg("%s__%s trial %d (n %zu, scale %a, zero point %d): element %zu differs from the "
               "scalar variant's",
               family, variant, trial, t.n, (double)t.scale, t.zero_point, i / size);
    }
  }
}

static void check_quantize_s8(npu_quantize_s8_fn *fn, const char *variant) {
  check_conversion(CONV_QUANTIZE_S8, (union conv_fn){.quantize_s8 = fn},
                   (union conv_fn){.quantize_s8 = npu_quantize_s8__scalar}, "quantize_s8", variant);
}

static void check_quantize_s16(npu_quantize_s16_fn *fn, const char *variant) {
  check_conversion(CONV_QUANTIZE_S16, (union conv_fn){.quantize_s16 = fn},
                   (union conv_fn){.quantize_s16 = npu_quantize_s16__scalar}, "quantize_s16",
                   variant);
}

static void check_dequantize_s8(npu_dequantize_s8_fn *fn, const char *variant) {
  check_conversion(CONV_DEQUANTIZE_S8, (union conv_fn){.dequantize_s8 = fn},
                   (union conv_fn){.dequantize_s8 = npu_dequantize_s8__scalar}, "dequantize_s8",
                   variant);
}

static void check_dequantize_s16(npu_dequantize_s16_fn *fn, const char *variant) {
  check_conversion(CONV_DEQUANTIZE_S16, (union conv_fn){.dequantize_s16 = fn},
                   (union conv_fn){.dequantize_s16 = npu_dequantize_s16__scalar}, "dequantize_s16",
                   variant);
}

/* ---- dispatch ---------------------------------------------------------------------------------*/

static void test_dispatch(void **state) {
  (void)state;
  struct npu_cpu_ukernels uk;
  npu_cpu_ukernels_select(0, &uk);
  assert_true(uk.f32_matmul == npu_f32_matmul__scalar);
  assert_true(uk.f32_attention_tiles == npu_f32_attention_tiles__scalar);
  assert_true(uk.quantize_s8 == npu_quantize_s8__scalar);
  assert_true(uk.dequantize_s16 == npu_dequantize_s16__scalar);
  assert_string_equal(npu_cpu_ukernels_variant(&uk, "f32_qk"), "scalar");
  assert_string_equal(npu_cpu_ukernels_variant(&uk, "no_such_family"), "?");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  npu_cpu_ukernels_select(NPU_ISA_AVX2, &uk);
  assert_true(uk.f32_matmul == npu_f32_matmul__avx2);
  assert_true(uk.f32_rope == npu_f32_rope__avx2);
  assert_true(uk.quantize_s16 == npu_quantize_s16__avx2);
  assert_true(uk.dequantize_s8 == npu_dequantize_s8__avx2);
  assert_string_equal(npu_cpu_ukernels_variant(&uk, "f32_attention"), "avx2");
#endif
  npu_cpu_ukernels_select(npu_isa_detect(), &uk);
  /* every family is filled */
  const void *const *fns = (const void *const *)&uk;
  for (size_t i = 0; i < sizeof(uk) / sizeof(void *); i++) assert_non_null(fns[i]);
}

/* ---- one test per variant, from the list ------------------------------------------------------*/

#define CPU_UKERNEL(family, variant, isa)                                                          \
  static void test_##family##__##variant(void **state) {                                           \
    (void)state;                                                                                   \
    require_isa(isa);                                                                              \
    check_##family(npu_##family##__##variant, #variant);                                           \
  }
#include "kernels/cpu/cpu_ukernels.inc"
#undef CPU_UKERNEL

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dispatch),
#define CPU_UKERNEL(family, variant, isa) cmocka_unit_test(test_##family##__##variant),
#include "kernels/cpu/cpu_ukernels.inc"
#undef CPU_UKERNEL
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
