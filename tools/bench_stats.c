/* npulm bench's statistics of a test (llama-bench's mean and sample standard deviation of the
 * repetitions) and its place against the roofline (bench.h). */
#include <math.h>
#include <stdio.h>

#include "bench.h"

/* ---- statistics (llama-bench's avg and stdev) -------------------------------------------- */

double bench_mean(const double *v, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += v[i];
  return n > 0 ? s / n : 0.0;
}

/* Sample standard deviation (n - 1); 0 for fewer than two values. */
double bench_stdev(const double *v, int n) {
  if (n <= 1) return 0.0;
  double m = bench_mean(v, n), s = 0.0;
  for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
  return sqrt(s / (n - 1));
}

int bench_n_tokens(const struct result *r) { return r->n_prompt + r->n_gen; }

/* t/s of each repetition into 'ts' (reps values). */
void bench_samples_ts(const struct result *r, double *ts) {
  for (int i = 0; i < r->reps; i++) {
    ts[i] = r->samples_ns[i] > 0 ? 1e9 * bench_n_tokens(r) / (double)r->samples_ns[i] : 0.0;
  }
}

double bench_avg_ts(const struct result *r) {
  double ts[1024];
  bench_samples_ts(r, ts);
  return bench_mean(ts, r->reps);
}

double bench_stdev_ts(const struct result *r) {
  double ts[1024];
  bench_samples_ts(r, ts);
  return bench_stdev(ts, r->reps);
}

uint64_t bench_avg_ns(const struct result *r) {
  uint64_t s = 0;
  for (int i = 0; i < r->reps; i++) s += r->samples_ns[i];
  return r->reps > 0 ? s / (uint64_t)r->reps : 0;
}

uint64_t bench_stdev_ns(const struct result *r) {
  double v[1024];
  for (int i = 0; i < r->reps; i++) v[i] = (double)r->samples_ns[i];
  return (uint64_t)bench_stdev(v, r->reps);
}

void bench_test_name(const struct result *r, char *buf, size_t cap) {
  if (r->n_prompt > 0 && r->n_gen == 0) snprintf(buf, cap, "pp%d", r->n_prompt);
  else if (r->n_gen > 0 && r->n_prompt == 0) snprintf(buf, cap, "tg%d", r->n_gen);
  else snprintf(buf, cap, "pp%d+tg%d", r->n_prompt, r->n_gen);
}

/* The compute ceiling that applies to the program's arithmetic: its precision's GEMM rate. */
double bench_peak_macs(const struct model_desc *d, const npulm_roofline *h) {
  return npulm_roofline_peak(h, d->precision);
}

void bench_place(const struct model_desc *d, const struct result *r, struct placement *pl) {
  const npulm_roofline *h = r->host;
  /* from the mean t/s, so that every figure agrees with the t/s column */
  const double ts = bench_avg_ts(r);
  pl->seconds = ts > 0 ? bench_n_tokens(r) / ts : 0.0;
  const double macs = (double)r->bound.macs, bytes = (double)r->bound.bytes;
  pl->macs_s = pl->seconds > 0 ? macs / pl->seconds : 0.0;
  pl->bytes_s = pl->seconds > 0 ? bytes / pl->seconds : 0.0;
  pl->ai = bytes > 0 ? macs / bytes : 0.0;
  const double peak = bench_peak_macs(d, h), slope = pl->ai * h->mem_bytes;
  pl->memory_bound = slope < peak;
  const double ceiling = slope < peak ? slope : peak;
  pl->pct = ceiling > 0 ? 100.0 * pl->macs_s / ceiling : 0.0;
}
