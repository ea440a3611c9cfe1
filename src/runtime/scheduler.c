/* The task scheduler (see scheduler.h): the NPU's worker thread, and the thread of npu_sched_run
 * as the CPU's worker while its job runs. All shared state is guarded by one mutex; each worker
 * sleeps on its own condition variable and is woken when a task finishes or a job starts. A
 * chunk's subgraphs finish in order, so the whole state of a chunk in flight is one counter (how
 * many of its subgraphs are done) and one flag (one of them is running).
 * A prefill chunk hands work back and forth between the workers a few dozen times, and a decode
 * step (run on one thread: run_alone) starts a few dozen loops in a few milliseconds, so a waiter
 * spins (yielding the core to anyone runnable) on an epoch counter that every change of state
 * bumps, and sleeps only when no task is running: a futex wake-up costs tens of microseconds.
 * While it spins it lends itself to the other worker's data-parallel loops (the NPU's matmuls,
 * the CPU's row-wise ops): with two cores, the idle worker is the second core of the busy one. The
 * caller is the CPU's worker, rather than a third thread it waits for, so that the end of a job
 * wakes no one: the caller returns as soon as it sees the last task done. Subgraphs alternate
 * between the backends, so the older chunk's next subgraph always needs the worker that is not
 * running its current one. If that worker started a long subgraph of the younger chunk meanwhile,
 * the older chunk would stall behind it: a worker therefore only takes a younger chunk's subgraph
 * when its measured duration (last run of the same graph) fits in what is left of the older chunk's
 * running subgraph. */
#include "runtime/scheduler.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pool.h"

/* How long a waiter spins before it sleeps. */
#define SPIN_S 100e-6

struct npu_sched {
  struct npu_pool *pools[NPU_BE_COUNT]; /* a waiting worker lends itself to their loops */
  pthread_mutex_t lock;
  pthread_cond_t wake[NPU_BE_COUNT]; /* a worker waits here for a task */
  pthread_t npu_worker;
  bool npu_worker_started;
  bool stop;
  atomic_uint epoch; /* bumped (under 'lock') at every change a waiter may be waiting for */
  /* the job in progress (NULL when idle) and its state; all guarded by 'lock' */
  const struct npu_sched_job *job;
  int32_t chunks_done;               /* steps 0 .. chunks_done-1 are complete */
  int32_t progress[NPU_SCHED_SLOTS]; /* subgraphs done of the chunk in each slot */
  bool running[NPU_SCHED_SLOTS];     /* a subgraph of the chunk in each slot is running */
  double started[NPU_SCHED_SLOTS];   /* when it started */
  /* accounting */
  atomic_int n_busy;  /* workers inside a task (changed under 'lock'; read by spinning waiters) */
  double last_change; /* when n_busy last changed */
  struct npu_sched_stats stats;
};

/* True when steps 'a' and 'b' run graphs with the same subgraphs, so that subgraph s of one
 * corresponds to subgraph s of the other (graphs built by one builder always do). */
static bool same_structure(const struct npu_graph *a, const struct npu_graph *b) {
  if (a == b) return true;
  if (a->n_subgraphs != b->n_subgraphs) return false;
  for (int32_t i = 0; i < a->n_subgraphs; i++) {
    const struct npu_subgraph *x = &a->subgraphs[i], *y = &b->subgraphs[i];
    if (x->first != y->first || x->count != y->count || x->backend != y->backend) return false;
  }
  return true;
}

/* Whether backend 'be' should leave the younger chunk's subgraph 'sub' of step 'c' for now: the
 * older chunk (step c-1) runs a subgraph on the other backend and needs 'be' right after it, sooner
 * than the younger subgraph would be done. Durations come from the job's measurements (0: none
 * yet, never wait). Called with the lock held. */
static bool leave_for_older(const struct npu_sched *s, enum npu_backend be, int32_t c,
                            int32_t sub) {
  const struct npu_sched_job *job = s->job;
  if (job->cost == NULL || job->cost[c][sub] <= 0.0) return false;
  int32_t old_slot = (c - 1) % NPU_SCHED_SLOTS;
  const struct npu_graph *old = job->graphs[c - 1];
  int32_t cur = s->progress[old_slot];
  if (!s->running[old_slot] || cur + 1 >= old->n_subgraphs) return false;
  if (old->subgraphs[cur + 1].backend != (int32_t)be) return false;
  double left = job->cost[c - 1][cur] - (npu_now() - s->started[old_slot]);
  return job->cost[c][sub] > left;
}

/* The oldest task for backend 'be' whose dependencies are met: sets '*step' and '*sub' and
 * returns true, or returns false. Called with the lock held. */
