/* SmoothQuant's choice of alpha (compiler/smooth.c): on a synthetic activation with one outlier
 * channel the predicted error picks some smoothing, on one without it picks none, and a forced
 * alpha gives SmoothQuant's own factors; a compile with the choice records what it took. */
#include <math.h>
#include <string.h>

#include "compiler/compiler.h"
#include "compiler/smooth.h"
#include "model/model.h"
#include "test_util.h"

enum { K = 64, N = 48, ROWS = 1024, OUTLIER = 7 };

/* A group of one matmul: weights uniform in [-0.1, 0.1) from a fixed seed (or, 'flat', +-0.1 with
 * random signs: every column's maximum the same); every channel of mean square 1 and maximum 4,
 * but channel OUTLIER, 30 times larger, when 'outlier'. */
struct fixture {
  float w[N * K], absmax[K];
  double meansq[K];
  struct npu_smooth_input x;
  struct npu_smooth_matmul mm;
};

static void make_fixture(struct fixture *f, bool outlier, bool flat) {
  uint32_t seed = 12345;
  for (int i = 0; i < N * K; i++) {
    seed = seed * 1664525u + 1013904223u;
    f->w[i] =
        flat ? (seed >> 31 ? 0.1f : -0.1f) : ((float)(seed >> 8) / (float)(1u << 24) - 0.5f) * 0.2f;
  }
  for (int c = 0; c < K; c++) {
    const float scale = outlier && c == OUTLIER ? 30.0f : 1.0f;
    f->absmax[c] = 4.0f * scale;
    f->meansq[c] = (double)scale * scale;
  }
  f->x = (struct npu_smooth_input){.k = K,
                                   .absmax = f->absmax,
                                   .meansq = f->meansq,
                                   .range = 2.0f * f->absmax[outlier ? OUTLIER : 0],
                                   .rows = ROWS,
                                   .act_steps = 255.0,
                                   .w_levels = 127.0};
  f->mm = (struct npu_smooth_matmul){f->w, N, K};
}

static double error_of(const struct fixture *f, const float *s) {
  double scratch[K];
  return npu_smooth_error(&f->x, &f->mm, 1, s, scratch);
}

static void test_outlier_is_smoothed(void **state) {
  (void)state;
  static struct fixture f;
  make_fixture(&f, true, false);
  float s[K], alpha;
  double err;
  npulm_error e;
  assert_int_equal(npu_smooth_choose(&f.x, &f.mm, 1, K, NULL, NPU_SMOOTH_AUTO, s, &alpha, &err, &e),
                   NPULM_OK);
  assert_true(alpha != NPU_SMOOTH_NONE); /* some smoothing */
  const double none = error_of(&f, NULL);
  assert_true(err < 0.5 * none);
  assert_true(fabs(error_of(&f, s) - err) <= 1e-12 * err); /* the factors it reports are its own */
  /* the outlier channel is divided by more than the others */
  for (int c = 0; c < K; c++) {
    if (c != OUTLIER) assert_true(s[OUTLIER] > s[c]);
  }
  /* one of the candidates */
  bool candidate = false;
  for (int i = 0; i < NPU_SMOOTH_CANDIDATES; i++) candidate |= alpha == npu_smooth_candidate(i);
  assert_true(candidate);
}

static void test_no_outlier_is_left_alone(void **state) {
  (void)state;
  static struct fixture f;
  make_fixture(&f, false, true);
  float s[K], alpha;
  double err;
  npulm_error e;
  assert_int_equal(npu_smooth_choose(&f.x, &f.mm, 1, K, NULL, NPU_SMOOTH_AUTO, s, &alpha, &err, &e),
                   NPULM_OK);
  /* channels alike, and the weights' columns: every alpha's factors are one constant, which
   * moves nothing (both scales follow it), so none is kept */
  assert_true(alpha == NPU_SMOOTH_NONE);
  assert_true(err == error_of(&f, NULL));
  for (int c = 0; c < K; c++) assert_true(s[c] == 1.0f);
  /* with the weights uniform the columns differ a little: whatever is taken predicts no more */
  make_fixture(&f, false, false);
  assert_int_equal(npu_smooth_choose(&f.x, &f.mm, 1, K, NULL, NPU_SMOOTH_AUTO, s, &alpha, &err, &e),
                   NPULM_OK);
  assert_true(err <= error_of(&f, NULL));
}

