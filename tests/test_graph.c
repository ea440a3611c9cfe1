/* Graph execution against the FP32 reference: the float kernels bit for bit against the
 * reference's building blocks (and the fused attention against a double-precision definition; the
 * line reads that warm decode attention's KV rows by what they return),
 * the step policy, and whole models: every specialization (decode and each chunk size, times each
 * context bucket) bit for bit the reference's logits, chunked prefill equal to token-by-token
 * decode, greedy output and perplexity identical; and the IR's API for passes (roles, editing a
 * graph through a resumed builder). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "analysis/perplexity.h"
#include "backends/exec.h"
#include "compiler/compiler.h"
#include "kernels/cpu/kernels.h"
#include "model/model.h"
#include "npulm.h"
#include "ref/forward.h"
#include "test_util.h"

static float rand_float(uint64_t *rng, float scale) {
  return (float)((int)(test_rand(rng) % 20001) - 10000) / 10000.0f * scale;
}

static void fill(float *x, size_t n, uint64_t *rng, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = rand_float(rng, scale);
}

/* ---- Kernels ------------------------------------------------------------------------------- */

/* The CPU's float kernels of variant set 'which': 0 the scalar ones, 1 those the executor picks on
 * this CPU (the same where it has no vector extension they need). */
static struct npu_cpu_ukernels cpu_ukernels(int which) {
  struct npu_cpu_ukernels uk;
  npu_cpu_ukernels_select(which == 0 ? 0 : npu_isa_detect(), &uk);
  return uk;
}

/* Both matmul variants give exactly the reference matvec's bits, row by row, on shapes that hit
 * every tile edge: rows not a multiple of 4 or 2, n not a multiple of the tile, k % 8 != 0. */
static void test_matmul_matches_reference_bits(void **state) {
  (void)state;
  uint64_t rng = 7;
  for (int trial = 0; trial < 300; trial++) {
    int rows = 1 + (int)(test_rand(&rng) % 11), k = 1 + (int)(test_rand(&rng) % 300);
    int n = 1 + (int)(test_rand(&rng) % 45);
    if (trial % 10 == 0) k = 8 * (1 + (int)(test_rand(&rng) % 40)); /* no tail */
    if (trial == 1) {
      rows = 130;
      k = 256;
      n = 300; /* several weight tiles */
    }
    bool with_bias = trial % 3 == 0;
    float *w = malloc((size_t)n * (size_t)k * sizeof(float));
    float *x = malloc((size_t)rows * (size_t)k * sizeof(float));
    float *b = malloc((size_t)n * sizeof(float));
    float *want = malloc((size_t)rows * (size_t)n * sizeof(float));
    float *got = malloc((size_t)rows * (size_t)n * sizeof(float));
    fill(w, (size_t)n * (size_t)k, &rng, 1.0f);
    fill(x, (size_t)rows * (size_t)k, &rng, 2.0f);
    fill(b, (size_t)n, &rng, 10.0f);
    for (int t = 0; t < rows; t++) {
      npu_ref_matvec(want + (size_t)t * (size_t)n, w, with_bias ? b : NULL,
                     x + (size_t)t * (size_t)k, k, n);
    }
    for (int variant = 0; variant < 2; variant++) {
      memset(got, 0, (size_t)rows * (size_t)n * sizeof(float));
      cpu_ukernels(variant).f32_matmul(got, x, w, with_bias ? b : NULL, rows, k, n);
      assert_memory_equal(got, want, (size_t)rows * (size_t)n * sizeof(float));
    }
    free(w);
    free(x);
    free(b);
    free(want);
    free(got);
  }
}

/* RMSNorm over rows equals the reference's npu_ref_rmsnorm of each row bit for bit: row counts
 * below, at and past the kernel's eight rows at a time, and widths not a multiple of 8. */
static void test_rmsnorm_matches_reference_bits(void **state) {
  (void)state;
  uint64_t rng = 11;
  const int32_t rows[] = {1, 3, 7, 8, 9, 16, 21}, cols[] = {1, 5, 8, 13, 64, 77};
  for (size_t a = 0; a < sizeof(rows) / sizeof(rows[0]); a++) {
    for (size_t b = 0; b < sizeof(cols) / sizeof(cols[0]); b++) {
      const int32_t n = rows[a], k = cols[b];
      const size_t nk = (size_t)n * (size_t)k;
      float *x = malloc(nk * sizeof(float)), *w = malloc((size_t)k * sizeof(float));
      float *got = malloc(nk * sizeof(float)), *want = malloc((size_t)k * sizeof(float));
      fill(x, nk, &rng, 40.0f);
      fill(w, (size_t)k, &rng, 2.0f);
      npu_f32_rmsnorm(got, x, w, n, k, 1e-5f);
      for (int32_t t = 0; t < n; t++) {
        npu_ref_rmsnorm(want, x + (size_t)t * (size_t)k, w, k, 1e-5f);
        assert_memory_equal(got + (size_t)t * (size_t)k, want, (size_t)k * sizeof(float));
      }
      free(x), free(w), free(got), free(want);
    }
  }
}

/* RoPE from the table, both pairings, partial rotation and frequency factors, head dims that do
 * and do not fill the kernel's vectors, equals the reference's rotation at each row's position
 * bit for bit. */
static void test_rope_matches_reference_bits(void **state) {
  (void)state;
  uint64_t rng = 3;
  float factors[36];
  for (int i = 0; i < 36; i++) factors[i] = 1.0f + 0.5f * (float)i;
  const int32_t dims[][2] = {{8, 8}, {8, 6}, {64, 64}, {64, 40}, {72, 72}, {72, 66}};
  for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++) {
    for (int variant = 0; variant < 4; variant++) {
      struct npu_config c = {.head_dim = dims[d][0],
                             .rope_dim = dims[d][1],
                             .rope_base = 10000.0f,
                             .rope_type = variant % 2 ? NPU_ROPE_NEOX : NPU_ROPE_NORM};
      const float *ff = variant >= 2 ? factors : NULL;
      enum { ROWS = 5, HEADS = 3, POS0 = 17, NPOS = 32, MAX_HD = 72 };
      const int32_t hd = c.head_dim;
      float cos_t[NPOS * MAX_HD / 2], sin_t[NPOS * MAX_HD / 2];
      float x[ROWS * HEADS * MAX_HD], got[ROWS * HEADS * MAX_HD];
      npu_f32_rope_table(cos_t, sin_t, NPOS, &c, ff);
      fill(x, (size_t)(ROWS * HEADS * hd), &rng, 3.0f);
      cpu_ukernels(1).f32_rope(got, x, cos_t, sin_t, &c, ROWS, HEADS, POS0);
      for (int t = 0; t < ROWS; t++) {
        float want[HEADS * MAX_HD];
        memcpy(want, x + t * HEADS * hd, (size_t)(HEADS * hd) * sizeof(float));
        npu_ref_rope(want, HEADS, &c, ff, POS0 + t);
        assert_memory_equal(got + t * HEADS * hd, want, (size_t)(HEADS * hd) * sizeof(float));
      }
    }
  }
}