static bool find_task(const struct npu_sched *s, enum npu_backend be, int32_t *step, int32_t *sub) {
  const struct npu_sched_job *job = s->job;
  if (job == NULL) return false;
  for (int32_t c = s->chunks_done; c < job->n_steps && c < s->chunks_done + NPU_SCHED_SLOTS; c++) {
    int32_t slot = c % NPU_SCHED_SLOTS;
    const struct npu_graph *g = job->graphs[c];
    int32_t next = s->progress[slot];
    if (s->running[slot] || next >= g->n_subgraphs) continue;
    if (g->subgraphs[next].backend != (int32_t)be) continue;
    if (c > s->chunks_done) {
      /* chunk c-1 is still in flight: its subgraph 'next' must be done */
      int32_t prev_slot = (c - 1) % NPU_SCHED_SLOTS;
      if (!same_structure(job->graphs[c - 1], g) || s->progress[prev_slot] <= next) continue;
      /* the slot of chunk c was freed when chunk c - NPU_SCHED_SLOTS finished (chunks_done) */
      if (leave_for_older(s, be, c, next)) continue;
    }
    *step = c;
    *sub = next;
    return true;
  }
  return false;
}

/* A worker starts (+1) or ends (-1) a task at time 'now'. Called with the lock held. */
static void account(struct npu_sched *s, int delta, double now) {
  if (atomic_load_explicit(&s->n_busy, memory_order_relaxed) == NPU_BE_COUNT) {
    s->stats.overlap_s += now - s->last_change;
  }
  s->last_change = now;
  atomic_fetch_add_explicit(&s->n_busy, delta, memory_order_relaxed);
}

/* Something changed: bump the epoch. Called with the lock held. */
static void changed(struct npu_sched *s) {
  atomic_fetch_add_explicit(&s->epoch, 1, memory_order_release);
}

/* Lend the calling (waiting) worker to any loop in progress; true if it ran a task. */
static bool help(struct npu_sched *s) {
  bool ran = false;
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    if (s->pools[be] != NULL && npu_pool_help(s->pools[be])) ran = true;
  }
  return ran;
}

/* Wait on 'cv' for a change, spinning first. While the other worker is inside a task the waiter
 * keeps spinning, however long the task: it may start a data-parallel loop at any moment (a
 * prefill chunk's NPU subgraph runs a layer's matmuls with element-wise ops and norms between
 * them, each long enough to outlast a short spin), and a sleeping waiter would leave the loops
 * after it one thread short. It sleeps only when no task runs. Called and returns with the lock
 * held; the caller re-checks its condition, as after any condition wait. */
static void wait_change(struct npu_sched *s, pthread_cond_t *cv) {
  unsigned seen = atomic_load_explicit(&s->epoch, memory_order_relaxed);
  pthread_mutex_unlock(&s->lock);
  double until = npu_now() + SPIN_S;
  bool moved = false;
  for (unsigned i = 1; !moved; i++) {
    moved = atomic_load_explicit(&s->epoch, memory_order_acquire) != seen;
    if (!moved && help(s)) {
      until = npu_now() + SPIN_S; /* the other worker is busy: more work for this one may follow */
      continue;
    }
    if (!moved && i % 64 == 0) {
      if (npu_now() > until && atomic_load_explicit(&s->n_busy, memory_order_relaxed) == 0) break;
      sched_yield();
    }
  }
  pthread_mutex_lock(&s->lock);
  /* a change after this check is made under the lock and signalled: the wait cannot miss it */
  if (!moved && atomic_load_explicit(&s->epoch, memory_order_relaxed) == seen) {
    pthread_cond_wait(cv, &s->lock);
  }
}

/* Whether the job in progress is done (or none is). Called with the lock held. */
static bool job_done(const struct npu_sched *s) {
  return s->job == NULL || s->chunks_done == s->job->n_steps;
}

/* Run the tasks of backend 'be' as they become ready: until the scheduler stops (the NPU's
 * worker) or until the job is done (the caller, 'until_done'). Called and returns with the lock
 * held. */
static void serve(struct npu_sched *s, enum npu_backend be, bool until_done) {
  enum npu_backend other = be == NPU_BE_NPU ? NPU_BE_CPU : NPU_BE_NPU;
  for (;;) {
    int32_t step = 0, sub = 0;
    while (!s->stop && !(until_done && job_done(s)) && !find_task(s, be, &step, &sub))
      wait_change(s, &s->wake[be]);
    if (s->stop || (until_done && job_done(s))) return;
    const struct npu_sched_job *job = s->job;
    int32_t slot = step % NPU_SCHED_SLOTS;
    s->running[slot] = true;
    double t0 = npu_now();
    s->started[slot] = t0;
    account(s, +1, t0);
    pthread_mutex_unlock(&s->lock);

    job->run(job->user, step, sub, slot);

    pthread_mutex_lock(&s->lock);
    double t1 = npu_now();
    account(s, -1, t1);
    s->stats.busy_s[be] += t1 - t0;
    s->stats.n_tasks++;
    if (job->cost != NULL) job->cost[step][sub] = t1 - t0;
    s->running[slot] = false;
    if (++s->progress[slot] == job->graphs[step]->n_subgraphs) {
      /* chunks finish in order: (c, last) waits for (c-1, last) */
      s->progress[slot] = 0;
      s->chunks_done++;
    }
    changed(s);
    pthread_cond_signal(&s->wake[other]);
  }
}

