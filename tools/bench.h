/* What npulm bench (bench.c) shares with its statistics (bench_stats.c) and its plot
 * (bench_plot.c): a test's results and the model's description, their statistics, and where a
 * result lies against the roofline. */
#ifndef NPULM_TOOLS_BENCH_H
#define NPULM_TOOLS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "npulm.h"
#include "npulm_bench.h"

#define MAX_LIST 16
#define MAX_PROFILES 8
#define MAX_PROFILE 32 /* operator x backend entries of a --profile */

/* One test and what was measured. */
struct result {
  int n_prompt, n_gen, n_threads;
  char test_time[32];   /* RFC 3339, as llama-bench writes it */
  uint64_t *samples_ns; /* (reps) */
  int reps;
  double ttft_s;     /* mean time from a repetition's start to its first logits */
  uint64_t peak_rss; /* bytes: the test's own peak (Linux), else the process's peak so far */
  /* --roofline */
  double *rep_mem; /* (reps + 1) bandwidth ceilings: before each repetition, after the last */
  const npulm_roofline *host;
  npulm_prediction bound;              /* on this host's ceilings */
  npulm_prediction pred[MAX_PROFILES]; /* on each NPU profile */
  npulm_decode_traffic traffic;        /* tg: at position 0 */
  double bytes_per_token;              /* tg: mean over the run's positions */
  npulm_sparse_stats sparse;           /* the measured repetitions' sparse decode (zeros: dense) */
  npulm_memory_stats memory;           /* and what they read from storage (zeros: no budget) */
  /* --profile: the measured repetitions' node time by operator, the most first */
  npulm_profile_entry profile[MAX_PROFILE];
  int n_profile;
  npulm_session_stats busy; /* the measured repetitions' worker time (engine stats, summed) */
};

/* What describes the model in every row. */
struct model_desc {
  const char *path;
  char type[96]; /* "llama 110M w8a8-naive" */
  uint64_t size; /* bytes of the weights the program holds */
  uint64_t n_params;
  const char *quant;
  char precision[24]; /* the quant's precision ("w4a16-block" of "w4a16-block-smooth"), or "f32" */
  int n_ubatch;       /* the largest rows of a prefill step */
  char cpu[128];
};

struct placement {
  double seconds;    /* seconds of a repetition at the mean t/s */
  double macs_s;     /* achieved MAC/s */
  double bytes_s;    /* achieved DRAM bytes/s (by the cost model's byte count) */
  double ai;         /* MAC per byte */
  bool memory_bound; /* left of the ridge */
  double pct;        /* of the roofline at this intensity */
};

/* llama-bench's statistics (bench_stats.c): the mean and sample standard deviation of 'n'
 * values; a test's tokens per repetition; its repetitions' t/s into 'ts' (reps values), their
 * mean and deviation; the mean and deviation of their nanoseconds. */
double bench_mean(const double *v, int n);
double bench_stdev(const double *v, int n);
int bench_n_tokens(const struct result *r);
void bench_samples_ts(const struct result *r, double *ts);
double bench_avg_ts(const struct result *r);
double bench_stdev_ts(const struct result *r);
uint64_t bench_avg_ns(const struct result *r);
uint64_t bench_stdev_ns(const struct result *r);

/* The compute ceiling that applies to the program's arithmetic: its precision's GEMM rate. */
double bench_peak_macs(const struct model_desc *d, const npulm_roofline *h);

/* Where result 'r' lies against its host's roofline (from its mean t/s). */
void bench_place(const struct model_desc *d, const struct result *r, struct placement *pl);

/* The test's llama-bench name: "pp512", "tg128", or "pp512+tg128" for both. */
void bench_test_name(const struct result *r, char *buf, size_t cap);

/* Write the plot of the 'n' results against the 'n_hosts' host rooflines and every NPU profile
 * to 'path'; false (errno set) if it cannot be written. */
bool bench_write_svg(const char *path, const struct model_desc *d, const struct result *rs, int n,
                     const npulm_roofline *hosts, int n_hosts);

#endif /* NPULM_TOOLS_BENCH_H */
