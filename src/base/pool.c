/* The data-parallel thread pool (see pool.h).
 *
 * One 64-bit ticket holds the loop in progress: its generation (high half) and the next unclaimed
 * task (low half). A thread claims task i of generation g by moving the ticket from (g, i) to
 * (g, i+1) with a compare-and-swap, so a claim can only succeed while g is the current loop; a
 * helper that was descheduled with a stale view of the ticket fails its claim and goes back to
 * waiting. A loop's description (function, argument, count, tasks finished) lives in one of two
 * slots by the parity of its generation: the slot of loop g is rewritten only for loop g+2, after
 * loop g+1 was published, when no claim on g can succeed any more.
 *
 * Helpers wait for a new generation by spinning briefly (a decode step runs dozens of short loops
 * back to back: waking a sleeping thread costs tens of microseconds) and then sleeping on a
 * condition variable; the caller signals only when some helper sleeps. */
#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/common.h"

/* How long a helper spins for the next loop before it sleeps. */
#define SPIN_S 200e-6

struct loop {
  _Atomic(npu_pool_task_fn *) fn;
  _Atomic(void *) arg;
  atomic_uint_fast32_t n_tasks;
  atomic_uint_fast32_t finished;
};

struct npu_pool {
  int n_threads;
  int n_helpers_started;
  atomic_size_t helper_lanes; /* lanes the helpers took, 1 onwards */
  pthread_t *helpers;
  _Atomic uint64_t ticket; /* (generation << 32) | next task */
  struct loop loops[2];    /* the description of generation g is loops[g & 1] */
  uint32_t generation;     /* the caller's: of the last loop published */
  atomic_bool stop;
  atomic_int n_sleeping;
  pthread_mutex_t lock;
  pthread_cond_t wake;
};

static inline uint32_t gen_of(uint64_t ticket) { return (uint32_t)(ticket >> 32); }

/* The calling thread's lane (npu_pool_lane): set by npu_pool_run for its caller, by each helper
 * for itself, and by npu_pool_help for a lender. */
static _Thread_local size_t thread_lane;