static void *npu_worker_main(void *arg) {
  struct npu_sched *s = arg;
  pthread_mutex_lock(&s->lock);
  serve(s, NPU_BE_NPU, false);
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

npulm_status npu_sched_create(struct npu_pool *const pools[NPU_BE_COUNT], struct npu_sched **out,
                              npulm_error *err) {
  *out = NULL;
  struct npu_sched *s = calloc(1, sizeof(*s));
  if (s == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory creating the scheduler");
  for (int be = 0; be < NPU_BE_COUNT; be++) s->pools[be] = pools[be];
  int sync_ok = 0; /* how many of the lock and condition variables exist */
  npulm_status st = NPULM_OK;
  if (pthread_mutex_init(&s->lock, NULL) != 0) goto sync_fail;
  sync_ok++;
  for (int be = 0; be < NPU_BE_COUNT; be++) {
    if (pthread_cond_init(&s->wake[be], NULL) != 0) goto sync_fail;
    sync_ok++;
  }
  if (pthread_create(&s->npu_worker, NULL, npu_worker_main, s) != 0) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "could not start the NPU worker thread");
    goto fail;
  }
  s->npu_worker_started = true;
  *out = s;
  return NPULM_OK;
sync_fail:
  st = npu_fail(err, NPULM_ERR_NOMEM, "could not create the scheduler's locks");
  if (sync_ok > 0) pthread_mutex_destroy(&s->lock);
  for (int be = 0; be + 1 < sync_ok; be++) pthread_cond_destroy(&s->wake[be]);
  free(s);
  return st;
fail:
  npu_sched_free(s);
  return st;
}

void npu_sched_free(struct npu_sched *s) {
  if (s == NULL) return;
  pthread_mutex_lock(&s->lock);
  s->stop = true;
  changed(s);
  pthread_cond_signal(&s->wake[NPU_BE_NPU]);
  pthread_mutex_unlock(&s->lock);
  if (s->npu_worker_started) pthread_join(s->npu_worker, NULL);
  pthread_mutex_destroy(&s->lock);
  for (int be = 0; be < NPU_BE_COUNT; be++) pthread_cond_destroy(&s->wake[be]);
  free(s);
}

/* Run the one step of the job in progress on the calling thread alone: its subgraphs wait each
 * for the one before, so none could overlap another, while handing each to its backend's worker
 * costs two crossings between the threads (a decode step of stories110M has 26 subgraphs), each
 * hundreds of nanoseconds when the two cores sit on different core complexes. The NPU's worker
 * sees the step's slot running, takes none of it and lends itself to the step's loops meanwhile
 * (wait_change: a task runs, so it spins). Called and returns with the lock held. */
static void run_alone(struct npu_sched *s) {
  const struct npu_sched_job *job = s->job;
  const struct npu_graph *g = job->graphs[0];
  double busy[NPU_BE_COUNT] = {0};
  s->running[0] = true;
  double t0 = npu_now();
  s->started[0] = t0;
  account(s, +1, t0);
  pthread_mutex_unlock(&s->lock);
  for (int32_t sub = 0; sub < g->n_subgraphs; sub++) {
    job->run(job->user, 0, sub, 0);
    const double t1 = npu_now();
    busy[g->subgraphs[sub].backend] += t1 - t0;
    if (job->cost != NULL) job->cost[0][sub] = t1 - t0;
    t0 = t1;
  }
  pthread_mutex_lock(&s->lock);
  account(s, -1, t0);
  for (int be = 0; be < NPU_BE_COUNT; be++) s->stats.busy_s[be] += busy[be];
  s->stats.n_tasks += (uint64_t)g->n_subgraphs;
  s->running[0] = false;
  s->chunks_done = 1;
  changed(s);
}

void npu_sched_run(struct npu_sched *s, const struct npu_sched_job *job) {
  if (job->n_steps <= 0) return;
  pthread_mutex_lock(&s->lock);
  s->job = job;
  s->chunks_done = 0;
  for (int i = 0; i < NPU_SCHED_SLOTS; i++) {
    s->progress[i] = 0;
    s->running[i] = false;
  }
  /* the NPU's worker wakes to its tasks, or for a lone step to lend itself to its loops */
  changed(s);
  pthread_cond_signal(&s->wake[NPU_BE_NPU]);
  if (job->n_steps == 1) {
    run_alone(s);
  } else {
    serve(s, NPU_BE_CPU, true);
  }
  s->job = NULL;
  pthread_mutex_unlock(&s->lock);
}

void npu_sched_get_stats(struct npu_sched *s, struct npu_sched_stats *stats_out) {
  pthread_mutex_lock(&s->lock);
  *stats_out = s->stats;
  pthread_mutex_unlock(&s->lock);
}

void npu_sched_reset_stats(struct npu_sched *s) {
  pthread_mutex_lock(&s->lock);
  memset(&s->stats, 0, sizeof(s->stats));
  pthread_mutex_unlock(&s->lock);
}
