/* The heterogeneous scheduler: one persistent worker thread for the NPU, started with the session
 * and kept until it ends, and for the CPU the thread that runs the job. An evaluation is a list of
 * steps (chunks); step c runs the subgraphs 0 .. S-1 of its graph, each on its backend's worker
 * (a job of one step, all on the calling thread: npu_sched_run).
 * Task (c, s) may start when
 *   (c, s-1) is done                   (data flow inside the chunk),
 *   (c-1, s) is done                   (the KV cache rows chunk c attends over, the logits buffer),
 *   chunk c-2 is done, for s = 0       (at most NPU_SCHED_SLOTS chunks in flight, one arena set
 *                                       each: chunk c uses slot c % NPU_SCHED_SLOTS).
 * A worker takes the oldest ready task of its backend, so while the CPU computes the attention of
 * chunk c, the NPU runs the projections of chunk c+1 (llm.npu's out-of-order overlap); it leaves a
 * task of chunk c+1 that would still run when chunk c needs the worker (measured durations).
 * Running a job allocates nothing. */
#ifndef NPU_RUNTIME_SCHEDULER_H
#define NPU_RUNTIME_SCHEDULER_H

#include <stdint.h>

#include "ir/ir.h"
#include "npulm.h"

#define NPU_SCHED_SLOTS 2

/* Run subgraph 'sub' of step 'step' with the memory of slot 'slot'; called on the worker thread of
 * the subgraph's backend, or for a job of one step on the thread that runs the job. */
typedef void (*npu_sched_task_fn)(void *user, int32_t step, int32_t sub, int32_t slot);

struct npu_sched_job {
  int32_t n_steps;
  const struct npu_graph *const *graphs; /* (n_steps) the graph of each step */
  /* (n_steps) or NULL: for each step, its graph's subgraph durations in seconds (0 = not yet
   * measured), read to order the work and updated as subgraphs run. Steps of one graph share an
   * array; the arrays are the scheduler's while the job runs. */
  double *const *cost;
  npu_sched_task_fn run;
  void *user;
};

/* Time accounting since creation, on the monotonic clock. */
struct npu_sched_stats {
  double busy_s[NPU_BE_COUNT]; /* time each worker spent inside tasks */
  double overlap_s;            /* time both workers were inside tasks at once */
  uint64_t n_tasks;
};

struct npu_sched;

struct npu_pool;

/* Start the NPU's worker; while waiting for a task, each worker runs tasks of the loops of
 * 'pools' (any may be NULL). Return NPULM_OK and '*out', or an error naming what failed. */
npulm_status npu_sched_create(struct npu_pool *const pools[NPU_BE_COUNT], struct npu_sched **out,
                              npulm_error *err);

/* Stop and join the NPU's worker and free everything; accepts NULL. No job may be running. */
void npu_sched_free(struct npu_sched *s);

/* Run every task of 'job', the CPU's on the calling thread, and return when all are done. One job
 * at a time per scheduler. Steps whose graphs differ in their subgraph structure are run one after
 * the other, not overlapped. A job of one step (a decode step, or a prompt of one chunk), where
 * nothing can overlap, runs
 * every subgraph on the calling thread, the NPU's worker lending itself to their loops; the
 * stats still count each subgraph's time as its backend's. */
void npu_sched_run(struct npu_sched *s, const struct npu_sched_job *job);

void npu_sched_get_stats(struct npu_sched *s, struct npu_sched_stats *stats_out);
void npu_sched_reset_stats(struct npu_sched *s);

#endif /* NPU_RUNTIME_SCHEDULER_H */