static void test_forced_alpha(void **state) {
  (void)state;
  static struct fixture f;
  make_fixture(&f, true, false);
  float s[K], want[K], wmax[K], alpha;
  npulm_error e;
  assert_int_equal(npu_smooth_choose(&f.x, &f.mm, 1, K, NULL, 0.5f, s, &alpha, NULL, &e), NPULM_OK);
  assert_true(alpha == 0.5f);
  for (int c = 0; c < K; c++) {
    wmax[c] = 0.0f;
    for (int r = 0; r < N; r++) wmax[c] = fmaxf(wmax[c], fabsf(f.w[r * K + c]));
  }
  npu_smooth_factors(f.absmax, wmax, K, 0.5f, want);
  assert_memory_equal(s, want, sizeof(s));
}

/* Factors shared through a map: channels 2c and 2c + 1 take factor c, from the larger maximum
 * of the pair. */
static void test_shared_factors(void **state) {
  (void)state;
  static struct fixture f;
  make_fixture(&f, true, false);
  int32_t map[K];
  for (int c = 0; c < K; c++) map[c] = c / 2;
  float s[K / 2], alpha;
  npulm_error e;
  assert_int_equal(
      npu_smooth_choose(&f.x, &f.mm, 1, K / 2, map, NPU_SMOOTH_AUTO, s, &alpha, NULL, &e),
      NPULM_OK);
  assert_true(alpha != NPU_SMOOTH_NONE);
  for (int j = 0; j < K / 2; j++) {
    if (j != OUTLIER / 2) assert_true(s[OUTLIER / 2] > s[j]);
  }
}

/* stories260K compiled with the choice: the program says so, and records a candidate (or none)
 * for every block and group; a forced alpha records itself. */
static void test_compile_records_alphas(void **state) {
  (void)state;
  npulm_model *m = test_open_shared("models/stories260K.gguf");
  npulm_compile_params cp = npulm_compile_default_params();
  cp.smooth_alpha = NPULM_SMOOTH_ALPHA_AUTO;
  npulm_error e;
  if (npulm_model_compile(m, &cp, &e) != NPULM_OK) fail_msg("%s", e.msg);
  const struct npu_program *p = m->program;
  assert_true(p->smooth_alpha == NPU_SMOOTH_AUTO);
  assert_non_null(p->smooth_alphas);
  int smoothed = 0;
  for (int32_t i = 0; i < m->cfg.n_layers * NPU_SMOOTH_GROUPS; i++) {
    const float a = p->smooth_alphas[i];
    bool candidate = a == NPU_SMOOTH_NONE;
    for (int k = 0; k < NPU_SMOOTH_CANDIDATES; k++) candidate |= a == npu_smooth_candidate(k);
    assert_true(candidate);
    smoothed += a != NPU_SMOOTH_NONE;
  }
  assert_true(smoothed > 0);
  cp.smooth_alpha = 0.4f;
  if (npulm_model_compile(m, &cp, &e) != NPULM_OK) fail_msg("%s", e.msg);
  p = m->program;
  assert_true(p->smooth_alpha == 0.4f);
  for (int32_t i = 0; i < m->cfg.n_layers * NPU_SMOOTH_GROUPS; i++) {
    assert_true(p->smooth_alphas[i] == 0.4f);
  }
  cp.smooth_alpha = -0.5f; /* neither an alpha nor the choice */
  assert_int_equal(npulm_model_compile(m, &cp, &e), NPULM_ERR_ARG);
  npulm_model_close(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outlier_is_smoothed),
      cmocka_unit_test(test_no_outlier_is_left_alone),
      cmocka_unit_test(test_forced_alpha),
      cmocka_unit_test(test_shared_factors),
      cmocka_unit_test(test_compile_records_alphas),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
