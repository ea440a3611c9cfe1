/* After a session is created, evaluating a prompt and generating tokens performs no heap
 * allocation: the binary is linked with -Wl,--wrap for malloc, calloc, realloc, free,
 * aligned_alloc and posix_memalign (see the Makefile), so every call from the library lands in the
 * counting wrappers below, on any thread. */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "npulm.h"
#include "test_util.h"

static atomic_bool armed;
static atomic_long n_calls;

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);
void *__real_aligned_alloc(size_t align, size_t size);
int __real_posix_memalign(void **p, size_t align, size_t size);

static void count(void) {
  if (atomic_load(&armed)) atomic_fetch_add(&n_calls, 1);
}

void *__wrap_malloc(size_t size) {
  count();
  return __real_malloc(size);
}
void *__wrap_calloc(size_t n, size_t size) {
  count();
  return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t size) {
  count();
  return __real_realloc(p, size);
}
void __wrap_free(void *p) {
  if (p != NULL) count();
  __real_free(p);
}
void *__wrap_aligned_alloc(size_t align, size_t size) {
  count();
  return __real_aligned_alloc(align, size);
}
int __wrap_posix_memalign(void **p, size_t align, size_t size) {
  count();
  return __real_posix_memalign(p, align, size);
}

/* The wrappers see the library's allocations (the check that the wrapping is in effect). */
static void test_wrappers_count(void **state) {
  (void)state;
  npulm_sampler *s;
  npulm_error err;
  atomic_store(&n_calls, 0);
  atomic_store(&armed, true);
  npulm_sampler_params sp = npulm_sampler_default_params();
  assert_int_equal(npulm_sampler_create(&sp, 16, &s, &err), NPULM_OK);
  npulm_sampler_free(s);
  atomic_store(&armed, false);
  assert_true(atomic_load(&n_calls) >= 4);
}

/* Prompt (padded chunk, full chunks, a lone decode), generation, reset and a long prefill with
 * two chunks in flight: not one allocation. */
static void run_without_allocating(bool reference) {
  const char *path = test_shared_path("models/tinystories-5M.gguf");
  TEST_REQUIRE_FILE(path);
  npulm_model *m;
  npulm_error err;
  assert_int_equal(npulm_model_open(path, &m, &err), NPULM_OK);
  npulm_session_params p = npulm_session_default_params();
  p.reference = reference;
  p.n_ctx = 512;
  npulm_session *s;
  assert_int_equal(npulm_session_create(m, &p, &s, &err), NPULM_OK);
  npulm_sampler_params smp = npulm_sampler_default_params();
  smp.temp = 0.8f;
  smp.top_k = 40;
  smp.seed = 1;
  npulm_sampler *sampler;
  assert_int_equal(npulm_sampler_create(&smp, 512, &sampler, &err), NPULM_OK);
  enum { N = 300 };
  static int32_t ids[N];
  static float logits[N * 512];
  for (int i = 0; i < N; i++) ids[i] = 1 + (i * 37) % 500;
  npulm_session_stats stats;

  atomic_store(&n_calls, 0);
  atomic_store(&armed, true);
  npulm_status st = npulm_session_eval(s, ids, 40, logits, &err);       /* chunk 128, padded */
  if (st == NPULM_OK) st = npulm_session_eval(s, ids, 129, NULL, &err); /* 128 + decode */
  for (int i = 0; i < 30 && st == NPULM_OK; i++) {
    int32_t next = npulm_sampler_sample(sampler, npulm_session_logits(s));
    st = npulm_session_eval(s, &next, 1, NULL, &err);
  }
  npulm_session_reset(s);
  if (st == NPULM_OK) st = npulm_session_eval(s, ids, N, logits, &err); /* 3 chunks, overlapped */
  npulm_session_get_stats(s, &stats);
  atomic_store(&armed, false);

  assert_int_equal(st, NPULM_OK);
  print_message("%s engine: %ld allocation calls after session creation\n",
                reference ? "reference" : "compiled", atomic_load(&n_calls));
  assert_int_equal(atomic_load(&n_calls), 0);
  npulm_sampler_free(sampler);
  npulm_session_free(s);
  npulm_model_close(m);
}

static void test_compiled_engine_does_not_allocate(void **state) {
  (void)state;
  run_without_allocating(false);
}

static void test_reference_engine_does_not_allocate(void **state) {
  (void)state;
  run_without_allocating(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrappers_count),
      cmocka_unit_test(test_compiled_engine_does_not_allocate),
      cmocka_unit_test(test_reference_engine_does_not_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
