/* Microbenchmark of the NPU integer kernels, one core: every variant of the GEMM on prefill and
 * decode shapes (GOPS = 2*M*N*K / time, median of several runs), then the element-wise kernels
 * (elements per second), then the neuron-bundle kernels of sparse decode (GB/s of bundle bytes
 * read), then the input-sparse GEMVs against the dense GEMV on the same matrix (GB/s of weight
 * bytes read). Usage: npu_kernels [runs (default 11)] [variant: only that variant of the
 * int4-weight / int16-activation GEMMs; "sparse": only the sparse decode kernels] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/npu/npu_ukernels.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median and minimum over 'runs' of the seconds per call of 'body', each run at least ~10 ms
 * long (the minimum is the robust figure on a shared machine). */
#define TIME_MEDIAN(runs, result, best, body)                                                      \
  do {                                                                                             \
    double ts_[64];                                                                                \
    long iters_ = 1;                                                                               \
    for (;;) { /* calibrate */                                                                     \
      const double t0_ = npu_now();                                                                \
      for (long i_ = 0; i_ < iters_; i_++) {                                                       \
        body;                                                                                      \
      }                                                                                            \
      if (npu_now() - t0_ > 0.01) break;                                                           \
      iters_ *= 2;                                                                                 \
    }                                                                                              \
    for (int r_ = 0; r_ < (runs); r_++) {                                                          \
      const double t0_ = npu_now();                                                                \
      for (long i_ = 0; i_ < iters_; i_++) {                                                       \
        body;                                                                                      \
      }                                                                                            \
      ts_[r_] = (npu_now() - t0_) / (double)iters_;                                                \
    }                                                                                              \
    qsort(ts_, (size_t)(runs), sizeof(double), cmp_double);                                        \
    (result) = ts_[(runs) / 2];                                                                    \
    (best) = ts_[0];                                                                               \
  } while (0)