/* QK, softmax and PV (attention split around the integer NPU) over a cache with grouped heads and
 * padded rows: the scores are the reference's (npu_ref_dot, scaled) bit for bit, the
 * probabilities npu_ref_softmax's and the output their weighted sum in key order; masked scores are
 * -inf, masked probabilities 0, and padded rows see exactly the step's real positions. Head dims
 * cover the 32-wide, 8-wide and scalar paths. */
static void test_attention_matches_reference_bits(void **state) {
  (void)state;
  uint64_t rng = 11;
  const int hds[3] = {8, 12, 40};
  for (int v = 0; v < 3; v++) {
    const int hd = hds[v], heads = 4, kv_heads = 2, rows = 6, ctx = 24, pos0 = 9, n_valid = 4;
    const int q_cols = heads * hd, kv_cols = kv_heads * hd;
    float *q = malloc((size_t)rows * (size_t)q_cols * sizeof(float));
    float *kc = malloc((size_t)ctx * (size_t)kv_cols * sizeof(float));
    float *vc = malloc((size_t)ctx * (size_t)kv_cols * sizeof(float));
    float *s = malloc((size_t)heads * (size_t)rows * (size_t)ctx * sizeof(float));
    float *p = malloc((size_t)heads * (size_t)rows * (size_t)ctx * sizeof(float));
    float *out = malloc((size_t)rows * (size_t)q_cols * sizeof(float));
    fill(q, (size_t)rows * (size_t)q_cols, &rng, 1.0f);
    fill(kc, (size_t)ctx * (size_t)kv_cols, &rng, 1.0f);
    fill(vc, (size_t)ctx * (size_t)kv_cols, &rng, 1.0f);
    /* positions from the step's last real token on hold NaN: a kernel that reads them fails */
    for (int j = pos0 + n_valid; j < ctx; j++) {
      for (int i = 0; i < kv_cols; i++) kc[j * kv_cols + i] = vc[j * kv_cols + i] = NAN;
    }
    float scale = 1.0f / sqrtf((float)hd);
    const struct npu_cpu_ukernels uk = cpu_ukernels(1);
    uk.f32_qk(s, q, kc, heads, kv_heads, hd, rows, ctx, pos0, n_valid, scale);
    npu_f32_softmax(p, s, heads, rows, ctx, pos0, n_valid);
    uk.f32_pv(out, p, vc, heads, kv_heads, hd, rows, ctx, pos0, n_valid);
    for (int t = 0; t < rows; t++) {
      int len = npu_attn_len(pos0, n_valid, t);
      assert_int_equal(len, t < n_valid ? pos0 + t + 1 : pos0 + n_valid);
      for (int h = 0; h < heads; h++) {
        /* the reference's attention() for one head, at position len - 1 */
        const float *qh = q + t * q_cols + h * hd;
        int kv_off = (h / (heads / kv_heads)) * hd;
        float att[24], o[40] = {0};
        for (int j = 0; j < len; j++) {
          att[j] = npu_ref_dot(kc + j * kv_cols + kv_off, qh, hd) * scale;
        }
        const float *srow = s + ((size_t)h * rows + (size_t)t) * ctx;
        const float *prow = p + ((size_t)h * rows + (size_t)t) * ctx;
        assert_memory_equal(srow, att, (size_t)len * sizeof(float));
        npu_ref_softmax(att, len);
        assert_memory_equal(prow, att, (size_t)len * sizeof(float));
        for (int j = len; j < ctx; j++) {
          assert_true(isinf(srow[j]) && srow[j] < 0);
          assert_true(prow[j] == 0.0f);
        }
        for (int j = 0; j < len; j++) {
          for (int i = 0; i < hd; i++) o[i] += att[j] * vc[j * kv_cols + kv_off + i];
        }
        assert_memory_equal(out + t * q_cols + h * hd, o, (size_t)hd * sizeof(float));
      }
    }
    free(q);
    free(kc);
    free(vc);
    free(s);
    free(p);
    free(out);
  }
}

/* A random attention problem: q [rows, heads * hd], caches [ctx, kv_heads * hd] whose rows from
 * the step's last real token on hold NaN (a kernel that reads them fails). 'growth' > 0 scales key
 * j by 1 + growth * j, so the scores' maximum keeps rising from tile to tile (every tile rescales
 * what came before); 'q_scale' spreads the scores. */
struct attn_case {
  int heads, kv_heads, hd, rows, pos0, n_valid, ctx;
  float scale;
  float *q, *k, *v;
};

static void attn_case_make(struct attn_case *c, uint64_t *rng, float q_scale, float growth) {
  const int q_cols = c->heads * c->hd, kv_cols = c->kv_heads * c->hd;
  c->ctx = c->pos0 + c->rows + 3;
  c->scale = 1.0f / sqrtf((float)c->hd);
  c->q = malloc((size_t)c->rows * (size_t)q_cols * sizeof(float));
  c->k = malloc((size_t)c->ctx * (size_t)kv_cols * sizeof(float));
  c->v = malloc((size_t)c->ctx * (size_t)kv_cols * sizeof(float));
  fill(c->q, (size_t)c->rows * (size_t)q_cols, rng, q_scale);
  fill(c->k, (size_t)c->ctx * (size_t)kv_cols, rng, 1.0f);
  fill(c->v, (size_t)c->ctx * (size_t)kv_cols, rng, 1.0f);
  for (int j = 0; j < c->ctx; j++) {
    for (int i = 0; i < kv_cols; i++) {
      float *kj = &c->k[(size_t)j * (size_t)kv_cols + (size_t)i];
      *kj *= 1.0f + growth * (float)j;
      if (j >= c->pos0 + c->n_valid) *kj = c->v[(size_t)j * (size_t)kv_cols + (size_t)i] = NAN;
    }
  }
}

static void attn_case_free(struct attn_case *c) {
  free(c->q);
  free(c->k);
  free(c->v);
}

