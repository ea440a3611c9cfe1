/* The scheduler: a job of several steps runs each subgraph on its backend's worker, every one once
 * and in dependency order; a job of one step runs every subgraph on the calling thread, in order,
 * while the NPU's worker lends itself to the step's loops; the stats count each subgraph's time as
 * its backend's either way; one scheduler runs such jobs in any order. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "base/pool.h"
#include "ir/ir.h"
#include "runtime/scheduler.h"
#include "test_util.h"

enum { N_SUBGRAPHS = 5, MAX_STEPS = 3 };

/* Subgraphs alternate between the backends, as a compiled graph's do. */
static struct npu_subgraph subgraphs[N_SUBGRAPHS] = {{0, 1, NPU_BE_NPU},
                                                     {1, 1, NPU_BE_CPU},
                                                     {2, 1, NPU_BE_NPU},
                                                     {3, 1, NPU_BE_CPU},
                                                     {4, 1, NPU_BE_NPU}};
static const struct npu_graph graph = {
    .rows = 1, .n_subgraphs = N_SUBGRAPHS, .subgraphs = subgraphs};

struct record {
  struct npu_pool *npu_pool;
  pthread_t caller;
  atomic_int clock;                       /* ticks once per task */
  int at[MAX_STEPS][N_SUBGRAPHS];         /* the clock when each task started, -1 never */
  bool on_caller[MAX_STEPS][N_SUBGRAPHS]; /* whether it ran on the thread of npu_sched_run */
  atomic_bool other_ran;                  /* a thread other than the caller ran a loop task */
};

/* A loop task: notes a thread other than the caller; task 0 waits (at most 10 s) until one ran a
 * task, so the loop's second task is left to a lending thread. */
static void loop_task(void *arg, size_t task) {
  struct record *r = arg;
  if (!pthread_equal(pthread_self(), r->caller)) atomic_store(&r->other_ran, true);
  double until = test_now_s() + 10.0;
  while (task == 0 && !atomic_load(&r->other_ran) && test_now_s() < until) sched_yield();
}

static void run_task(void *user, int32_t step, int32_t sub, int32_t slot) {
  struct record *r = user;
  (void)slot;
  r->at[step][sub] = atomic_fetch_add(&r->clock, 1);
  r->on_caller[step][sub] = pthread_equal(pthread_self(), r->caller);
  /* a little work, so that tasks of different steps can interleave; before the loop, longer than
   * a waiting worker spins before it sleeps, so that the loop finds a helper only if the worker
   * knows a task is running */
  double until = test_now_s() + (sub == 2 ? 2e-3 : 20e-6);
  while (test_now_s() < until) {
  }
  if (sub == 2) npu_pool_run(r->npu_pool, 2, loop_task, r);
}

/* Pools of two threads with no helper threads of their own, and a scheduler over them. */
struct fixture {
  struct npu_pool *pools[NPU_BE_COUNT];
  struct npu_sched *s;
};

static void fixture_open(struct fixture *f) {
  npulm_error err;
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    assert_int_equal(npu_pool_create(2, 0, &f->pools[be], &err), NPULM_OK);
  }
  assert_int_equal(npu_sched_create(f->pools, &f->s, &err), NPULM_OK);
}

static void fixture_close(struct fixture *f) {
  npu_sched_free(f->s);
  for (int be = 0; be < NPU_BE_COUNT; be++) npu_pool_free(f->pools[be]);
}

/* Run a job of 'n_steps' steps of 'graph' (with or without measured costs) and fill 'r'. */
static void run_job(struct fixture *f, int32_t n_steps, bool with_cost, struct record *r) {
  *r = (struct record){.npu_pool = f->pools[NPU_BE_NPU], .caller = pthread_self()};
  for (int c = 0; c < MAX_STEPS; c++) {
    for (int i = 0; i < N_SUBGRAPHS; i++) r->at[c][i] = -1;
  }
  const struct npu_graph *graphs[MAX_STEPS] = {&graph, &graph, &graph};
  static double costs[N_SUBGRAPHS];
  double *cost[MAX_STEPS] = {costs, costs, costs};
  for (int i = 0; i < N_SUBGRAPHS; i++) costs[i] = 0.0;
  const struct npu_sched_job job = {.n_steps = n_steps,
                                    .graphs = graphs,
                                    .cost = with_cost ? cost : NULL,
                                    .run = run_task,
                                    .user = r};
  npu_sched_run(f->s, &job);
  for (int i = 0; i < N_SUBGRAPHS; i++) assert_true(with_cost ? costs[i] > 0.0 : costs[i] == 0.0);
}