static void bench_gemm(int runs, size_t m, size_t n, size_t k) {
  int8_t *x = malloc(m * k), *w = malloc(n * k), *y = malloc(m * n);
  int32_t *mult = malloc(n * sizeof(int32_t)), *shift = malloc(n * sizeof(int32_t));
  void *packed = malloc(npu_qs8_gemm_packed_size(n, k));
  for (size_t i = 0; i < m * k; i++) x[i] = (int8_t)rnd();
  for (size_t i = 0; i < n * k; i++) w[i] = (int8_t)(rnd() % 255 - 127);
  for (size_t j = 0; j < n; j++) {
    mult[j] = (1 << 30) + (int32_t)(rnd() % (1u << 30));
    shift[j] = -14;
  }
  if (!npu_qs8_gemm_pack(n, k, w, NULL, packed)) {
    fprintf(stderr, "pack failed\n");
    exit(1);
  }
  const struct npu_qs8_gemm_params p = {mult, shift, -3, 5};
  const uint32_t have = npu_isa_detect();
  const double ops = 2.0 * (double)m * (double)n * (double)k;
  /* Every variant of the family in npu_ukernels.inc (the others' pointers are only compared, never
   * called through the wrong type). */
  const struct {
    const char *family, *name;
    uint32_t isa;
    void (*fn)(void);
  } vs[] = {
#define NPU_UKERNEL(family, variant, need)                                                         \
  {#family, #variant, need, (void (*)(void))npu_##family##__##variant},
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
  };
  for (size_t v = 0; v < sizeof(vs) / sizeof(vs[0]); v++) {
    if (strcmp(vs[v].family, "qs8_gemm") != 0 || (vs[v].isa & ~have) != 0) continue;
    npu_qs8_gemm_fn *fn = (npu_qs8_gemm_fn *)vs[v].fn;
    double t, tb;
    TIME_MEDIAN(runs, t, tb, fn(m, 0, n, k, x, k, packed, y, n, &p));
    printf("| qs8_gemm__%-10s | %5zu | %5zu | %5zu | %9.2f | %8.1f | %8.1f |\n", vs[v].name, m, n,
           k, t * 1e6, ops / t * 1e-9, ops / tb * 1e-9);
  }
  free(x), free(w), free(y), free(mult), free(shift), free(packed);
}

/* Every variant in npu_ukernels.inc (the others' pointers are only compared, never called through
 * the wrong type). */
static const struct {
  const char *family, *name;
  uint32_t isa;
  void (*fn)(void);
} variants[] = {
#define NPU_UKERNEL(family, variant, need)                                                         \
  {#family, #variant, need, (void (*)(void))npu_##family##__##variant},
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
};

/* The int4-weight and int16-activation GEMMs (w4a8: qs8_qc4w_gemm; w8a16: qs16_gemm_qs16; w4a16:
 * qs16_qc4w_gemm_qs16 per channel and with 32-k block scales), every variant. */
static void bench_gemm_w4a16(int runs, size_t m, size_t n, size_t k, const char *only) {
  int8_t *x8 = malloc(m * k), *w8 = malloc(n * k), *w4 = malloc(n * k), *y8 = malloc(m * n);
  int16_t *x16 = malloc(m * k * sizeof(int16_t)), *y16 = malloc(m * n * sizeof(int16_t));
  const size_t nb = (k + 31) / 32;
  uint8_t *q = malloc(n * nb);
  int32_t *mult = malloc(n * sizeof(int32_t)), *shift = malloc(n * sizeof(int32_t));
  void *p8 = malloc(npu_qs8_gemm_packed_size(n, k)),
       *p4 = malloc(npu_qc4w_gemm_packed_size(n, k, 0));
  void *p4b = malloc(npu_qc4w_gemm_packed_size(n, k, 32));
  for (size_t i = 0; i < m * k; i++) x8[i] = (int8_t)rnd(), x16[i] = (int16_t)rnd();
  for (size_t i = 0; i < n * k; i++)
    w8[i] = (int8_t)(rnd() % 255 - 127), w4[i] = (int8_t)(rnd() % 16 - 8);
  for (size_t i = 0; i < n * nb; i++) q[i] = (uint8_t)(rnd() % 16);
  for (size_t j = 0; j < n; j++) {
    mult[j] = (1 << 30) + (int32_t)(rnd() % (1u << 30));
    shift[j] = -14;
  }
  if (!npu_qs8_gemm_pack(n, k, w8, NULL, p8) || !npu_qc4w_gemm_pack(n, k, w4, NULL, 0, NULL, p4) ||
      !npu_qc4w_gemm_pack(n, k, w4, NULL, 32, q, p4b)) {
    fprintf(stderr, "pack failed\n");
    exit(1);
  }
  const struct npu_qs8_gemm_params p = {mult, shift, -3, 5};
  const struct npu_qs16_gemm_params p16 = {mult, shift, 8, 0, 0}, p16b = {mult, shift, 10, 0, 32};
  const uint32_t have = npu_isa_detect();
  const double ops = 2.0 * (double)m * (double)n * (double)k;
  for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
    if ((variants[v].isa & ~have) != 0) continue;
    if (only != NULL && strcmp(variants[v].name, only) != 0) continue;
    const char *f = variants[v].family;
    double t, tb;
    char name[64];
    if (strcmp(f, "qs8_qc4w_gemm") == 0) {
      npu_qs8_gemm_fn *fn = (npu_qs8_gemm_fn *)variants[v].fn;
      TIME_MEDIAN(runs, t, tb, fn(m, 0, n, k, x8, k, p4, y8, n, &p));
    } else if (strcmp(f, "qs16_gemm_qs16") == 0) {
      npu_qs16_gemm_qs16_fn *fn = (npu_qs16_gemm_qs16_fn *)variants[v].fn;
      TIME_MEDIAN(runs, t, tb, fn(m, 0, n, k, x16, k, p8, y16, n, &p16));
    } else if (strcmp(f, "qs16_qc4w_gemm_qs16") == 0) {
      npu_qs16_gemm_qs16_fn *fn = (npu_qs16_gemm_qs16_fn *)variants[v].fn;
      TIME_MEDIAN(runs, t, tb, fn(m, 0, n, k, x16, k, p4, y16, n, &p16));
      snprintf(name, sizeof(name), "w4a16__%s", variants[v].name);
      printf("| %-26s | %5zu | %5zu | %5zu | %9.2f | %8.1f | %8.1f |\n", name, m, n, k, t * 1e6,
             ops / t * 1e-9, ops / tb * 1e-9);
      TIME_MEDIAN(runs, t, tb, fn(m, 0, n, k, x16, k, p4b, y16, n, &p16b));
      snprintf(name, sizeof(name), "w4a16-block__%s", variants[v].name);
      printf("| %-26s | %5zu | %5zu | %5zu | %9.2f | %8.1f | %8.1f |\n", name, m, n, k, t * 1e6,
             ops / t * 1e-9, ops / tb * 1e-9);
      continue;
    } else {
      continue;
    }
    snprintf(name, sizeof(name), "%s__%s", strcmp(f, "qs8_qc4w_gemm") == 0 ? "w4a8" : "w8a16",
             variants[v].name);
    printf("| %-26s | %5zu | %5zu | %5zu | %9.2f | %8.1f | %8.1f |\n", name, m, n, k, t * 1e6,
           ops / t * 1e-9, ops / tb * 1e-9);
  }
  free(x8), free(w8), free(w4), free(y8), free(x16), free(y16), free(q), free(mult), free(shift);
  free(p8), free(p4), free(p4b);
}

static void bench_elementwise(int runs) {
  enum { N = 1 << 16 };
  int8_t *a = malloc(N), *b = malloc(N), *y = malloc(N), table[256];
  int32_t ids[64], mult[512], shift[512];
  int8_t *emb = malloc(512 * 768);
  for (size_t i = 0; i < N; i++) {
    a[i] = (int8_t)rnd();
    b[i] = (int8_t)rnd();
  }
  for (int i = 0; i < 256; i++) table[i] = (int8_t)rnd();
  for (int i = 0; i < 512 * 768; i++) emb[i] = (int8_t)(rnd() % 255 - 127);
  for (int i = 0; i < 512; i++) {
    mult[i] = 1 << 30;
    shift[i] = -1;
  }
  for (int i = 0; i < 64; i++) ids[i] = (int32_t)(rnd() % 512);
  int8_t *gy = malloc(64 * 768);
  const struct npu_qadd_params ap = {3, -7, 20, 1 << 30, -1, 1500000000, -2, 1 << 30, -19, 4};
  const struct npu_qmul_params mp = {3, -7, 1 << 30, -8, 1};
  const struct npu_qs8_gather_params gp = {mult, shift, 0};
  int16_t table16[NPU_QS16_LUT_SIZE];
  for (int i = 0; i < NPU_QS16_LUT_SIZE; i++) table16[i] = (int16_t)rnd();
  int32_t *rmult = malloc(2048 * sizeof(int32_t));
  for (int i = 0; i < 2048; i++) rmult[i] = (1 << 30) + (int32_t)(rnd() % (1u << 30));
  const struct npu_qs16_rmsnorm_params rp = {rmult, 1000, 20, 0};
  const uint32_t have = npu_isa_detect();
  const uint32_t isas[2] = {0, have};
  for (int v = 0; v < (have != 0 ? 2 : 1); v++) {
    const uint32_t isa = isas[v];
    struct npu_ukernels uk;
    npu_ukernels_select(isa, &uk);
    const char *name = isa ? "avx2" : "scalar";
    double t, tb;
    TIME_MEDIAN(runs, t, tb, uk.qs8_vadd(N, a, b, y, &ap));
    printf("| qs8_vadd__%-10s | %8.0f | %8.0f |\n", name, N / t * 1e-6, N / tb * 1e-6);
    TIME_MEDIAN(runs, t, tb, uk.qs8_vmul(N, a, b, y, &mp));
    printf("| qs8_vmul__%-10s | %8.0f | %8.0f |\n", name, N / t * 1e-6, N / tb * 1e-6);
    TIME_MEDIAN(runs, t, tb, uk.x8_lut(N, a, y, table));
    printf("| x8_lut__%-12s | %8.0f | %8.0f |\n", name, N / t * 1e-6, N / tb * 1e-6);
    TIME_MEDIAN(runs, t, tb, uk.qs8_gather(64, ids, 512, 768, emb, gy, 768, &gp));
    printf("| qs8_gather__%-8s | %8.0f | %8.0f |\n", name, 64 * 768 / t * 1e-6,
           64 * 768 / tb * 1e-6);
    TIME_MEDIAN(runs, t, tb, uk.qs16_lut(N / 2, (const int16_t *)a, (int16_t *)y, table16));
    printf("| qs16_lut__%-10s | %8.0f | %8.0f |\n", name, N / 2 / t * 1e-6, N / 2 / tb * 1e-6);
    TIME_MEDIAN(runs, t, tb, uk.qs16_rmsnorm_qs16(16, 2048, (const int16_t *)a, (int16_t *)y, &rp));
    printf("| qs16_rmsnorm_qs16__%-1s | %8.0f | %8.0f |\n", name, N / 2 / t * 1e-6,
           N / 2 / tb * 1e-6);
  }
  free(a), free(b), free(y), free(emb), free(gy), free(rmult);
}

/* The kernels of sparse decode on a 4096-neuron layer of width k (k = 2048: 24 MiB of bundles,
 * all of them in a shuffled order, so each call streams them from memory; k = 512: 6 MiB, in L3,
 * where compute matters more), in GB/s of bundle bytes read (down: kp per bundle; rows dot: kp per
 * row, the gate rows of the 4096 bundles in a shuffled order), every variant this CPU runs. */
static void bench_bundles(int runs, size_t k) {
  const size_t count = 4096, kp = npu_bundle_kp(k);
  int8_t *base = aligned_alloc(64, count * 3 * kp), *x = malloc(k);
  const int8_t **ptrs = malloc(count * sizeof(*ptrs));
  int32_t *acc = malloc(count * sizeof(int32_t)), *coef = malloc(count * sizeof(int32_t));
  int32_t *y = calloc(k, sizeof(int32_t));
  for (size_t i = 0; i < count * 3 * kp; i++) base[i] = (int8_t)(rnd() % 255 - 127);
  for (size_t c = 0; c < k; c++) x[c] = (int8_t)rnd();
  for (size_t i = 0; i < count; i++) {
    ptrs[i] = base + i * 3 * kp;
    coef[i] = (int32_t)(rnd() % 511) - 255;
  }
  for (size_t i = count - 1; i > 0; i--) {
    const size_t j = rnd() % (i + 1);
    const int8_t *t = ptrs[i];
    ptrs[i] = ptrs[j], ptrs[j] = t;
  }
  const uint32_t have = npu_isa_detect();
  /* every qs8_cols_down and qs8_rows_dot variant this CPU runs */
#define NPU_UKERNEL(family, variant, isa)                                                          \
  if (strcmp(#family, "qs8_cols_down") == 0 && ((isa) & ~have) == 0) {                             \
    double t, tb;                                                                                  \
    npu_qs8_cols_down_fn *fn_ = (npu_qs8_cols_down_fn *)(void *)npu_##family##__##variant;         \
    TIME_MEDIAN(runs, t, tb, fn_(k, count, ptrs, coef, y));                                        \
    printf("| %5zu | qs8_cols_down__%-9s | %8.2f | %8.2f |\n", k, #variant, count *kp / t * 1e-9,  \
           count * kp / tb * 1e-9);                                                                \
  }
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
  for (int zp = 0; zp < 2; zp++) { /* x_zero_point 3: x - 3 may leave int8; 0: it never does */
#define NPU_UKERNEL(family, variant, isa)                                                          \
  if (strcmp(#family, "qs8_rows_dot") == 0 && ((isa) & ~have) == 0) {                              \
    double t, tb;                                                                                  \
    npu_qs8_rows_dot_fn *fn_ = (npu_qs8_rows_dot_fn *)(void *)npu_##family##__##variant;           \
    TIME_MEDIAN(runs, t, tb, fn_(k, x, zp ? 0 : 3, count, ptrs, acc));                             \
    printf("| %5zu | qs8_rows_dot__%-8s zp %d | %8.2f | %8.2f |\n", k, #variant, zp ? 0 : 3,       \
           count *kp / t * 1e-9, count * kp / tb * 1e-9);                                          \
  }
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
  }
  free(base), free(x), free(ptrs), free(acc), free(coef), free(y);
}

/* Input-sparse decode on an [n, k] matrix: the dense decode GEMV (m = 1, the chosen variant) of
 * the packed weights against every qcol GEMV variant this CPU runs on the channel-major copy,
 * with every channel kept and with a random half, in GB/s of the weight bytes each reads (dense:
 * the packed size; sparse: the kept rows, and the block scales of the blocks they touch). int8
 * weights with int8 activations (w8a8), int4 with block scales and int16 activations
 * (w4a16-block). At n x k = 2048 x 8192 the matrix is 16 MiB (int8): each call streams it. */
static void bench_qcol(int runs, size_t n, size_t k) {
  struct npu_ukernels uk;
  npu_ukernels_select(npu_isa_detect(), &uk);
  const uint32_t have = npu_isa_detect();
  int8_t *w = malloc(n * k), *x = malloc(k);
  int16_t *x16 = malloc(k * sizeof(int16_t)), *d = malloc(k * sizeof(int16_t));
  int32_t *idx = malloc(k * sizeof(int32_t)), *acc = calloc(npu_qcol_np(n), sizeof(int32_t));
  int32_t *mult = malloc(n * sizeof(int32_t)), *shift = calloc(n, sizeof(int32_t));
  uint8_t *bs = malloc(n * (k / 32 + 1));
  int8_t *y = malloc(n);
  int16_t *y16 = malloc(n * sizeof(int16_t));
  for (size_t i = 0; i < n * k; i++) w[i] = (int8_t)(rnd() % 255 - 127);
  for (size_t c = 0; c < k; c++) x[c] = (int8_t)rnd(), x16[c] = (int16_t)rnd();
  for (size_t i = 0; i < n; i++) mult[i] = 1 << 30;
  for (size_t i = 0; i < n * (k / 32 + 1); i++) bs[i] = (uint8_t)(rnd() % 16);
  void *p8 = aligned_alloc(64, (npu_qs8_gemm_packed_size(n, k) + 63) / 64 * 64);
  int8_t *w4 = malloc(n * k);
  for (size_t i = 0; i < n * k; i++) w4[i] = (int8_t)(rnd() % 16) - 8;
  void *p4 = aligned_alloc(64, (npu_qc4w_gemm_packed_size(n, k, 32) + 63) / 64 * 64);
  npu_qs8_gemm_pack(n, k, w, NULL, p8);
  npu_qc4w_gemm_pack(n, k, w4, NULL, 32, bs, p4);
  int8_t *c8 = aligned_alloc(64, npu_qcol_size(n, k, 8));
  uint8_t *c4 = aligned_alloc(64, npu_qcol_size(n, k, 4)),
          *q4 = malloc((k / 32 + 1) * npu_qcol_np(n));
  npu_qcol8_from_packed(n, k, p8, c8);
  npu_qcol4_from_packed(n, k, 32, p4, c4, q4);
  const struct npu_qs8_gemm_params g8 = {mult, shift, 3, 0};
  const struct npu_qs16_gemm_params g16 = {mult, shift, 16, 0, 32};
  double t, tb;
  TIME_MEDIAN(runs, t, tb, uk.qs8_gemm(1, 0, n, k, x, k, p8, y, n, &g8));
  const double b8 = (double)npu_qs8_gemm_packed_size(n, k);
  printf("| %5zu x %5zu | w8a8 dense qs8_gemm__%-10s |  100%% | %8.2f | %8.2f |\n", n, k,
         npu_ukernels_variant(&uk, "qs8_gemm"), b8 / t * 1e-9, b8 / tb * 1e-9);
  TIME_MEDIAN(runs, t, tb, uk.qs16_qc4w_gemm_qs16(1, 0, n, k, x16, k, p4, y16, n, &g16));
  const double b4 = (double)npu_qc4w_gemm_packed_size(n, k, 32);
  printf("| %5zu x %5zu | w4a16-block dense __%-10s  |  100%% | %8.2f | %8.2f |\n", n, k,
         npu_ukernels_variant(&uk, "qs16_qc4w_gemm_qs16"), b4 / t * 1e-9, b4 / tb * 1e-9);
  for (int half = 0; half < 2; half++) {
    size_t count = 0;
    for (size_t c = 0; c < k; c++) {
      if (half && rnd() % 2) continue;
      idx[count] = (int32_t)c;
      d[count++] = (int16_t)(x[c] - 3);
    }
    /* the 4-bit kernel goes one 32-channel block at a time, as the runtime calls it */
    int32_t starts[1025];
    size_t nb = (k + 31) / 32, i = 0, touched = 0;
    for (size_t b = 0; b <= nb && b < 1025; b++) {
      while (i < count && (size_t)idx[i] < b * 32) i++;
      starts[b] = (int32_t)i;
    }
    for (size_t b = 0; b < nb; b++) touched += starts[b + 1] > starts[b];
    const double r8 = (double)count * (double)npu_qcol_row_bytes(n, 8);
    const double r4 =
        (double)count * (double)npu_qcol_row_bytes(n, 4) + (double)touched * (double)npu_qcol_np(n);
    const size_t np = npu_qcol_np(n);
#define NPU_UKERNEL(family, variant, isa)                                                          \
  if (strcmp(#family, "qcol8_gemv") == 0 && ((isa) & ~have) == 0) {                                \
    npu_qcol8_gemv_fn *fn_ = (npu_qcol8_gemv_fn *)(void *)npu_##family##__##variant;               \
    TIME_MEDIAN(runs, t, tb, fn_(0, np, count, idx, d, c8, npu_qcol_row_bytes(n, 8), acc));        \
    printf("| %5zu x %5zu | w8a8 sparse qcol8_gemv__%-8s | %4.0f%% | %8.2f | %8.2f |\n", n, k,     \
           #variant, 100.0 * (double)count / (double)k, r8 / t * 1e-9, r8 / tb * 1e-9);            \
  }                                                                                                \
  if (strcmp(#family, "qcol4_gemv") == 0 && ((isa) & ~have) == 0) {                                \
    npu_qcol4_gemv_fn *fn_ = (npu_qcol4_gemv_fn *)(void *)npu_##family##__##variant;               \
    TIME_MEDIAN(                                                                                   \
        runs, t, tb, for (size_t b_ = 0; b_ < nb; b_++) {                                          \
          if (starts[b_ + 1] > starts[b_])                                                         \
            fn_(0, np, (size_t)(starts[b_ + 1] - starts[b_]), idx + starts[b_], d + starts[b_],    \
                c4, npu_qcol_row_bytes(n, 4), q4 + b_ * np, acc);                                  \
        });                                                                                        \
    printf("| %5zu x %5zu | w4a16-block qcol4_gemv__%-8s | %4.0f%% | %8.2f | %8.2f |\n", n, k,     \
           #variant, 100.0 * (double)count / (double)k, r4 / t * 1e-9, r4 / tb * 1e-9);            \
  }
#include "kernels/npu/npu_ukernels.inc"
#undef NPU_UKERNEL
  }
  free(w), free(x), free(x16), free(d), free(idx), free(acc), free(mult), free(shift), free(bs);
  free(y), free(y16), free(p8), free(w4), free(p4), free(c8), free(c4), free(q4);
}

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 11;
  if (runs < 1 || runs > 64) runs = 11;
  const char *only = argc > 2 ? argv[2] : NULL; /* a variant name: only its int4 / int16 GEMMs */
  if (only != NULL && strcmp(only, "sparse") == 0) goto sparse; /* the bundle kernels only */
  printf("NPU int8 GEMM, one core, median of %d runs\n\n", runs);
  printf("| kernel               |     M |     N |     K |   time us |     GOPS | best GOPS |\n");
  printf("|----------------------|------:|------:|------:|----------:|---------:|----------:|\n");
  /* M, N, K: prefill (128 rows) and decode (1) of GPT-2 / Qwen2-0.5B sized projections, the
   * tiny test model's, and a 24 MiB decode that streams its weights from memory. */
  static const size_t shapes[][3] = {
      {128, 768, 768}, {1, 768, 768},    {128, 2048, 768}, {1, 2048, 768},  {128, 768, 2048},
      {1, 768, 2048},  {128, 4864, 896}, {1, 4864, 896},   {1, 32000, 768}, {64, 172, 64},
      {1, 172, 64},    {1, 64, 172},     {16, 704, 256},   {1, 256, 704}};
  for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
    bench_gemm(runs, shapes[s][0], shapes[s][1], shapes[s][2]);
  printf("\nNPU GEMMs of int4 weights / int16 activations (w4a16-block: 32-k block scales)\n\n");
  printf("| kernel                     |     M |     N |     K |   time us |     GOPS | best GOPS "
         "|\n");
  printf("|----------------------------|------:|------:|------:|----------:|---------:|----------:"
         "|\n");
  static const size_t shapes4[][3] = {{128, 768, 768}, {1, 768, 768},  {128, 2048, 768},
                                      {1, 2048, 768},  {1, 4864, 896}, {1, 32000, 768}};
  for (size_t s = 0; s < sizeof(shapes4) / sizeof(shapes4[0]); s++)
    bench_gemm_w4a16(runs, shapes4[s][0], shapes4[s][1], shapes4[s][2], only);
  printf("\n| kernel               |  Melem/s |     best "
         "|\n|----------------------|---------:|---------:|\n");
  bench_elementwise(runs);
sparse:
  printf("\nNeuron bundles and rows, 4096 of them shuffled (sparse decode), median of %d runs\n\n"
         "|     k | kernel                     |     GB/s |     best |\n"
         "|------:|----------------------------|---------:|---------:|\n",
         runs);
  bench_bundles(runs, 512);
  bench_bundles(runs, 2048);
  printf(
      "\nInput-sparse GEMVs (channel-major) against the dense GEMV, one core, median of %d runs\n\n"
      "| n x k         | kernel                                | kept |     GB/s |     best |\n"
      "|---------------|---------------------------------------|-----:|---------:|---------:|\n",
      runs);
  bench_qcol(runs, 2048, 8192);
  bench_qcol(runs, 8192, 2048);
  return 0;
}