/* Shapes for the fused attention: head dims of one lane to past 256 and not multiples of 8, GQA
 * groups up to more than a block of pairs, contexts that end mid-tile, padded rows, steps of one
 * row and of many blocks. */
static void attn_case_pick(struct attn_case *c, int trial, uint64_t *rng) {
  static const int hds[] = {1, 3, 8, 12, 17, 31, 32, 40, 64, 72, 100, 128, 260};
  static const int groups[] = {1, 2, 3, 7, 20};
  c->hd = hds[test_rand(rng) % (sizeof(hds) / sizeof(hds[0]))];
  c->kv_heads = 1 + (int)(test_rand(rng) % 3);
  c->heads = c->kv_heads * groups[test_rand(rng) % (sizeof(groups) / sizeof(groups[0]))];
  c->rows = trial % 3 == 0 ? 1 : 1 + (int)(test_rand(rng) % 40);
  if (trial == 1) c->rows = 130;
  c->n_valid = 1 + (int)(test_rand(rng) % (uint64_t)c->rows);
  c->pos0 = (int)(test_rand(rng) % 150);
}

/* The fused attention, both variants, equals the reference's npu_ref_attention for each row bit
 * for bit (a padded row as the step's last real row), and reads neither the caches past the
 * step's tokens nor its output before writing it. */
static void test_fused_attention_matches_reference_bits(void **state) {
  (void)state;
  uint64_t rng = 13;
  for (int trial = 0; trial < 150; trial++) {
    struct attn_case c;
    attn_case_pick(&c, trial, &rng);
    attn_case_make(&c, &rng, trial % 5 == 0 ? 6.0f : 1.0f, trial % 4 == 1 ? 0.05f : 0.0f);
    const int q_cols = c.heads * c.hd, kv_cols = c.kv_heads * c.hd, group = c.heads / c.kv_heads;
    const size_t n_out = (size_t)c.rows * (size_t)q_cols;
    float *want = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    float *att = malloc((size_t)c.ctx * sizeof(float));
    for (int t = 0; t < c.rows; t++) {
      int len = npu_attn_len(c.pos0, c.n_valid, t);
      for (int h = 0; h < c.heads; h++) {
        size_t kv_off = (size_t)(h / group) * (size_t)c.hd;
        size_t at = (size_t)t * (size_t)q_cols + (size_t)h * (size_t)c.hd;
        npu_ref_attention(want + at, att, c.q + at, c.k + kv_off, c.v + kv_off, (size_t)kv_cols,
                          c.hd, len, c.scale);
      }
    }
    for (int variant = 0; variant < 2; variant++) {
      const struct npu_cpu_ukernels uk = cpu_ukernels(variant);
      for (size_t i = 0; i < n_out; i++) got[i] = NAN;
      uk.f32_attention(got, c.q, c.k, c.v, c.heads, c.kv_heads, c.hd, c.rows, c.pos0, c.n_valid,
                       c.scale);
      if (memcmp(got, want, n_out * sizeof(float)) != 0) {
        fail_msg("trial %d (%s): heads %d/%d hd %d rows %d pos0 %d n_valid %d differs", trial,
                 npu_cpu_ukernels_variant(&uk, "f32_attention"), c.heads, c.kv_heads, c.hd, c.rows,
                 c.pos0, c.n_valid);
      }
    }
    free(want);
    free(got);
    free(att);
    attn_case_free(&c);
  }
}

/* Decode attention split by keys: the units (a tile of one head) of one query row computed in up
 * to three ranges, in reverse order as threads might finish them, by either variant, then folded,
 * equal the reference's npu_ref_attention bit for bit, also when tiles tie on their maxima; they
 * read no key or value past the row's (those are NaN). */
static void test_attention_tiles_fold_matches_reference_bits(void **state) {
  (void)state;
  uint64_t rng = 29;
  for (int trial = 0; trial < 150; trial++) {
    struct attn_case c;
    attn_case_pick(&c, trial, &rng);
    if (trial % 10 == 0) c.pos0 += 300 + (int)(test_rand(&rng) % 300); /* a longer context */
    attn_case_make(&c, &rng, trial % 5 == 0 ? 6.0f : 1.0f, trial % 4 == 1 ? 0.05f : 0.0f);
    const int q_cols = c.heads * c.hd, kv_cols = c.kv_heads * c.hd, group = c.heads / c.kv_heads;
    const int t = c.rows - 1, len = npu_attn_len(c.pos0, c.n_valid, t);
    const int n_tiles = npu_attn_tiles(len);
    if (trial % 7 == 3) {
      /* every tile's keys the first tile's: each tile's maximum is the running one (a fold whose
       * factors both have a zero exponent) */
      const size_t row = (size_t)kv_cols;
      for (int j = NPU_REF_ATTN_TILE; j < len; j++) {
        memcpy(c.k + (size_t)j * row, c.k + (size_t)(j % NPU_REF_ATTN_TILE) * row,
               row * sizeof(float));
      }
    }
    const float *q = c.q + (size_t)t * (size_t)q_cols;
    float *want = malloc((size_t)q_cols * sizeof(float));
    float *got = malloc((size_t)q_cols * sizeof(float));
    float *att = malloc((size_t)c.ctx * sizeof(float));
    const size_t n_part = (size_t)n_tiles * (size_t)c.heads * ((size_t)c.hd + 2);
    float *part = malloc(n_part * sizeof(float));
    for (int h = 0; h < c.heads; h++) {
      size_t kv_off = (size_t)(h / group) * (size_t)c.hd;
      npu_ref_attention(want + (size_t)h * (size_t)c.hd, att, q + (size_t)h * (size_t)c.hd,
                        c.k + kv_off, c.v + kv_off, (size_t)kv_cols, c.hd, len, c.scale);
    }
    for (int variant = 0; variant < 2; variant++) {
      const struct npu_cpu_ukernels uk = cpu_ukernels(variant);
      for (size_t i = 0; i < n_part; i++) part[i] = NAN;
      const int units = n_tiles * c.heads;
      int cut1 = (int)(test_rand(&rng) % (uint64_t)(units + 1));
      int cut2 = cut1 + (int)(test_rand(&rng) % (uint64_t)(units - cut1 + 1));
      const int from[] = {cut2, cut1, 0}, to[] = {units, cut2, cut1};
      for (int r = 0; r < 3; r++) {
        uk.f32_attention_tiles(part, q, c.k, c.v, c.heads, c.kv_heads, c.hd, len, from[r], to[r],
                               c.scale);
      }
      for (int i = 0; i < q_cols; i++) got[i] = NAN;
      npu_f32_attention_fold(got, part, c.heads, c.hd, n_tiles);
      if (memcmp(got, want, (size_t)q_cols * sizeof(float)) != 0) {
        fail_msg("trial %d (%s): heads %d/%d hd %d len %d (units cut at %d, %d of %d) differs",
                 trial, npu_cpu_ukernels_variant(&uk, "f32_attention_tiles"), c.heads, c.kv_heads,
                 c.hd, len, cut1, cut2, units);
      }
    }
    free(want);
    free(got);
    free(att);
    free(part);
    attn_case_free(&c);
  }
}