size_t npu_pool_lane(void) { return thread_lane; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Claim and run tasks of the loop whose ticket was read as 't' until it has none left; return
 * whether any ran. */
static bool work(struct npu_pool *pool, uint64_t t) {
  const uint32_t g = gen_of(t);
  struct loop *lp = &pool->loops[g & 1];
  npu_pool_task_fn *fn = atomic_load_explicit(&lp->fn, memory_order_relaxed);
  void *arg = atomic_load_explicit(&lp->arg, memory_order_relaxed);
  const uint32_t n = (uint32_t)atomic_load_explicit(&lp->n_tasks, memory_order_relaxed);
  /* fn, arg and n may belong to a later loop if this one is long over; then no claim succeeds */
  bool ran = false;
  while (gen_of(t) == g && (uint32_t)t < n) {
    if (atomic_compare_exchange_weak_explicit(&pool->ticket, &t, t + 1, memory_order_acq_rel,
                                              memory_order_acquire)) {
      fn(arg, (uint32_t)t);
      atomic_fetch_add_explicit(&lp->finished, 1, memory_order_release);
      ran = true;
      t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
    }
  }
  return ran;
}

bool npu_pool_help(struct npu_pool *pool) {
  thread_lane = (size_t)pool->n_helpers_started + 1;
  return work(pool, atomic_load_explicit(&pool->ticket, memory_order_acquire));
}

/* Wait until the ticket's generation differs from 'seen' (or the pool stops); return the ticket. */
static uint64_t wait_loop(struct npu_pool *pool, uint32_t seen) {
  double until = npu_now() + SPIN_S;
  for (unsigned i = 1;; i++) {
    uint64_t t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
    if (gen_of(t) != seen || atomic_load_explicit(&pool->stop, memory_order_relaxed)) return t;
    cpu_relax();
    if (i % 256 == 0 && npu_now() > until) break;
  }
  pthread_mutex_lock(&pool->lock);
  atomic_fetch_add(&pool->n_sleeping, 1);
  /* the caller publishes and then reads n_sleeping (both sequentially consistent): either it sees
   * this sleeper and signals under the lock, or this check sees its loop */
  uint64_t t = atomic_load(&pool->ticket);
  while (gen_of(t) == seen && !atomic_load(&pool->stop)) {
    pthread_cond_wait(&pool->wake, &pool->lock);
    t = atomic_load(&pool->ticket);
  }
  atomic_fetch_sub(&pool->n_sleeping, 1);
  pthread_mutex_unlock(&pool->lock);
  return t;
}

static void *helper_main(void *arg) {
  struct npu_pool *pool = arg;
  uint32_t seen = 0;
  thread_lane = 1 + atomic_fetch_add(&pool->helper_lanes, 1);
  for (;;) {
    uint64_t t = wait_loop(pool, seen);
    if (atomic_load_explicit(&pool->stop, memory_order_relaxed)) break;
    seen = gen_of(t);
    work(pool, t);
  }
  return NULL;
}

npulm_status npu_pool_create(int n_threads, int n_helpers, struct npu_pool **out,
                             npulm_error *err) {
  *out = NULL;
  if (n_threads < 1) return npu_fail(err, NPULM_ERR_ARG, "thread count %d is below 1", n_threads);
  if (n_helpers < 0 || n_helpers >= n_threads) {
    return npu_fail(err, NPULM_ERR_ARG, "%d helper threads for loops on %d threads", n_helpers,
                    n_threads);
  }
  struct npu_pool *pool = calloc(1, sizeof(*pool));
  if (pool == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory creating a thread pool");
  pool->n_threads = n_threads;
  if (pthread_mutex_init(&pool->lock, NULL) != 0) {
    free(pool);
    return npu_fail(err, NPULM_ERR_NOMEM, "could not create the thread pool's lock");
  }
  if (pthread_cond_init(&pool->wake, NULL) != 0) {
    pthread_mutex_destroy(&pool->lock);
    free(pool);
    return npu_fail(err, NPULM_ERR_NOMEM, "could not create the thread pool's condition");
  }
  if (n_helpers > 0) {
    pool->helpers = calloc((size_t)n_helpers, sizeof(pthread_t));
    if (pool->helpers == NULL) {
      npu_pool_free(pool);
      return npu_fail(err, NPULM_ERR_NOMEM, "out of memory creating a thread pool");
    }
  }
  for (int i = 0; i < n_helpers; i++) {
    if (pthread_create(&pool->helpers[i], NULL, helper_main, pool) != 0) {
      npu_pool_free(pool);
      return npu_fail(err, NPULM_ERR_NOMEM, "could not start helper thread %d of %d", i + 1,
                      n_helpers);
    }
    pool->n_helpers_started++;
  }
  *out = pool;
  return NPULM_OK;
}

void npu_pool_free(struct npu_pool *pool) {
  if (pool == NULL) return;
  pthread_mutex_lock(&pool->lock);
  atomic_store(&pool->stop, true);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < pool->n_helpers_started; i++) pthread_join(pool->helpers[i], NULL);
  pthread_cond_destroy(&pool->wake);
  pthread_mutex_destroy(&pool->lock);
  free(pool->helpers);
  free(pool);
}

int npu_pool_threads(const struct npu_pool *pool) { return pool != NULL ? pool->n_threads : 1; }

void npu_pool_run(struct npu_pool *pool, size_t n_tasks, npu_pool_task_fn *fn, void *arg) {
  thread_lane = 0;
  if (pool == NULL || pool->n_threads == 1 || n_tasks <= 1) {
    for (size_t i = 0; i < n_tasks; i++) fn(arg, i);
    return;
  }
  const uint32_t g = ++pool->generation;
  struct loop *lp = &pool->loops[g & 1];
  atomic_store_explicit(&lp->fn, fn, memory_order_relaxed);
  atomic_store_explicit(&lp->arg, arg, memory_order_relaxed);
  atomic_store_explicit(&lp->n_tasks, (uint32_t)n_tasks, memory_order_relaxed);
  atomic_store_explicit(&lp->finished, 0, memory_order_relaxed);
  const uint64_t t = (uint64_t)g << 32;
  atomic_store(&pool->ticket, t); /* publishes the slot's stores above */
  if (atomic_load(&pool->n_sleeping) > 0) {
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
  }
  work(pool, t);
  /* every task is claimed; wait for the ones helpers are still running */
  for (unsigned i = 1; atomic_load_explicit(&lp->finished, memory_order_acquire) < n_tasks; i++) {
    cpu_relax();
    if (i % 1024 == 0) sched_yield();
  }
}