/* Every subgraph of a one-step job ran on the caller, in order, and the NPU's worker helped with
 * the loop. */
static void check_one_step(const struct record *r) {
  for (int i = 0; i < N_SUBGRAPHS; i++) {
    assert_int_equal(r->at[0][i], i);
    assert_true(r->on_caller[0][i]);
  }
  assert_true(atomic_load(&r->other_ran));
}

/* Every task of a job of MAX_STEPS steps ran once, on its backend's worker, after the tasks it
 * depends on. */
static void check_steps(const struct record *r) {
  for (int c = 0; c < MAX_STEPS; c++) {
    for (int i = 0; i < N_SUBGRAPHS; i++) {
      assert_true(r->at[c][i] >= 0);
      assert_true(r->on_caller[c][i] == (subgraphs[i].backend == NPU_BE_CPU));
      if (i > 0) assert_true(r->at[c][i] > r->at[c][i - 1]);
      if (c > 0) assert_true(r->at[c][i] > r->at[c - 1][i]);
    }
  }
  assert_int_equal(atomic_load(&r->clock), MAX_STEPS * N_SUBGRAPHS);
}

/* A job of 'n_steps' on a fresh scheduler, checked by 'check'; its stats in 'st'. */
static void run_fresh(int32_t n_steps, void (*check)(const struct record *),
                      struct npu_sched_stats *st) {
  struct fixture f;
  fixture_open(&f);
  struct record r;
  run_job(&f, n_steps, true, &r);
  check(&r);
  npu_sched_get_stats(f.s, st);
  fixture_close(&f);
}

static void test_one_step_on_caller(void **state) {
  (void)state;
  for (int rep = 0; rep < 10; rep++) {
    struct npu_sched_stats st;
    run_fresh(1, check_one_step, &st);
    assert_true(st.busy_s[NPU_BE_NPU] > 0.0 && st.busy_s[NPU_BE_CPU] > 0.0);
    assert_true(st.overlap_s == 0.0);
    assert_int_equal(st.n_tasks, N_SUBGRAPHS);
  }
}

static void test_steps_on_their_workers(void **state) {
  (void)state;
  for (int rep = 0; rep < 10; rep++) {
    struct npu_sched_stats st;
    run_fresh(MAX_STEPS, check_steps, &st);
    assert_true(st.busy_s[NPU_BE_NPU] > 0.0 && st.busy_s[NPU_BE_CPU] > 0.0);
    assert_int_equal(st.n_tasks, MAX_STEPS * N_SUBGRAPHS);
  }
}

/* One scheduler runs one-step and several-step jobs in turn, with and without costs, and a
 * one-step job after a pause long enough for the NPU's worker to have gone to sleep. */
static void test_jobs_in_turn(void **state) {
  (void)state;
  struct fixture f;
  fixture_open(&f);
  struct record r;
  for (int rep = 0; rep < 6; rep++) {
    const bool with_cost = rep % 2 == 0;
    run_job(&f, 1, with_cost, &r);
    check_one_step(&r);
    run_job(&f, MAX_STEPS, with_cost, &r);
    check_steps(&r);
    const double until = test_now_s() + 5e-3;
    while (test_now_s() < until) sched_yield();
  }
  struct npu_sched_stats st;
  npu_sched_get_stats(f.s, &st);
  assert_int_equal(st.n_tasks, 6 * (1 + MAX_STEPS) * N_SUBGRAPHS);
  fixture_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_step_on_caller),
      cmocka_unit_test(test_steps_on_their_workers),
      cmocka_unit_test(test_jobs_in_turn),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
