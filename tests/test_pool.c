/* The data-parallel thread pool: every task of every loop runs exactly once whatever the mix of
 * helpers and lending threads, a loop returns only when its tasks are done, a thread that waits
 * elsewhere can lend itself, each thread's tasks see its lane, bad sizes are refused; and a
 * session whose matmuls and row-wise ops are cut across threads gives the same bits as on one
 * thread. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "base/pool.h"
#include "npulm.h"
#include "test_util.h"

enum { MAX_TASKS = 300 };

struct count_loop {
  atomic_int runs[MAX_TASKS];
  atomic_int in_flight; /* tasks running now: must be 0 when a loop returns */
};

static void count_task(void *arg, size_t task) {
  struct count_loop *c = arg;
  atomic_fetch_add(&c->in_flight, 1);
  /* a little work of varying length, so that claims interleave */
  volatile uint32_t x = (uint32_t)task;
  for (uint32_t i = 0; i < (uint32_t)(task % 7) * 200; i++) x = x * 1103515245u + 12345u;
  atomic_fetch_add(&c->runs[task], 1);
  atomic_fetch_sub(&c->in_flight, 1);
}

/* Many loops of varying sizes on one pool: each task once, none still running at return. */
static void run_loops(struct npu_pool *pool, int n_loops) {
  static struct count_loop c;
  uint64_t rng = 12345;
  for (int l = 0; l < n_loops; l++) {
    size_t n = (size_t)(test_rand(&rng) % MAX_TASKS);
    for (size_t i = 0; i < MAX_TASKS; i++) atomic_store(&c.runs[i], 0);
    npu_pool_run(pool, n, count_task, &c);
    assert_int_equal(atomic_load(&c.in_flight), 0);
    for (size_t i = 0; i < MAX_TASKS; i++) assert_int_equal(atomic_load(&c.runs[i]), i < n ? 1 : 0);
  }
}

static void test_every_task_once(void **state) {
  (void)state;
  run_loops(NULL, 20);
  for (int threads = 1; threads <= 4; threads++) {
    for (int helpers = 0; helpers < threads; helpers++) {
      struct npu_pool *pool;
      npulm_error err;
      assert_int_equal(npu_pool_create(threads, helpers, &pool, &err), NPULM_OK);
      assert_int_equal(npu_pool_threads(pool), threads);
      run_loops(pool, 300);
      npu_pool_free(pool);
    }
  }
}

/* A thread that lends itself until told to stop, as a waiting scheduler worker does. */
struct lender {
  struct npu_pool *pool;
  atomic_bool stop;
  atomic_int ran; /* loops it helped with */
};

static void *lender_main(void *arg) {
  struct lender *l = arg;
  while (!atomic_load(&l->stop)) {
    if (npu_pool_help(l->pool)) atomic_fetch_add(&l->ran, 1);
  }
  return NULL;
}

struct wait_for_other {
  pthread_t caller;
  bool wait;
  atomic_bool other_ran;
};

/* Notes whether a thread other than the caller ran a task; with 'wait', task 0 waits (at most
 * 10 s) until one has. */
static void wait_task(void *arg, size_t task) {
  struct wait_for_other *w = arg;
  if (!pthread_equal(pthread_self(), w->caller)) atomic_store(&w->other_ran, true);
  if (task != 0 || !w->wait) return;
  double until = test_now_s() + 10.0;
  while (!atomic_load(&w->other_ran) && test_now_s() < until) sched_yield();
}

static void test_lender_helps(void **state) {
  (void)state;
  struct npu_pool *pool;
  npulm_error err;
  assert_int_equal(npu_pool_create(2, 0, &pool, &err), NPULM_OK); /* no helper of its own */
  struct lender l = {.pool = pool};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, lender_main, &l), 0);
  run_loops(pool, 200);
  struct wait_for_other w = {.caller = pthread_self(), .wait = true};
  npu_pool_run(pool, 2, wait_task, &w); /* task 1 is left for the lender while task 0 waits */
  atomic_store(&l.stop, true);
  pthread_join(th, NULL);
  assert_true(atomic_load(&w.other_ran));
  assert_true(atomic_load(&l.ran) > 0);
  npu_pool_free(pool);
}

/* Which lane (npu_pool_lane) each task of a loop ran in, and whether on the caller or the lender;
 * task 0 waits (at most 10 s) until some other thread has run a task. */
struct lane_loop {
  pthread_t caller, lender;
  atomic_bool other_ran;
  size_t lane[MAX_TASKS];
  int by[MAX_TASKS]; /* 0 the caller, 1 a helper, 2 the lender */
};

static void lane_task(void *arg, size_t task) {
  struct lane_loop *l = arg;
  const bool caller = pthread_equal(pthread_self(), l->caller);
  l->lane[task] = npu_pool_lane();
  l->by[task] = caller ? 0 : pthread_equal(pthread_self(), l->lender) ? 2 : 1;
  if (!caller) atomic_store(&l->other_ran, true);
  double until = test_now_s() + 10.0;
  while (task == 0 && !atomic_load(&l->other_ran) && test_now_s() < until) sched_yield();
}

/* The caller's tasks run in lane 0, the one helper's in lane 1, the lender's in lane 2, loop after
 * loop; a thread that has lent itself to one pool runs its own loop, even a one-task loop run
 * inline, in lane 0. */