/* npu_touch_lines reads one byte per 64-byte line from the start, nothing past the end (each
 * buffer is exactly its size, for the sanitizers), and sums what it read. */
static void test_touch_lines(void **state) {
  (void)state;
  const size_t sizes[] = {0, 1, 63, 64, 65, 1000, 4096, 4097};
  uint64_t rng = 5;
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    const size_t n = sizes[s];
    uint8_t *b = malloc(n > 0 ? n : 1);
    assert_non_null(b);
    uint32_t want = 0;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)test_rand(&rng);
    for (size_t i = 0; i < n; i += 64) want += b[i];
    assert_int_equal(npu_touch_lines(b, n), want);
    free(b);
  }
}

/* The fused attention against softmax attention computed in double from the same inputs. Each
 * output's error, relative to its scale sum_j p_j |v_j|, stays within what float rounding allows:
 * the worst score's rounding bound ((hd/8 + 4) eps sum_i |q_i k_ji| scale: eight partial sums)
 * plus 32 eps for the exponentials, sums and rescaling, whatever the tiles did. */
static void test_fused_attention_matches_double(void **state) {
  (void)state;
  uint64_t rng = 17;
  double worst = 0.0;
  for (int trial = 0; trial < 150; trial++) {
    struct attn_case c;
    attn_case_pick(&c, trial, &rng);
    attn_case_make(&c, &rng, trial % 5 == 0 ? 6.0f : 1.0f, trial % 4 == 1 ? 0.05f : 0.0f);
    const int q_cols = c.heads * c.hd, kv_cols = c.kv_heads * c.hd, group = c.heads / c.kv_heads;
    float *got = malloc((size_t)c.rows * (size_t)q_cols * sizeof(float));
    double *p = malloc((size_t)c.ctx * sizeof(double));
    cpu_ukernels(1).f32_attention(got, c.q, c.k, c.v, c.heads, c.kv_heads, c.hd, c.rows, c.pos0,
                                  c.n_valid, c.scale);
    for (int t = 0; t < c.rows; t++) {
      int len = npu_attn_len(c.pos0, c.n_valid, t);
      for (int h = 0; h < c.heads; h++) {
        const float *qh = c.q + (size_t)t * (size_t)q_cols + (size_t)h * (size_t)c.hd;
        size_t kv_off = (size_t)(h / group) * (size_t)c.hd;
        double max = -INFINITY, sum = 0.0, s_mag = 0.0;
        for (int j = 0; j < len; j++) {
          double dot = 0.0, mag = 0.0;
          for (int i = 0; i < c.hd; i++) {
            double x = (double)qh[i] * c.k[(size_t)j * kv_cols + kv_off + i];
            dot += x;
            mag += fabs(x);
          }
          p[j] = dot * (double)c.scale;
          max = fmax(max, p[j]);
          s_mag = fmax(s_mag, mag * (double)c.scale);
        }
        const double tol = ((c.hd / 8 + 4) * s_mag + 32.0) * FLT_EPSILON;
        for (int j = 0; j < len; j++) sum += (p[j] = exp(p[j] - max));
        for (int i = 0; i < c.hd; i++) {
          double want = 0.0, mag = 0.0;
          for (int j = 0; j < len; j++) {
            double x = p[j] / sum * c.v[(size_t)j * kv_cols + kv_off + i];
            want += x;
            mag += fabs(x);
          }
          double err = fabs(got[(size_t)t * q_cols + (size_t)h * c.hd + i] - want) / mag;
          worst = fmax(worst, err / tol);
          if (!(err <= tol)) {
            fail_msg("trial %d: heads %d/%d hd %d rows %d pos0 %d: row %d head %d [%d] = %.9g, "
                     "want %.9g",
                     trial, c.heads, c.kv_heads, c.hd, c.rows, c.pos0, t, h, i,
                     got[(size_t)t * q_cols + (size_t)h * c.hd + i], want);
          }
        }
      }
    }
    free(got);
    free(p);
    attn_case_free(&c);
  }
  print_message("fused attention vs double: worst error %.2f of its bound\n", worst);
}

/* ---- Models --------------------------------------------------------------------------------- */

/* Compile 'm' into FP32 graphs with the given chunk sizes and context buckets. */
static void compile(npulm_model *m, const int *chunks, int n_chunks, const int *buckets,
                    int n_buckets) {
  npulm_compile_params cp = npulm_compile_default_params();
  cp.quant = "f32"; /* this file checks the FP32 graphs; the integer NPU is tested elsewhere */
  for (int i = 0; i < n_chunks; i++) cp.chunks[i] = chunks[i];
  cp.n_chunks = n_chunks;
  for (int i = 0; i < n_buckets; i++) cp.buckets[i] = buckets[i];
  cp.n_buckets = n_buckets;
  npulm_error err;
  if (npulm_model_compile(m, &cp, &err) != NPULM_OK) fail_msg("%s", err.msg);
}

static npulm_session *new_session(const npulm_model *m, int n_ctx, bool reference) {
  npulm_session_params p = npulm_session_default_params();
  p.n_ctx = n_ctx;
  p.reference = reference;
  npulm_session *s = NULL;
  npulm_error err;
  if (npulm_session_create(m, &p, &s, &err) != NPULM_OK) fail_msg("%s", err.msg);
  return s;
}

/* 'n' tokens of real text (BOS first). */
static int32_t *text_tokens(const npulm_model *m, int n) {
  size_t len;
  char *text = test_slurp_shared("data/tinystories-valid.txt", &len);
  int32_t *ids = malloc((len + 2) * sizeof(int32_t));
  size_t n_ids;
  npulm_error err;
  assert_int_equal(npulm_tokenize(m, text, len, true, false, ids, len + 2, &n_ids, &err), NPULM_OK);
  assert_true(n_ids >= (size_t)n);
  free(text);
  return ids;
}

