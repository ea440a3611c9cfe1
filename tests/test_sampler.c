/* Sampler: greedy is argmax, truncation keeps what it should, seeds reproduce, and sampled
 * frequencies follow the softmax. */
#include <math.h>
#include <string.h>

#include "npulm.h"
#include "test_util.h"

static npulm_sampler *make(float temp, int top_k, float top_p, uint64_t seed, int n_vocab) {
  npulm_sampler_params p = {.temp = temp, .top_k = top_k, .top_p = top_p, .seed = seed};
  npulm_sampler *s = NULL;
  npulm_error err;
  assert_int_equal(npulm_sampler_create(&p, n_vocab, &s, &err), NPULM_OK);
  return s;
}

static void random_logits(float *l, int n, uint64_t *rng) {
  for (int i = 0; i < n; i++) l[i] = (float)(test_rand(rng) % 20000) / 1000.0f - 10.0f;
}

static void test_greedy_is_argmax(void **state) {
  (void)state;
  uint64_t rng = 7;
  float logits[1000];
  for (int trial = 0; trial < 50; trial++) {
    int n = 1 + (int)(test_rand(&rng) % 1000);
    random_logits(logits, n, &rng);
    int best = 0;
    for (int i = 1; i < n; i++) best = logits[i] > logits[best] ? i : best;
    npulm_sampler *greedy = make(0.0f, 40, 0.95f, 1, n);
    npulm_sampler *top1 = make(1.0f, 1, 1.0f, 1, n);
    npulm_sampler *tiny_p = make(1.0f, 0, 1e-6f, 1, n);
    assert_int_equal(npulm_sampler_sample(greedy, logits), best);
    assert_int_equal(npulm_sampler_sample(top1, logits), best);
    assert_int_equal(npulm_sampler_sample(tiny_p, logits), best);
    npulm_sampler_free(greedy);
    npulm_sampler_free(top1);
    npulm_sampler_free(tiny_p);
  }
}

static void test_top_k_keeps_only_k(void **state) {
  (void)state;
  enum { N = 300, K = 5 };
  uint64_t rng = 11;
  float logits[N];
  random_logits(logits, N, &rng);
  float sorted[N];
  memcpy(sorted, logits, sizeof(sorted));
  /* the K-th largest value */
  for (int i = 0; i < K; i++) {
    for (int j = i + 1; j < N; j++) {
      if (sorted[j] > sorted[i]) {
        float t = sorted[i];
        sorted[i] = sorted[j];
        sorted[j] = t;
      }
    }
  }
  npulm_sampler *s = make(5.0f, K, 1.0f, 3, N);
  for (int i = 0; i < 2000; i++) {
    int32_t id = npulm_sampler_sample(s, logits);
    assert_true(id >= 0 && id < N);
    assert_true(logits[id] >= sorted[K - 1]);
  }
  npulm_sampler_free(s);
}

static void test_seed_reproduces(void **state) {
  (void)state;
  enum { N = 100 };
  uint64_t rng = 5;
  float logits[N];
  random_logits(logits, N, &rng);
  npulm_sampler *a = make(1.0f, 0, 1.0f, 42, N), *b = make(1.0f, 0, 1.0f, 42, N);
  npulm_sampler *c = make(1.0f, 0, 1.0f, 43, N);
  int differ = 0;
  for (int i = 0; i < 200; i++) {
    int32_t x = npulm_sampler_sample(a, logits), y = npulm_sampler_sample(b, logits);
    assert_int_equal(x, y);
    differ += x != npulm_sampler_sample(c, logits);
  }
  assert_true(differ > 0);
  npulm_sampler_free(a);
  npulm_sampler_free(b);
  npulm_sampler_free(c);
}

static void test_frequencies_follow_softmax(void **state) {
  (void)state;
  float logits[4] = {1.0f, 2.0f, 0.0f, 1.5f};
  double p[4], sum = 0;
  for (int i = 0; i < 4; i++) sum += p[i] = exp(logits[i]);
  npulm_sampler *s = make(1.0f, 0, 1.0f, 9, 4);
  enum { DRAWS = 40000 };
  int count[4] = {0};
  for (int i = 0; i < DRAWS; i++) count[npulm_sampler_sample(s, logits)]++;
  for (int i = 0; i < 4; i++) {
    double expect = p[i] / sum, got = (double)count[i] / DRAWS;
    assert_true(fabs(got - expect) < 0.015); /* > 5 standard deviations */
  }
  npulm_sampler_free(s);
}

static void test_bad_params(void **state) {
  (void)state;
  npulm_sampler *s = NULL;
  npulm_error err;
  npulm_sampler_params bad[] = {{-1.0f, 0, 1.0f, 0}, {1.0f, -2, 1.0f, 0},   {1.0f, 0, 0.0f, 0},
                                {1.0f, 0, 1.5f, 0},  {NAN, 0, 1.0f, 0},     {INFINITY, 0, 1.0f, 0},
                                {1.0f, 0, NAN, 0},   {1.0f, 0, INFINITY, 0}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err.msg[0] = '\0';
    assert_int_equal(npulm_sampler_create(&bad[i], 10, &s, &err), NPULM_ERR_ARG);
    assert_null(s);
    assert_true(strlen(err.msg) > 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy_is_argmax), cmocka_unit_test(test_top_k_keeps_only_k),
      cmocka_unit_test(test_seed_reproduces),  cmocka_unit_test(test_frequencies_follow_softmax),
      cmocka_unit_test(test_bad_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