static void test_lanes(void **state) {
  (void)state;
  struct npu_pool *pool, *own;
  npulm_error err;
  assert_int_equal(npu_pool_create(3, 1, &pool, &err), NPULM_OK);
  assert_int_equal(npu_pool_create(2, 1, &own, &err), NPULM_OK); /* the lender's own loops */
  struct lender l = {.pool = pool};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, lender_main, &l), 0);
  static struct lane_loop loop;
  int seen[3] = {0};
  for (int n = 0; n < 50; n++) {
    loop = (struct lane_loop){.caller = pthread_self(), .lender = th};
    npu_pool_run(pool, 8, lane_task, &loop);
    for (size_t t = 0; t < 8; t++) {
      assert_int_equal(loop.lane[t], (size_t)loop.by[t]);
      seen[loop.by[t]]++;
    }
  }
  atomic_store(&l.stop, true);
  pthread_join(th, NULL);
  assert_true(seen[0] > 0 && seen[1] + seen[2] > 0);
  assert_false(npu_pool_help(pool)); /* no loop in progress: lends itself all the same */
  loop = (struct lane_loop){.caller = pthread_self(), .lender = th};
  npu_pool_run(own, 1, lane_task, &loop);
  assert_int_equal(loop.lane[0], 0);
  npu_pool_free(own);
  npu_pool_free(pool);
}

static void test_single_thread_runs_on_caller(void **state) {
  (void)state;
  struct npu_pool *pool;
  npulm_error err;
  assert_int_equal(npu_pool_create(1, 0, &pool, &err), NPULM_OK);
  struct wait_for_other w = {.caller = pthread_self()};
  npu_pool_run(pool, 50, wait_task, &w);
  assert_false(atomic_load(&w.other_ran));
  assert_false(npu_pool_help(pool));
  npu_pool_free(pool);
  npu_pool_free(NULL);
}

static void test_bad_sizes(void **state) {
  (void)state;
  struct npu_pool *pool = (struct npu_pool *)&pool;
  npulm_error err;
  assert_int_equal(npu_pool_create(0, 0, &pool, &err), NPULM_ERR_ARG);
  assert_null(pool);
  assert_non_null(strstr(err.msg, "below 1"));
  assert_int_equal(npu_pool_create(2, 2, &pool, &err), NPULM_ERR_ARG);
  assert_int_equal(npu_pool_create(2, -1, &pool, &err), NPULM_ERR_ARG);
}

/* Logits of a prompt and a few decode steps on a session with 'threads' threads. */
static float *session_logits(npulm_model *m, int threads, size_t *n_out) {
  npulm_session_params sp = npulm_session_default_params();
  sp.n_threads = threads;
  sp.n_ctx = 256;
  npulm_session *s;
  npulm_error err;
  assert_int_equal(npulm_session_create(m, &sp, &s, &err), NPULM_OK);
  npulm_model_info info;
  npulm_model_get_info(m, &info);
  const int n_vocab = info.n_vocab;
  enum { PROMPT = 150, DECODE = 4 };
  int32_t tokens[PROMPT + DECODE];
  for (int i = 0; i < PROMPT + DECODE; i++) tokens[i] = (int32_t)((i * 37 + 11) % n_vocab);
  float *logits = malloc((size_t)(PROMPT + DECODE) * (size_t)n_vocab * sizeof(float));
  assert_non_null(logits);
  assert_int_equal(npulm_session_eval(s, tokens, PROMPT, logits, &err), NPULM_OK);
  for (int i = 0; i < DECODE; i++) {
    assert_int_equal(npulm_session_eval(s, tokens + PROMPT + i, 1,
                                        logits + (size_t)(PROMPT + i) * (size_t)n_vocab, &err),
                     NPULM_OK);
  }
  npulm_session_free(s);
  *n_out = (size_t)(PROMPT + DECODE) * (size_t)n_vocab;
  return logits;
}

/* 'model' compiled with 'quant' gives the same logits on 1, 3 and 4 threads. tinystories-5M's
 * rows are wide enough for the row-wise ops of both backends (the NPU's integer ones too) to be
 * cut. */
static void check_threads_bit_identical(const char *model, const char *quant) {
  const char *path = test_shared_path(model);
  TEST_REQUIRE_FILE(path);
  npulm_model *m;
  npulm_error err;
  assert_int_equal(npulm_model_open(path, &m, &err), NPULM_OK);
  npulm_compile_params cp = npulm_compile_default_params();
  cp.calib_tokens = 64;
  cp.quant = quant;
  assert_int_equal(npulm_model_compile(m, &cp, &err), NPULM_OK);
  size_t n1, n3, n4;
  float *one = session_logits(m, 1, &n1);
  float *three = session_logits(m, 3, &n3); /* shares that do not divide the columns evenly */
  float *four = session_logits(m, 4, &n4);
  assert_int_equal(n1, n3);
  assert_int_equal(n1, n4);
  assert_memory_equal(one, three, n1 * sizeof(float));
  assert_memory_equal(one, four, n1 * sizeof(float));
  free(one);
  free(three);
  free(four);
  npulm_model_close(m);
}

static void test_threads_bit_identical(void **state) {
  (void)state;
  check_threads_bit_identical("models/stories260K.gguf", "w8a8-smooth");
  check_threads_bit_identical("models/tinystories-5M.gguf", "w8a8-naive");
  check_threads_bit_identical("models/tinystories-5M.gguf", "f32");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_task_once), cmocka_unit_test(test_lender_helps),
      cmocka_unit_test(test_lanes),           cmocka_unit_test(test_single_thread_runs_on_caller),
      cmocka_unit_test(test_bad_sizes),       cmocka_unit_test(test_threads_bit_identical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