/* Max |a - b| over a row, relative to the row's largest |b|. */
static double rel_err(const float *a, const float *b, int n) {
  double diff = 0.0, mag = 1e-30;
  for (int i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
    mag = fmax(mag, fabs((double)b[i]));
  }
  return diff / mag;
}

/* Where a program's graph sits in the program's list. */
static int graph_index(const struct npu_program *p, const struct npu_graph *g) {
  return (int)(g - p->graphs);
}

/* Evaluate 'n_tok' tokens as the steps of 'schedule' (eval sizes) from an empty session; every
 * row's logits go to 'out' or, with 'last_only' (generation: no logits asked for), each eval's
 * last logits to its last row of 'out'. Each step's specialization error against 'want' is
 * folded into 'max_err' (per graph) and 'used' counts the graphs run. */
static void run_schedule(npulm_model *m, npulm_session *s, const int32_t *ids, const int *schedule,
                         int n_sched, bool last_only, const float *want, float *out,
                         double *max_err, int *used) {
  const struct npu_program *p = m->program;
  int n_vocab = m->cfg.n_vocab;
  struct npu_step steps[600];
  npulm_error err;
  npulm_session_reset(s);
  int pos = 0;
  for (int i = 0; i < n_sched; i++) {
    int n = schedule[i];
    float *rows = out + (size_t)pos * (size_t)n_vocab;
    float *last = rows + (size_t)(n - 1) * (size_t)n_vocab;
    if (npulm_session_eval(s, ids + pos, (size_t)n, last_only ? NULL : rows, &err) != NPULM_OK) {
      fail_msg("%s", err.msg);
    }
    if (last_only) memcpy(last, npulm_session_logits(s), (size_t)n_vocab * sizeof(float));
    assert_memory_equal(npulm_session_logits(s), last, (size_t)n_vocab * sizeof(float));
    int n_steps = npu_exec_plan_steps(p, pos, n, last_only, steps);
    assert_true(n_steps > 0);
    for (int k = 0; k < n_steps; k++) {
      int gi = graph_index(p, steps[k].g);
      used[gi]++;
      assert_int_equal(npu_graph_logit_rows(steps[k].g), last_only ? 1 : steps[k].g->rows);
      for (int r = 0; r < steps[k].n_valid; r++) {
        if (last_only && (k < n_steps - 1 || r < steps[k].n_valid - 1)) continue;
        size_t row = (size_t)(pos + steps[k].row0 + r) * (size_t)n_vocab;
        double e = rel_err(out + row, want + row, n_vocab);
        if (e > max_err[gi]) max_err[gi] = e;
      }
    }
    pos += n;
  }
  assert_int_equal(npulm_session_pos(s), pos);
}

/* Every specialization of a program of chunks 32, 128 and decode, with every row's logits and for
 * generation, x buckets 128, 256, 512, on 300 tokens of text: the reference's logits bit for bit;
 * every chunked schedule gives the decode schedule's bits. */
static void check_model_against_reference(const char *rel) {
  npulm_model *m = test_open_shared(rel);
  enum { L = 300, GRAPHS = 15 };
  compile(m, (int[]){32, 128}, 2, (int[]){128, 256, 512}, 3);
  const struct npu_program *p = m->program;
  assert_int_equal(p->n_graphs, GRAPHS);
  int n_vocab = m->cfg.n_vocab;
  int32_t *ids = text_tokens(m, L);
  float *want = malloc((size_t)L * (size_t)n_vocab * sizeof(float));
  float *stepwise = malloc((size_t)L * (size_t)n_vocab * sizeof(float));
  float *chunked = malloc((size_t)L * (size_t)n_vocab * sizeof(float));
  npulm_error err;
  npulm_session *ref = new_session(m, 512, true);
  assert_int_equal(npulm_session_eval(ref, ids, L, want, &err), NPULM_OK);
  npulm_session_free(ref);

  double max_err[GRAPHS] = {0};
  int used[GRAPHS] = {0};
  npulm_session *s = new_session(m, 512, false);
  /* token by token: decode in each bucket */
  int decode[L];
  for (int i = 0; i < L; i++) decode[i] = 1;
  run_schedule(m, s, ids, decode, L, false, want, stepwise, max_err, used);
  /* lengths 1, C-1, C, C+1 and several chunks; the ends cross every bucket */
  static const int sched_a[] = {1, 31, 32, 33, 127, 76};
  static const int sched_b[] = {128, 32, 96, 44};
  static const int sched_c[] = {32, 128, 129, 11};
  static const int sched_d[] = {299, 1};
  const int *scheds[] = {sched_a, sched_b, sched_c, sched_d};
  const int n_sched[] = {6, 4, 4, 2};
  for (int k = 0; k < 4; k++) {
    run_schedule(m, s, ids, scheds[k], n_sched[k], false, want, chunked, max_err, used);
    assert_memory_equal(chunked, stepwise, (size_t)L * (size_t)n_vocab * sizeof(float));
    /* generating: only each eval's last logits, from the graphs for generation */
    run_schedule(m, s, ids, scheds[k], n_sched[k], true, want, chunked, max_err, used);
    for (int i = 0, pos = 0; i < n_sched[k]; pos += scheds[k][i++]) {
      size_t row = (size_t)(pos + scheds[k][i] - 1) * (size_t)n_vocab;
      assert_memory_equal(chunked + row, stepwise + row, (size_t)n_vocab * sizeof(float));
    }
  }
  for (int gi = 0; gi < p->n_graphs; gi++) {
    print_message("%s rows %3d ctx %3d: %3d steps, max rel error %.3g\n", rel, p->graphs[gi].rows,
                  p->graphs[gi].ctx, used[gi], max_err[gi]);
    assert_true(used[gi] > 0);
    assert_true(max_err[gi] == 0.0); /* bit for bit */
  }
  npulm_session_free(s);
  free(ids);
  free(want);
  free(stepwise);
  free(chunked);
  npulm_model_close(m);
}

static void test_stories260k_matches_reference(void **state) {
  (void)state;
  check_model_against_reference("models/stories260K.gguf");
}

static void test_tinystories5m_matches_reference(void **state) {
  (void)state;
  check_model_against_reference("models/tinystories-5M.gguf");
}

/* The step policy: the largest chunk while it fits, a lone token to decode, else the smallest
 * chunk that holds the rest (padded); the smallest bucket that holds each step's last token. */
