/* A persistent thread pool for data-parallel loops: the NPU's cores. npu_pool_run(pool, n, fn,
 * arg) runs fn(arg, 0) .. fn(arg, n-1) on the calling thread and the pool's helper threads and
 * returns when all are done, and threads waiting for other work can lend themselves to the loop in
 * progress (npu_pool_help). Tasks are claimed one at a time from a shared counter, so a helper
 * the OS deschedules (these machines are shared) delays only the task it holds, never a fixed
 * share of the work. Helpers are created once; running a loop allocates nothing and creates no
 * thread. One caller at a time per pool. */
#ifndef NPU_BASE_POOL_H
#define NPU_BASE_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "npulm.h"

struct npu_pool;

typedef void npu_pool_task_fn(void *arg, size_t task);

/* A pool whose loops are meant to run on 'n_threads' threads (>= 1; callers size their tasks by
 * it): the caller of npu_pool_run, 'n_helpers' threads of the pool's own (0 .. n_threads - 1), and
 * threads that lend themselves while they wait for something else (npu_pool_help). */
npulm_status npu_pool_create(int n_threads, int n_helpers, struct npu_pool **out, npulm_error *err);

/* Stop and join the helpers; accepts NULL. No loop may be running. */
void npu_pool_free(struct npu_pool *pool);

/* The number of threads a loop runs on (1 for a NULL pool). */
int npu_pool_threads(const struct npu_pool *pool);

/* Run unclaimed tasks of the loop in progress, if any, on the calling thread: a thread that is
 * waiting for other work lends itself. Return true if it ran at least one task. Never blocks. */
bool npu_pool_help(struct npu_pool *pool);

/* The lane of the calling thread in the loop whose task it is running: 0 for the caller of
 * npu_pool_run, 1 .. n_helpers for the pool's helpers (each its own, for the pool's life), and
 * n_helpers + 1 for threads that lend themselves (all of them). Which task a thread claims is a
 * race; a loop whose tasks should each see the same thread loop after loop picks the task's
 * part by lane instead. */
size_t npu_pool_lane(void);

/* Run tasks 0 .. n_tasks-1 (n_tasks < 2^32) and return when every one has returned. A NULL pool
 * runs them in order on the caller. */
void npu_pool_run(struct npu_pool *pool, size_t n_tasks, npu_pool_task_fn *fn, void *arg);

#endif /* NPU_BASE_POOL_H */