static void test_step_policy(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  compile(m, (int[]){32, 128}, 2, (int[]){128, 256, 512}, 3);
  const struct npu_program *p = m->program;
  struct npu_step st[16];
  struct {
    int pos, n, n_steps;
    int rows[4], ctx[4], valid[4];
  } cases[] = {
      {0, 1, 1, {1}, {128}, {1}},
      {0, 31, 1, {32}, {128}, {31}},
      {0, 33, 1, {128}, {128}, {33}},
      {0, 129, 2, {128, 1}, {128, 256}, {128, 1}},
      {100, 300, 3, {128, 128, 128}, {256, 512, 512}, {128, 128, 44}},
      {127, 1, 1, {1}, {128}, {1}},
      {128, 1, 1, {1}, {256}, {1}},
      {500, 12, 1, {32}, {512}, {12}},
  };
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    int n = npu_exec_plan_steps(p, cases[c].pos, cases[c].n, false, st);
    assert_int_equal(n, cases[c].n_steps);
    /* for generation: the same steps, on graphs whose logits are the last row's */
    struct npu_step gen[16];
    assert_int_equal(npu_exec_plan_steps(p, cases[c].pos, cases[c].n, true, gen), n);
    for (int k = 0; k < n; k++) {
      assert_int_equal(gen[k].g->rows, st[k].g->rows);
      assert_int_equal(gen[k].g->ctx, st[k].g->ctx);
      assert_int_equal(npu_graph_logit_rows(gen[k].g), 1);
      assert_int_equal(npu_graph_logit_rows(st[k].g), st[k].g->rows);
    }
    int row0 = 0;
    for (int k = 0; k < n; k++) {
      assert_int_equal(st[k].g->rows, cases[c].rows[k]);
      assert_int_equal(st[k].g->ctx, cases[c].ctx[k]);
      assert_int_equal(st[k].n_valid, cases[c].valid[k]);
      assert_int_equal(st[k].row0, row0);
      assert_int_equal(st[k].pos0, cases[c].pos + row0);
      row0 += st[k].n_valid;
    }
  }
  npulm_model_close(m);
}

/* Any chunk sizes: odd ones (3, 8, 48) and a short context whose padded chunks reach past the end
 * of the KV cache (n_ctx 61: the last chunk of 48 holds 13 tokens). Logits equal decode's, and
 * decode's the reference's. */
static void test_odd_chunks_and_short_context(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  compile(m, (int[]){3, 8, 48}, 3, (int[]){64, 512}, 2);
  enum { L = 61, V = 512 };
  int32_t *ids = text_tokens(m, L);
  static float want[L * V], got[L * V];
  npulm_error err;
  npulm_session *s = new_session(m, L, false);
  for (int i = 0; i < L; i++) {
    assert_int_equal(npulm_session_eval(s, ids + i, 1, want + i * V, &err), NPULM_OK);
  }
  npulm_session *ref = new_session(m, L, true);
  assert_int_equal(npulm_session_eval(ref, ids, L, got, &err), NPULM_OK);
  assert_memory_equal(want, got, sizeof(want)); /* the reference's bits */
  npulm_session_free(ref);
  static const int sizes[][8] = {{2, 3, 4, 7, 9, 13, 23}, {48, 13}, {1, 47, 13}, {5, 5, 5, 46}};
  static const int counts[] = {7, 2, 3, 4};
  for (int k = 0; k < 4; k++) {
    npulm_session_reset(s);
    int pos = 0;
    for (int i = 0; i < counts[k]; i++) {
      assert_int_equal(npulm_session_eval(s, ids + pos, (size_t)sizes[k][i], got + pos * V, &err),
                       NPULM_OK);
      pos += sizes[k][i];
    }
    assert_int_equal(pos, L);
    assert_memory_equal(got, want, sizeof(want));
  }
  /* the context is full */
  assert_int_equal(npulm_session_eval(s, ids, 1, NULL, &err), NPULM_ERR_ARG);
  npulm_session_free(s);
  free(ids);
  npulm_model_close(m);
}

/* Greedy continuation of 'prompt' as token ids; returns how many. */
static int greedy_ids(npulm_model *m, bool reference, const char *prompt, int n, int32_t *out) {
  npulm_session *s = new_session(m, 0, reference);
  int32_t ids[64];
  size_t n_ids;
  npulm_error err;
  assert_int_equal(npulm_tokenize(m, prompt, strlen(prompt), true, false, ids, 64, &n_ids, &err),
                   NPULM_OK);
  assert_int_equal(npulm_session_eval(s, ids, n_ids, NULL, &err), NPULM_OK);
  int count = 0;
  for (; count < n; count++) {
    const float *logits = npulm_session_logits(s);
    int32_t next = 0;
    for (int v = 1; v < m->cfg.n_vocab; v++) next = logits[v] > logits[next] ? v : next;
    out[count] = next;
    if (npulm_token_is_eog(m, next)) break;
    assert_int_equal(npulm_session_eval(s, &next, 1, NULL, &err), NPULM_OK);
  }
  npulm_session_free(s);
  return count;
}

static void test_greedy_identical(void **state) {
  (void)state;
  const char *models[2] = {"models/stories260K.gguf", "models/tinystories-5M.gguf"};
  for (int k = 0; k < 2; k++) {
    npulm_model *m = test_open_shared(models[k]);
    int32_t a[100], b[100];
    int na = greedy_ids(m, true, "Once upon a time", 100, a); /* compiles privately */
    int nb = greedy_ids(m, false, "Once upon a time", 100, b);
    assert_null(m->program);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof(int32_t));
    npulm_model_close(m);
  }
}

/* Perplexity through the graphs equals the reference's to 4 significant digits (here: exactly). */
static void test_perplexity_identical(void **state) {
  (void)state;
  struct {
    const char *model;
    int n_ctx;
    size_t bytes;
  } cases[2] = {{"models/stories260K.gguf", 256, 16000}, {"models/tinystories-5M.gguf", 256, 3000}};
  size_t len;
  char *text = test_slurp_shared("data/tinystories-valid.txt", &len);
  for (int k = 0; k < 2; k++) {
    npulm_model *m = test_open_shared(cases[k].model);
    npulm_ppl_result ref, graph;
    npulm_error err;
    size_t n = cases[k].bytes < len ? cases[k].bytes : len;
    assert_int_equal(
        npulm_perplexity_reference(m, text, n, cases[k].n_ctx, 2, NULL, NULL, &ref, &err),
        NPULM_OK);
    assert_int_equal(npulm_perplexity(m, text, n, cases[k].n_ctx, 2, NULL, NULL, &graph, &err),
                     NPULM_OK);
    char a[32], b[32];
    snprintf(a, sizeof(a), "%.4g", ref.ppl);
    snprintf(b, sizeof(b), "%.4g", graph.ppl);
    print_message("%s: ppl reference %.6f (%.2f s), graphs %.6f (%.2f s), %d windows\n",
                  cases[k].model, ref.ppl, ref.seconds, graph.ppl, graph.seconds, ref.n_chunks);
    assert_string_equal(a, b);
    assert_true(ref.n_chunks >= 2);
    npulm_model_close(m);
  }
  free(text);
}

/* A prefill of several chunks keeps both workers busy and overlaps them; the stats add up. */
static void test_stats(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/tinystories-5M.gguf");
  enum { L = 300 };
  int32_t *ids = text_tokens(m, L);
  npulm_session *s = new_session(m, 512, false);
  npulm_session_stats st;
  npulm_session_get_stats(s, &st);
  assert_true(st.n_steps == 0 && st.wall_s == 0.0 && st.npu_busy_s == 0.0);
  npulm_error err;
  assert_int_equal(npulm_session_eval(s, ids, L, NULL, &err), NPULM_OK);
  npulm_session_get_stats(s, &st);
  print_message("prefill %d tokens: %llu steps, wall %.1f ms, NPU busy %.1f ms, CPU busy %.1f ms, "
                "overlap %.1f ms, %llu transfers\n",
                L, (unsigned long long)st.n_steps, st.wall_s * 1e3, st.npu_busy_s * 1e3,
                st.cpu_busy_s * 1e3, st.overlap_s * 1e3, (unsigned long long)st.n_transfers);
  assert_int_equal(st.n_steps, 3); /* 128 + 128 + 44 in a chunk of 128 */
  assert_true(st.npu_busy_s > 0.0 && st.cpu_busy_s > 0.0);
  assert_true(st.overlap_s >= 0.0);
  assert_true(st.overlap_s <= fmin(st.npu_busy_s, st.cpu_busy_s) + 1e-6);
  assert_true(st.npu_busy_s + st.cpu_busy_s - st.overlap_s <= st.wall_s + 1e-3);
  assert_true(st.n_transfers > 0 && st.n_transfers % 3 == 0);
  npulm_session_free(s);
  /* the reference engine reports nothing */
  s = new_session(m, 64, true);
  assert_int_equal(npulm_session_eval(s, ids, 10, NULL, &err), NPULM_OK);
  npulm_session_get_stats(s, &st);
  assert_true(st.n_steps == 0 && st.npu_busy_s == 0.0 && st.wall_s == 0.0);
  npulm_session_free(s);
  free(ids);
  npulm_model_close(m);
}

/* Bad input is refused before anything runs; a context past the program's largest bucket is
 * refused; the default context fits the program. */
static void test_session_arguments(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  compile(m, (int[]){32}, 1, (int[]){64, 128}, 2);
  npulm_session *s;
  npulm_error err;
  npulm_session_params p = npulm_session_default_params();
  p.n_ctx = 256;
  assert_int_equal(npulm_session_create(m, &p, &s, &err), NPULM_ERR_ARG);
  assert_null(s);
  assert_non_null(strstr(err.msg, "bucket"));
  s = new_session(m, 0, false);
  assert_int_equal(npulm_session_ctx(s), 128);
  int32_t ids[3] = {1, 400, 512};
  assert_int_equal(npulm_session_eval(s, ids, 3, NULL, &err), NPULM_ERR_ARG);
  assert_int_equal(npulm_session_pos(s), 0);
  assert_int_equal(npulm_session_eval(s, ids, 0, NULL, &err), NPULM_OK);
  assert_int_equal(npulm_session_eval(s, ids, 2, NULL, &err), NPULM_OK);
  assert_int_equal(npulm_session_pos(s), 2);
  npulm_session_free(s);
  npulm_model_close(m);
}

/* ---- The IR's pass API ---------------------------------------------------------------------- */

/* Every block tensor of a compiled graph is found by its layer and role, and is the one the
 * builder names after them; copies come after the value they copy. */
static void test_roles_name_tensors(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  compile(m, (int[]){32}, 1, (int[]){128}, 1);
  const struct npu_graph *g = &m->program->graphs[m->program->n_graphs - 1];
  for (int32_t l = 0; l < m->cfg.n_layers; l++) {
    for (int r = NPU_ROLE_ATTN_NORM; r <= NPU_ROLE_FFN_RESIDUAL; r++) {
      if (r == NPU_ROLE_K_CACHE || r == NPU_ROLE_V_CACHE || r == NPU_ROLE_KQ ||
          r == NPU_ROLE_KQ_SOFTMAX) {
        continue; /* the caches are named without their layer; the scores are fused away */
      }
      int32_t t = npu_ir_find_tensor(g, l, (enum npu_tensor_role)r);
      char want[NPU_IR_NAME_MAX];
      snprintf(want, sizeof(want), "blk.%d.%s", l, npu_tensor_role_name((enum npu_tensor_role)r));
      assert_true(t >= 0);
      assert_string_equal(g->tensors[t].name, want);
      assert_true(npu_ir_writer_of(g, t) >= 0);
    }
    int32_t k = npu_ir_find_tensor(g, l, NPU_ROLE_K_CACHE);
    assert_true(k >= 0 && g->tensors[k].kind == NPU_TK_KV && g->tensors[k].ref == l);
  }
  assert_int_equal(g->tensors[npu_ir_find_tensor(g, -1, NPU_ROLE_LOGITS)].kind, NPU_TK_LOGITS);
  for (int32_t t = 0; t < g->n_tensors; t++) {
    int32_t w = npu_ir_writer_of(g, t);
    if (w < 0 || g->nodes[w].op != NPU_OP_TRANSFER) continue;
    int32_t src = g->nodes[w].in[0];
    assert_true(src < t);
    assert_int_equal(g->tensors[t].role, g->tensors[src].role);
    assert_int_equal(g->tensors[t].layer, g->tensors[src].layer);
    assert_int_equal(npu_ir_value_on(g, t, (enum npu_backend)g->tensors[src].backend), src);
    assert_int_equal(npu_ir_value_on(g, src, (enum npu_backend)g->tensors[t].backend), t);
  }
  npulm_model_close(m);
}

/* A pass's edits through a resumed builder: a node inserted in the middle moves the later nodes
 * and their integer data links up and the subgraphs are cut again; a copy keeps its value's role
 * and layer; a node that reads a tensor before it is written is refused and changes nothing. */
static void test_ir_insert_node(void **state) {
  (void)state;
  struct npu_graph g;
  struct npu_ir_builder b;
  npu_ir_builder_init(&b, &g, 2, 4);
  int32_t ids = npu_ir_add_tensor(&b, NPU_TK_INPUT_IDS, NPU_DT_I32, 2, 1, 1, -1, "ids");
  int32_t table = npu_ir_add_tensor(&b, NPU_TK_WEIGHT, NPU_DT_F32, 10, 8, 1, 0, "table");
  int32_t x = npu_ir_add_tensor(&b, NPU_TK_ACT, NPU_DT_F32, 2, 8, 1, -1, "embd");
  int32_t y = npu_ir_add_tensor(&b, NPU_TK_ACT, NPU_DT_F32, 2, 8, 1, -1, "blk.0.ffn_silu");
  int32_t z = npu_ir_add_tensor(&b, NPU_TK_ACT, NPU_DT_F32, 2, 8, 1, -1, "blk.0.ffn_gate_par");
  npu_ir_set_role(&b, x, -1, NPU_ROLE_EMBD);
  npu_ir_set_role(&b, y, 0, NPU_ROLE_FFN_SILU);
  npu_ir_set_role(&b, z, 0, NPU_ROLE_FFN_GATE_PAR);
  npu_ir_add_node(&b, NPU_OP_GATHER, ids, table, -1, x, -1, 0);
  npu_ir_add_node(&b, NPU_OP_SILU, x, -1, -1, y, 0, 0);
  npu_ir_add_node(&b, NPU_OP_SILU, y, -1, -1, z, 0, 0);
  assert_int_equal(npu_ir_builder_status(&b, NULL), NPULM_OK);
  /* the gather on the CPU, the rest on the NPU, as a partitioner leaves it without transfers */
  g.nodes[1].backend = g.nodes[2].backend = NPU_BE_NPU;
  g.tensors[y].backend = g.tensors[z].backend = NPU_BE_NPU;
  g.node_site = malloc(3 * sizeof(*g.node_site));
  assert_non_null(g.node_site);
  memcpy(g.node_site, (int32_t[]){-1, 5, 6}, 3 * sizeof(*g.node_site));

  npu_ir_builder_resume(&b, &g);
  npu_ir_cut_subgraphs(&b);
  assert_int_equal(g.n_subgraphs, 2);
  int32_t copy = npu_ir_add_copy(&b, x, NPU_BE_NPU, NULL);
  struct npu_ir_node transfer = {
      .op = NPU_OP_TRANSFER, .backend = NPU_BE_CPU, .in = {x, -1, -1}, .out = copy, .layer = -1};
  assert_int_equal(npu_ir_insert_node(&b, 1, &transfer), 1);
  g.nodes[2].in[0] = copy;
  assert_int_equal(npu_ir_builder_status(&b, NULL), NPULM_OK);
  assert_int_equal(g.n_nodes, 4);
  assert_int_equal(g.nodes[2].op, NPU_OP_SILU);
  assert_int_equal(g.nodes[3].out, z);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(g.node_site[i], ((int32_t[]){-1, -1, 5, 6})[i]);
  }
  assert_int_equal(g.n_subgraphs, 2);
  assert_int_equal(g.subgraphs[0].count, 2);
  assert_int_equal(g.subgraphs[1].first, 2);
  assert_int_equal(g.subgraphs[1].count, 2);
  assert_int_equal(g.tensors[copy].role, NPU_ROLE_EMBD);
  assert_int_equal(g.tensors[copy].layer, -1);
  assert_string_equal(g.tensors[copy].name, "embd");

  assert_int_equal(npu_ir_find_tensor(&g, -1, NPU_ROLE_EMBD), x);
  assert_int_equal(npu_ir_find_tensor(&g, 0, NPU_ROLE_FFN_GATE_PAR), z);
  assert_int_equal(npu_ir_find_tensor(&g, 1, NPU_ROLE_FFN_GATE_PAR), -1);
  assert_int_equal(npu_ir_writer_of(&g, z), 3);
  assert_int_equal(npu_ir_writer_of(&g, table), -1);
  assert_int_equal(npu_ir_value_on(&g, copy, NPU_BE_CPU), x);
  assert_int_equal(npu_ir_value_on(&g, x, NPU_BE_NPU), copy);
  assert_int_equal(npu_ir_value_on(&g, y, NPU_BE_CPU), -1);

  /* reads z before the node that writes it */
  int32_t early = npu_ir_add_copy(&b, z, NPU_BE_NPU, "early");
  struct npu_ir_node bad = {
      .op = NPU_OP_SILU, .backend = NPU_BE_NPU, .in = {z, -1, -1}, .out = early, .layer = 0};
  assert_int_equal(npu_ir_insert_node(&b, 0, &bad), -1);
  npulm_error err;
  assert_int_equal(npu_ir_builder_status(&b, &err), NPULM_ERR_ARG);
  assert_non_null(strstr(err.msg, "unwritten"));
  assert_int_equal(g.n_nodes, 4);
  assert_int_equal(g.nodes[0].op, NPU_OP_GATHER);
  assert_int_equal(g.node_site[2], 5);
  npu_graph_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul_matches_reference_bits),
      cmocka_unit_test(test_rmsnorm_matches_reference_bits),
      cmocka_unit_test(test_rope_matches_reference_bits),
      cmocka_unit_test(test_attention_matches_reference_bits),
      cmocka_unit_test(test_fused_attention_matches_reference_bits),
      cmocka_unit_test(test_attention_tiles_fold_matches_reference_bits),
      cmocka_unit_test(test_fused_attention_matches_double),
      cmocka_unit_test(test_touch_lines),
      cmocka_unit_test(test_step_policy),
      cmocka_unit_test(test_stories260k_matches_reference),
      cmocka_unit_test(test_tinystories5m_matches_reference),
      cmocka_unit_test(test_odd_chunks_and_short_context),
      cmocka_unit_test(test_greedy_identical),
      cmocka_unit_test(test_perplexity_identical),
      cmocka_unit_test(test_stats),
      cmocka_unit_test(test_session_arguments),
      cmocka_unit_test(test_roles_name_tensors),
      cmocka_unit_test(test_ir_insert_node),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
