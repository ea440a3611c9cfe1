/* npulm bench: prefill (pp N) and decode (tg N) speeds measured the way llama.cpp's llama-bench
 * measures them, printed as its table or its JSON; with --roofline, this host's MAC/s (of the
 * GEMM of each precision: int8, w4a8, w8a16, w4a16) and memory bandwidth ceilings, every figure
 * placed against them, the NPU cost model's prediction for each public NPU profile, and (--plot)
 * the roofline drawn as SVG. Uses only npulm.h.
 *
 * llama-bench's method (tools/llama-bench/llama-bench.cpp), followed here: one context per test
 * sized n_prompt + n_gen; a warmup (pp: one whole prompt run; tg: one single-token step); then per
 * repetition: clear the cache, start the clock, and either evaluate n_prompt random tokens in one
 * batch (the first is BOS when the model adds one) or evaluate n_gen tokens one at a time (BOS or
 * random first, random after: no sampling, no tokenization); t/s of a repetition = tokens /
 * seconds, reported as the mean and sample standard deviation over the repetitions. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "bench.h"
#include "cli_util.h"
#include "commands.h"
#include "npulm.h"
#include "npulm_bench.h"

const char npulm_usage_bench[] =
    "usage: npulm bench [-m MODEL] [-p 512] [-n 128] [-t THREADS] [-r 5] [-o md|json]\n"
    "                   [--roofline] [--plot FILE.svg] [--profile] [compile options]\n"
    "\n"
    "Measure prefill (pp N: N tokens in one evaluation) and decode (tg N: N single-token\n"
    "evaluations) speeds in tokens/s the way llama-bench does: synthetic random tokens, no\n"
    "tokenization or sampling, a warmup run, then repetitions from an empty cache, reported as\n"
    "mean +/- standard deviation. Also reports time to first token and peak RSS (on Linux each\n"
    "test's own: the high-water mark is reset before it; elsewhere the process's peak so far).\n"
    "A GGUF model is compiled in memory first; a program file (npulm compile) runs as it is.\n"
    "\n"
    "  -m, --model FILE      model (default: $NPULM_MODEL, else " CLI_DEFAULT_MODEL_PATH ")\n"
    "  -p, --n-prompt LIST   prompt lengths, comma-separated; 0 = no prefill test (default 512)\n"
    "  -n, --n-gen LIST      generated lengths; 0 = no decode test (default 128)\n"
    "  -t, --threads LIST    thread counts (default: one per online CPU)\n"
    "  -r, --repetitions N   repetitions of each test (default 5)\n"
    "  -o, --output FORMAT   md (a llama-bench table, default) or json (llama-bench's JSON fields)\n"
    "  --no-warmup           skip the warmup runs\n"
    "  --roofline            measure this host's MAC/s (the NPU's GEMM kernel of each precision:\n"
    "                        the program's own is its compute ceiling) and memory bandwidth\n"
    "                        (before and after the tests; the better of the two), place every\n"
    "                        test against them, and predict each test on the NPU profiles\n"
    "                        (Hexagon V75, Apple M4 ANE, Meteor Lake NPU); also measure the\n"
    "                        bandwidth right before and after every repetition, and place each\n"
    "                        repetition against the ceiling they give where the two agree within\n"
    "                        10% ('% paired', the median, with the count kept when not all; '-'\n"
    "                        if none: the host's bandwidth changed around each)\n"
    "  --plot FILE.svg       draw the roofline with the measured points (implies --roofline)\n"
    "  --profile             time every node and print, per test, where a run's time goes by\n"
    "                        operator and backend, with the matmuls' GMAC/s and GB/s (JSON:\n"
    "                        a 'profile' array per test)\n" CLI_SESSION_OPTIONS_HELP
        CLI_OPEN_OPTIONS_HELP
    "With --roofline, the storage read rate is a third ceiling (a 256 MiB file in $TMPDIR, else\n"
    "/tmp, read from a dropped page cache), and a program under --mem-budget prints per test what\n"
    "it read from storage per token.\n"
    "\n"
    "Compile options, for a GGUF model:\n" CLI_COMPILE_OPTIONS_HELP;

struct bench_opts {
  const char *model_path;
  int prompts[MAX_LIST], n_prompts;
  int gens[MAX_LIST], n_gens;
  int threads[MAX_LIST], n_threads;
  int reps;
  bool json, warmup, roofline, profile;
  const char *plot;
  npulm_session_params session; /* its sparse decode options */
  npulm_open_params open;       /* memory budget, cold start */
};

/* ---- running one test --------------------------------------------------------------------- */

static uint32_t next_rand(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return (uint32_t)((*s * 0x2545F4914F6CDD1DULL) >> 33);
}

static void eval_or_die(const char *cmd, npulm_session *s, const int32_t *tokens, size_t n) {
  npulm_error err;
  if (npulm_session_eval(s, tokens, n, NULL, &err) != NPULM_OK) cli_die(cmd, "%s", err.msg);
}

/* llama-bench's test_prompt: n random tokens (BOS first if the model adds one) in one batch. */
static void run_prompt(const char *cmd, npulm_session *s, const npulm_model_info *info,
                       int32_t *tokens, int n, uint64_t *rng) {
  for (int i = 0; i < n; i++) tokens[i] = (int32_t)(next_rand(rng) % (uint32_t)info->n_vocab);
  if (info->add_bos && info->bos_id >= 0) tokens[0] = info->bos_id;
  eval_or_die(cmd, s, tokens, (size_t)n);
}

/* llama-bench's test_gen: n single-token evaluations; returns the first one's seconds. */
static double run_gen(const char *cmd, npulm_session *s, const npulm_model_info *info, int n,
                      uint64_t *rng) {
  int32_t token = info->add_bos && info->bos_id >= 0
                      ? info->bos_id
                      : (int32_t)(next_rand(rng) % (uint32_t)info->n_vocab);
  double t0 = cli_now(), first = 0.0;
  for (int i = 0; i < n; i++) {
    eval_or_die(cmd, s, &token, 1);
    if (i == 0) first = cli_now() - t0;
    token = (int32_t)(next_rand(rng) % (uint32_t)info->n_vocab);
  }
  return first;
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Start a new peak-RSS window: Linux resets the process's high-water mark (VmHWM) to its current
 * RSS when "5" is written to /proc/self/clear_refs. Elsewhere nothing happens. */
static void peak_rss_reset(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (f == NULL) return;
  fputs("5", f);
  fclose(f);
}

/* Peak RSS in bytes since the last peak_rss_reset: VmHWM of /proc/self/status; without it, the
 * process's peak (getrusage: reset by nothing). */
static uint64_t peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f != NULL) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL) {
      found = sscanf(line, "VmHWM: %llu kB", &kib) == 1;
    }
    fclose(f);
    if (found) return (uint64_t)kib * 1024;
  }
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0; /* KiB */
}

/* With --roofline, the bandwidth ceiling now into r->rep_mem[i], and a new peak-RSS window (the
 * measurement's buffer is not the test's); the peak of the window that ends returned. */
static uint64_t measure_between(const char *cmd, struct result *r, int i) {
  const uint64_t peak = peak_rss_bytes();
  npulm_roofline m;
  npulm_error err;
  if (npulm_roofline_measure_memory(r->n_threads, &m, &err) != NPULM_OK) {
    cli_die(cmd, "%s", err.msg);
  }
  r->rep_mem[i] = m.mem_bytes;
  peak_rss_reset();
  return peak;
}

static void run_test(const char *cmd, const npulm_model *model, const struct bench_opts *o,
                     struct result *r) {
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  char name[48];
  bench_test_name(r, name, sizeof(name));
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(r->test_time, sizeof(r->test_time), "%Y-%m-%dT%H:%M:%SZ", &tm);

  peak_rss_reset();
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = bench_n_tokens(r);
  sp.n_threads = r->n_threads;
  sp.profile = o->profile;
  sp.sparse = o->session.sparse;
  sp.sparse_audit = o->session.sparse_audit;
  npulm_session *s;
  npulm_error err;
  if (npulm_session_create(model, &sp, &s, &err) != NPULM_OK) {
    cli_die(cmd, "%s: %s", name, err.msg);
  }
  int32_t *tokens = malloc((size_t)(r->n_prompt > 0 ? r->n_prompt : 1) * sizeof(int32_t));
  r->samples_ns = calloc((size_t)o->reps, sizeof(uint64_t));
  r->rep_mem = o->roofline ? calloc((size_t)o->reps + 1, sizeof(double)) : NULL;
  if (tokens == NULL || r->samples_ns == NULL || (o->roofline && r->rep_mem == NULL)) {
    cli_die(cmd, "out of memory");
  }
  r->reps = o->reps;
  uint64_t rng = 0x853c49e6748fea9bULL; /* the same tokens on every run */

  if (o->warmup) {
    if (r->n_prompt > 0) run_prompt(cmd, s, &info, tokens, r->n_prompt, &rng);
    if (r->n_gen > 0) run_gen(cmd, s, &info, 1, &rng);
  }
  npulm_session_profile_clear(s); /* the measured repetitions only */
  npulm_session_sparse_stats_clear(s);
  npulm_session_stats before;
  npulm_session_get_stats(s, &before);
  double ttft = 0.0;
  uint64_t peak = 0;
  for (int rep = 0; rep < o->reps; rep++) {
    if (o->roofline) peak = max_u64(peak, measure_between(cmd, r, rep));
    npulm_session_reset(s);
    double t0 = cli_now(), first = 0.0;
    if (r->n_prompt > 0) {
      run_prompt(cmd, s, &info, tokens, r->n_prompt, &rng);
      first = cli_now() - t0;
    }
    if (r->n_gen > 0) {
      double f = run_gen(cmd, s, &info, r->n_gen, &rng);
      if (r->n_prompt == 0) first = f;
    }
    r->samples_ns[rep] = (uint64_t)((cli_now() - t0) * 1e9);
    ttft += first;
  }
  if (o->roofline) peak = max_u64(peak, measure_between(cmd, r, o->reps));
  r->ttft_s = ttft / o->reps;
  r->peak_rss = max_u64(peak, peak_rss_bytes());
  r->n_profile = npulm_session_profile(s, r->profile, MAX_PROFILE);
  npulm_session_sparse_stats(s, &r->sparse);
  npulm_session_memory_stats(s, &r->memory);
  npulm_session_get_stats(s, &r->busy);
  r->busy.npu_busy_s -= before.npu_busy_s;
  r->busy.cpu_busy_s -= before.cpu_busy_s;
  r->busy.overlap_s -= before.overlap_s;
  if (r->n_profile > MAX_PROFILE) r->n_profile = MAX_PROFILE;
  free(tokens);
  npulm_session_free(s);
}

/* ---- describing the model and the host ---------------------------------------------------- */

static void cpu_name(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[512];
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (v == NULL) break;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strcspn(v, "\n");
    snprintf(buf, cap, "%.*s", (int)n, v);
    break;
  }
  fclose(f);
}

static void describe_model(const char *cmd, const npulm_model *model, const char *path,
                           struct model_desc *d) {
  npulm_model_info info;
  npulm_model_get_info(model, &info);
  npulm_decode_traffic t;
  npulm_error err;
  if (npulm_decode_traffic_at(model, 0, &t, &err) != NPULM_OK) cli_die(cmd, "%s", err.msg);
  char params[32];
  if (info.n_params >= 1000000000ull)
    snprintf(params, sizeof(params), "%.1fB", info.n_params / 1e9);
  else if (info.n_params >= 1000000ull)
    snprintf(params, sizeof(params), "%.0fM", info.n_params / 1e6);
  else snprintf(params, sizeof(params), "%.0fK", info.n_params / 1e3);
  d->path = path;
  snprintf(d->type, sizeof(d->type), "%s %s %s", info.arch, params, t.quant);
  d->size = t.model_bytes;
  d->n_params = info.n_params;
  d->quant = t.quant;
  /* the precision: the mode name less its outlier answer (the last '-' part) */
  snprintf(d->precision, sizeof(d->precision), "%s", t.quant);
  char *dash = strrchr(d->precision, '-');
  if (dash != NULL) *dash = '\0';
  cpu_name(d->cpu, sizeof(d->cpu));
}

/* "12.34 MiB" / "1.23 GiB" as llama-bench prints sizes. */
static void size_str(uint64_t bytes, char *buf, size_t cap) {
  if (bytes < 1024ull * 1024 * 1024) snprintf(buf, cap, "%.2f MiB", bytes / 1024.0 / 1024.0);
  else snprintf(buf, cap, "%.2f GiB", bytes / 1024.0 / 1024.0 / 1024.0);
}

static void params_str(uint64_t n, char *buf, size_t cap) {
  if (n < 1000000000ull) snprintf(buf, cap, "%.2f M", n / 1e6);
  else snprintf(buf, cap, "%.2f B", n / 1e9);
}

/* ---- the llama-bench table ---------------------------------------------------------------- */

#define BACKEND "NPU,CPU"

static void print_md_header(void) {
  printf("| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s | %9s | %10s |\n", "model", "size",
         "params", "backend", "threads", "test", "t/s", "ttft ms", "peak RSS");
  printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", "------------------------------",
         "---------:", "---------:", "----------",
         "------:", "--------------:", "-------------------:", "--------:", "---------:");
}

static void print_md_row(const struct model_desc *d, const struct result *r) {
  char size[32], params[32], name[48], ts[48], rss[32];
  size_str(d->size, size, sizeof(size));
  params_str(d->n_params, params, sizeof(params));
  bench_test_name(r, name, sizeof(name));
  snprintf(ts, sizeof(ts), "%.2f ± %.2f", bench_avg_ts(r), bench_stdev_ts(r));
  size_str(r->peak_rss, rss, sizeof(rss));
  /* the width of "t/s" is one more: "±" is two bytes */
  printf("| %-30s | %10s | %10s | %-10s | %7d | %15s | %21s | %9.2f | %10s |\n", d->type, size,
         params, BACKEND, r->n_threads, name, ts, r->ttft_s * 1e3, rss);
  const double tokens = (double)r->reps * (double)(r->n_prompt + r->n_gen);
  if (r->sparse.input_steps > 0) {
    printf("  input-sparse decode: %.1f%% of input channels read, %.1f%% of decode weight bytes "
           "read; per token: thresholds %.3f ms, sparse GEMVs %.3f ms\n",
           100.0 * r->sparse.input_kept, 100.0 * r->sparse.bytes_share,
           1e3 * r->sparse.select_s / tokens, 1e3 * r->sparse.gemv_s / tokens);
  }
  if (r->sparse.layer_steps > 0) {
    printf("  sparse decode: %.1f%% of FFN neurons computed, %.1f%% candidates; per token: "
           "predictor %.3f ms, sparse FFN %.3f ms\n",
           100.0 * r->sparse.kept, 100.0 * r->sparse.candidates, 1e3 * r->sparse.predict_s / tokens,
           1e3 * r->sparse.ffn_s / tokens);
  }
  if (r->memory.budget > 0) {
    const npulm_memory_stats *m = &r->memory;
    const struct cli_memory_rates rates = cli_memory_rates(m);
    printf("  memory budget %.1f MiB: per token %.2f MiB of neurons (%.2f MiB moved, %s) and %.2f "
           "MiB of streamed weights from storage, neurons at %.0f MiB/s; neuron bytes from memory "
           "%.1f%%, gate "
           "hit rate %.1f%%, up/down hit rate %.1f%%\n",
           (double)m->budget / 1048576.0, (double)m->bytes_read / 1048576.0 / tokens,
           (double)m->storage_bytes / 1048576.0 / tokens, m->direct_io ? "direct" : "buffered",
           (double)m->streamed_read / 1048576.0 / tokens, rates.read_mib_s, rates.from_memory,
           rates.gate_hits, rates.pair_hits);
  }
  fflush(stdout);
}

/* ---- roofline ------------------------------------------------------------------------------ */

/* The repetitions of r placed against the roofline whose bandwidth was measured right before and
 * after each (r->rep_mem; npulm_roofline_pair), for 'work' per token (MACs or bytes) against
 * min(peak, intensity * bandwidth): on a host whose bandwidth drifts, each repetition against the
 * ceiling it had where that is known, where the ceiling of the whole run may come from another
 * moment. No figures (NAN) if they cannot be placed. */
static npulm_paired pair_reps(const struct result *r, double work, double peak, double intensity) {
  double ts[1024], rate[1024];
  npulm_paired p = {NAN, 0, NAN};
  bench_samples_ts(r, ts);
  for (int i = 0; i < r->reps; i++) rate[i] = work * ts[i];
  (void)npulm_roofline_pair(rate, r->rep_mem, r->reps, peak, intensity, &p, NULL);
  return p;
}

/* pair_reps on the roofline at the test's intensity (the placement's '% paired'). */
static npulm_paired paired_roof_pct(const struct model_desc *d, const struct result *r,
                                    const struct placement *pl) {
  return pair_reps(r, (double)r->bound.macs / bench_n_tokens(r), bench_peak_macs(d, r->host),
                   pl->ai);
}

/* pair_reps of a decode test's bytes per token against the bandwidth alone. */
static npulm_paired paired_bw_pct(const struct result *r) {
  return pair_reps(r, r->bytes_per_token, INFINITY, 1.0);
}

static void roofline_for(const char *cmd, const npulm_model *model, struct result *r,
                         const npulm_roofline *host) {
  npulm_error err;
  r->host = host;
  if (npulm_predict(model, NULL, host, r->n_prompt, r->n_gen, &r->bound, &err) != NPULM_OK) {
    cli_die(cmd, "%s", err.msg);
  }
  int n_prof;
  const npulm_npu_profile *prof = npulm_npu_profiles(&n_prof);
  for (int i = 0; i < n_prof && i < MAX_PROFILES; i++) {
    if (npulm_predict(model, &prof[i], host, r->n_prompt, r->n_gen, &r->pred[i], &err) !=
        NPULM_OK) {
      cli_die(cmd, "%s", err.msg);
    }
  }
  if (r->n_gen > 0) {
    double sum = 0.0;
    for (int pos = r->n_prompt; pos < bench_n_tokens(r); pos++) {
      npulm_decode_traffic t;
      if (npulm_decode_traffic_at(model, pos, &t, &err) != NPULM_OK) cli_die(cmd, "%s", err.msg);
      if (pos == r->n_prompt) r->traffic = t;
      sum += (double)t.bytes;
    }
    r->bytes_per_token = sum / r->n_gen;
  }
}

/* Each ceiling of 'h' the better of its and 'other''s (two measurements of one host and thread
 * count): a ceiling is the most the host can do, and on a shared machine one measurement reads
 * low whenever another job holds a core for its windows. */
static void best_of(npulm_roofline *h, const npulm_roofline *other) {
  h->int8_macs = fmax(h->int8_macs, other->int8_macs);
  h->w4a8_macs = fmax(h->w4a8_macs, other->w4a8_macs);
  h->w8a16_macs = fmax(h->w8a16_macs, other->w8a16_macs);
  h->w4a16_macs = fmax(h->w4a16_macs, other->w4a16_macs);
  h->w4a16_block_macs = fmax(h->w4a16_block_macs, other->w4a16_block_macs);
  h->f32_macs = fmax(h->f32_macs, other->f32_macs);
  h->read_bytes = fmax(h->read_bytes, other->read_bytes);
  h->copy_bytes = fmax(h->copy_bytes, other->copy_bytes);
  h->mem_bytes = fmax(h->read_bytes, h->copy_bytes);
  h->storage_bytes = fmax(h->storage_bytes, other->storage_bytes);
  h->seconds += other->seconds;
}

/* The host's ceilings; the ridge point is that of the program's precision ('d'). */
static void print_host(FILE *f, const npulm_roofline *h, const struct model_desc *d) {
  fprintf(f,
          "roofline of this host, %d threads (the better of a measurement before and one after "
          "the tests, %.1f s in all):\n"
          "  int8 compute  %8.2f GMAC/s  NPU kernel %s on cache-resident shapes\n"
          "  w4a8 compute  %8.2f GMAC/s  NPU kernel %s\n"
          "  w8a16 compute %8.2f GMAC/s  NPU kernel %s\n"
          "  w4a16 compute %8.2f GMAC/s  NPU kernel %s (per channel; in 32-k blocks %.2f)\n"
          "  f32 compute   %8.2f GMAC/s  CPU backend matmul\n"
          "  memory        %8.2f GB/s    the better of a streaming read (%.2f GB/s) and copy "
          "(%.2f GB/s,\n"
          "                                 reads + writes counted) through %.0f MiB\n"
          "  storage       %8.3f GB/s    pread of a %.0f MiB file from a dropped page cache\n"
          "  ridge point   %8.2f MAC/byte (%s)\n",
          h->n_threads, h->seconds, h->int8_macs * 1e-9, h->kernel, h->w4a8_macs * 1e-9,
          h->kernel_w4a8, h->w8a16_macs * 1e-9, h->kernel_w8a16, h->w4a16_macs * 1e-9,
          h->kernel_w4a16, h->w4a16_block_macs * 1e-9, h->f32_macs * 1e-9, h->mem_bytes * 1e-9,
          h->read_bytes * 1e-9, h->copy_bytes * 1e-9, (double)h->buffer_bytes / (1024.0 * 1024.0),
          h->storage_bytes * 1e-9, (double)h->storage_file_bytes / (1024.0 * 1024.0),
          h->mem_bytes > 0 ? bench_peak_macs(d, h) / h->mem_bytes : 0.0, d->precision);
}

static void print_roofline_table(const struct model_desc *d, const struct result *rs, int n) {
  int n_prof;
  const npulm_npu_profile *prof = npulm_npu_profiles(&n_prof);
  if (n_prof > MAX_PROFILES) n_prof = MAX_PROFILES;
  printf("\n| %15s | %7s | %12s | %9s | %8s | %8s | %6s | %9s | %13s |", "test", "threads", "t/s",
         "GMAC/s", "GB/s", "MAC/B", "bound", "% ceiling", "% paired");
  for (int p = 0; p < n_prof; p++) printf(" %11s t/s |", prof[p].name);
  printf(
      "\n| --------------: | ------: | -----------: | --------: | -------: | -------: | ------ | "
      "--------: | ------------: |");
  for (int p = 0; p < n_prof; p++) printf(" --------------: |");
  printf("\n");
  for (int i = 0; i < n; i++) {
    const struct result *r = &rs[i];
    struct placement pl;
    bench_place(d, r, &pl);
    char name[48];
    bench_test_name(r, name, sizeof(name));
    const npulm_paired pr = paired_roof_pct(d, r, &pl);
    /* the median, and how many repetitions it rests on when not all */
    char paired[32] = "-";
    if (!isnan(pr.pct)) {
      const int len = snprintf(paired, sizeof(paired), "%.1f%%", pr.pct);
      if (pr.n_known < r->reps)
        snprintf(paired + len, sizeof(paired) - (size_t)len, " (%d/%d)", pr.n_known, r->reps);
    }
    printf("| %15s | %7d | %12.2f | %9.3f | %8.3f | %8.2f | %-6s | %8.1f%% | %13s |", name,
           r->n_threads, bench_avg_ts(r), pl.macs_s * 1e-9, pl.bytes_s * 1e-9, pl.ai,
           pl.memory_bound ? "memory" : "MACs", pl.pct, paired);
    for (int p = 0; p < n_prof; p++) {
      printf(" %15.2f |", r->pred[p].seconds > 0 ? bench_n_tokens(r) / r->pred[p].seconds : 0.0);
    }
    printf("\n");
  }
  printf("\n");
  for (int i = 0; i < n; i++) {
    const struct result *r = &rs[i];
    char name[48];
    bench_test_name(r, name, sizeof(name));
    if (r->n_gen > 0) {
      const double ceiling = r->host->mem_bytes / r->bytes_per_token;
      double lo = r->rep_mem[0], hi = lo;
      for (int k = 1; k <= r->reps; k++) {
        lo = fmin(lo, r->rep_mem[k]);
        hi = fmax(hi, r->rep_mem[k]);
      }
      const npulm_paired pb = paired_bw_pct(r);
      printf("%s: %.3f MB per token (NPU weights %.3f MB, CPU weights %.3f MB, KV cache %.3f MB "
             "at position %d); the bandwidth ceiling allows %.1f t/s, measured %.1f%% of it; "
             "against the bandwidth around each repetition (%.2f-%.2f GB/s), ",
             name, r->bytes_per_token * 1e-6, r->traffic.weight_bytes_npu * 1e-6,
             r->traffic.weight_bytes_cpu * 1e-6, r->traffic.kv_bytes * 1e-6, r->n_prompt, ceiling,
             100.0 * bench_avg_ts(r) / ceiling, lo * 1e-9, hi * 1e-9);
      if (!isnan(pb.pct))
        printf("%.1f%% (median of the %d of %d whose two agree within %.0f%%)", pb.pct, pb.n_known,
               r->reps, 100.0 * NPULM_PAIR_SPREAD);
      else printf("none whose two agree within %.0f%%", 100.0 * NPULM_PAIR_SPREAD);
      printf("; each against the better of its two, %.1f%% (median)\n", pb.pct_all);
    } else {
      printf("%s: %.3f GMAC per run; the %s ceiling allows %.1f t/s, measured %.1f%% of it\n", name,
             r->bound.macs * 1e-9, d->precision,
             bench_n_tokens(r) * bench_peak_macs(d, r->host) / (double)r->bound.macs,
             100.0 * bench_avg_ts(r) * (double)r->bound.macs / bench_n_tokens(r) /
                 bench_peak_macs(d, r->host));
    }
  }
  printf("\nNPU profiles (the cost model: per node max(MACs / peak, DRAM bytes / bandwidth), CPU "
         "nodes at this host's rates, plus dispatch per NPU subgraph and DRAM transfers):\n");
  for (int p = 0; p < n_prof; p++) {
    printf("  %-12s %s: %.1f int8 TOPS (w8a16 %.1f, w4a8 %.1f, w4a16 %.1f), %.1f fp16 TFLOPS, "
           "%.1f GB/s, %.0f MiB SRAM, %.0f us per dispatch (estimates: %s)\n",
           prof[p].name, prof[p].part, prof[p].int8_tops, prof[p].w8a16_tops, prof[p].w4a8_tops,
           prof[p].w4a16_tops, prof[p].fp16_tflops, prof[p].dram_gbs, prof[p].sram_mib,
           prof[p].dispatch_us, prof[p].estimates);
  }
  for (int i = 0; i < n; i++) {
    const struct result *r = &rs[i];
    char name[48];
    bench_test_name(r, name, sizeof(name));
    printf("  %s:", name);
    for (int p = 0; p < n_prof; p++) {
      const npulm_prediction *q = &r->pred[p];
      printf(" %s %.2f ms (NPU %.2f, CPU %.2f, dispatch %.2f x %d, transfer %.2f)%s", prof[p].name,
             q->seconds * 1e3, q->npu_s * 1e3, q->cpu_s * 1e3, q->dispatch_s * 1e3, q->n_dispatches,
             q->transfer_s * 1e3, p + 1 < n_prof ? ";" : "\n");
    }
  }
}

/* ---- --profile ------------------------------------------------------------------------------ */

/* Where one run of test 'r' spends its node time, per operator and backend. */
static void print_profile(const struct result *r) {
  char name[48];
  bench_test_name(r, name, sizeof(name));
  double total = 0.0;
  for (int i = 0; i < r->n_profile; i++) total += r->profile[i].seconds;
  const double reps = r->reps > 0 ? r->reps : 1;
  printf("\nprofile of %s, per run (wall %.2f ms; node time %.2f ms, the NPU and CPU workers'"
         " added):\n",
         name, (double)bench_avg_ns(r) * 1e-6, total / reps * 1e3);
  printf("workers in their subgraphs: NPU %.2f ms, CPU %.2f ms, both at once %.2f ms (the rest of"
         " the wall, each waits or lends itself to the other's loops)\n",
         r->busy.npu_busy_s / reps * 1e3, r->busy.cpu_busy_s / reps * 1e3,
         r->busy.overlap_s / reps * 1e3);
  printf("| %-9s | %-7s | %8s | %9s | %7s | %8s | %7s |\n", "op", "backend", "calls", "ms",
         "% nodes", "GMAC/s", "GB/s");
  printf("| --------- | ------- | -------: | --------: | ------: | -------: | ------: |\n");
  for (int i = 0; i < r->n_profile; i++) {
    const npulm_profile_entry *e = &r->profile[i];
    char gmac[16] = "", gbs[16] = "";
    if (e->macs > 0 && e->seconds > 0) {
      snprintf(gmac, sizeof(gmac), "%.1f", e->macs / e->seconds * 1e-9);
    }
    if (e->weight_bytes > 0 && e->seconds > 0) {
      snprintf(gbs, sizeof(gbs), "%.1f", e->weight_bytes / e->seconds * 1e-9);
    }
    printf("| %-9s | %-7s | %8.0f | %9.3f | %6.1f%% | %8s | %7s |\n", e->op, e->backend,
           (double)e->calls / reps, e->seconds / reps * 1e3,
           total > 0 ? 100.0 * e->seconds / total : 0.0, gmac, gbs);
  }
}

/* A percentage, or null where there is none (NAN). */
static json_t *json_pct(double pct) { return isnan(pct) ? json_null() : json_real(pct); }

static json_t *profile_json(const struct result *r) {
  json_t *arr = json_array();
  const double reps = r->reps > 0 ? r->reps : 1;
  for (int i = 0; i < r->n_profile; i++) {
    const npulm_profile_entry *e = &r->profile[i];
    json_t *o = json_object();
    json_object_set_new(o, "op", json_string(e->op));
    json_object_set_new(o, "backend", json_string(e->backend));
    json_object_set_new(o, "calls_per_run", json_real((double)e->calls / reps));
    json_object_set_new(o, "ms_per_run", json_real(e->seconds / reps * 1e3));
    json_object_set_new(o, "macs_per_run", json_real((double)e->macs / reps));
    json_object_set_new(o, "weight_bytes_per_run", json_real((double)e->weight_bytes / reps));
    json_array_append_new(arr, o);
  }
  return arr;
}

/* ---- JSON (llama-bench's fields, then npulm's) ------------------------------------------- */

static json_t *result_json(const struct model_desc *d, const struct result *r) {
  json_t *o = json_object();
  json_object_set_new(o, "build_commit", json_string("npulm"));
  json_object_set_new(o, "build_number", json_integer(0));
  json_object_set_new(o, "cpu_info", json_string(d->cpu));
  json_object_set_new(o, "gpu_info", json_string(""));
  json_object_set_new(o, "backends", json_string(BACKEND));
  json_object_set_new(o, "model_filename", json_string(d->path));
  json_object_set_new(o, "model_type", json_string(d->type));
  json_object_set_new(o, "model_size", json_integer((json_int_t)d->size));
  json_object_set_new(o, "model_n_params", json_integer((json_int_t)d->n_params));
  json_object_set_new(o, "n_batch",
                      json_integer(bench_n_tokens(r))); /* one evaluation per prompt */
  json_object_set_new(o, "n_ubatch", json_integer(d->n_ubatch));
  json_object_set_new(o, "n_threads", json_integer(r->n_threads));
  json_object_set_new(o, "cpu_mask", json_string("0x0"));
  json_object_set_new(o, "cpu_strict", json_false());
  json_object_set_new(o, "poll", json_integer(0));
  json_object_set_new(o, "type_k", json_string("f32"));
  json_object_set_new(o, "type_v", json_string("f32"));
  json_object_set_new(o, "n_gpu_layers", json_integer(0));
  json_object_set_new(o, "n_cpu_moe", json_integer(0));
  json_object_set_new(o, "split_mode", json_string("none"));
  json_object_set_new(o, "main_gpu", json_integer(0));
  json_object_set_new(o, "no_kv_offload", json_false());
  json_object_set_new(o, "flash_attn", json_integer(0));
  json_object_set_new(o, "devices", json_string("none"));
  json_object_set_new(o, "tensor_split", json_string("0.00"));
  json_object_set_new(o, "tensor_buft_overrides", json_string("none"));
  json_object_set_new(o, "load_mode", json_string("mmap"));
  json_object_set_new(o, "lazy_mode", json_string("none"));
  json_object_set_new(o, "embeddings", json_false());
  json_object_set_new(o, "no_op_offload", json_integer(0));
  json_object_set_new(o, "no_host", json_false());
  json_object_set_new(o, "fit_target", json_integer(0));
  json_object_set_new(o, "fit_min_ctx", json_integer(0));
  json_object_set_new(o, "n_prompt", json_integer(r->n_prompt));
  json_object_set_new(o, "n_gen", json_integer(r->n_gen));
  json_object_set_new(o, "n_depth", json_integer(0));
  json_object_set_new(o, "test_time", json_string(r->test_time));
  json_object_set_new(o, "avg_ns", json_integer((json_int_t)bench_avg_ns(r)));
  json_object_set_new(o, "stddev_ns", json_integer((json_int_t)bench_stdev_ns(r)));
  json_object_set_new(o, "avg_ts", json_real(bench_avg_ts(r)));
  json_object_set_new(o, "stddev_ts", json_real(bench_stdev_ts(r)));
  json_t *ns = json_array(), *ts = json_array();
  double tsv[1024];
  bench_samples_ts(r, tsv);
  for (int i = 0; i < r->reps; i++) {
    json_array_append_new(ns, json_integer((json_int_t)r->samples_ns[i]));
    json_array_append_new(ts, json_real(tsv[i]));
  }
  json_object_set_new(o, "samples_ns", ns);
  json_object_set_new(o, "samples_ts", ts);
  /* npulm's own */
  json_object_set_new(o, "quant", json_string(d->quant));
  json_object_set_new(o, "ttft_ms", json_real(r->ttft_s * 1e3));
  json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)r->peak_rss));
  if (r->n_profile > 0) json_object_set_new(o, "profile", profile_json(r));
  if (r->host != NULL) {
    const npulm_roofline *h = r->host;
    struct placement pl;
    bench_place(d, r, &pl);
    json_t *rl = json_object();
    json_object_set_new(rl, "int8_macs_per_s", json_real(h->int8_macs));
    json_object_set_new(rl, "f32_macs_per_s", json_real(h->f32_macs));
    json_object_set_new(rl, "w4a8_macs_per_s", json_real(h->w4a8_macs));
    json_object_set_new(rl, "w8a16_macs_per_s", json_real(h->w8a16_macs));
    json_object_set_new(rl, "w4a16_macs_per_s", json_real(h->w4a16_macs));
    json_object_set_new(rl, "w4a16_block_macs_per_s", json_real(h->w4a16_block_macs));
    json_object_set_new(rl, "mem_bytes_per_s", json_real(h->mem_bytes));
    json_object_set_new(rl, "read_bytes_per_s", json_real(h->read_bytes));
    json_object_set_new(rl, "storage_bytes_per_s", json_real(h->storage_bytes));
    json_object_set_new(rl, "copy_bytes_per_s", json_real(h->copy_bytes));
    json_object_set_new(rl, "kernel", json_string(h->kernel));
    json_object_set_new(rl, "kernel_w4a8", json_string(h->kernel_w4a8));
    json_object_set_new(rl, "kernel_w8a16", json_string(h->kernel_w8a16));
    json_object_set_new(rl, "kernel_w4a16", json_string(h->kernel_w4a16));
    json_object_set_new(rl, "precision", json_string(d->precision));
    json_object_set_new(rl, "macs", json_integer((json_int_t)r->bound.macs));
    json_object_set_new(rl, "bytes", json_integer((json_int_t)r->bound.bytes));
    json_object_set_new(rl, "macs_per_s", json_real(pl.macs_s));
    json_object_set_new(rl, "bytes_per_s", json_real(pl.bytes_s));
    json_object_set_new(rl, "intensity", json_real(pl.ai));
    json_object_set_new(rl, "bound", json_string(pl.memory_bound ? "memory" : "compute"));
    json_object_set_new(rl, "peak_macs_per_s", json_real(bench_peak_macs(d, h)));
    json_object_set_new(rl, "pct_of_ceiling", json_real(pl.pct));
    const npulm_paired pc = paired_roof_pct(d, r, &pl);
    json_object_set_new(rl, "pct_of_ceiling_paired", json_pct(pc.pct));
    json_object_set_new(rl, "reps_paired_ceiling", json_integer(pc.n_known));
    json_object_set_new(rl, "pct_of_ceiling_paired_all", json_pct(pc.pct_all));
    json_t *around = json_array();
    for (int i = 0; i <= r->reps; i++) json_array_append_new(around, json_real(r->rep_mem[i]));
    json_object_set_new(rl, "mem_bytes_per_s_around_reps", around);
    if (r->n_gen > 0) {
      json_object_set_new(rl, "bytes_per_token", json_real(r->bytes_per_token));
      json_object_set_new(rl, "pct_of_bandwidth",
                          json_real(100.0 * bench_avg_ts(r) * r->bytes_per_token / h->mem_bytes));
      const npulm_paired pb = paired_bw_pct(r);
      json_object_set_new(rl, "pct_of_bandwidth_paired", json_pct(pb.pct));
      json_object_set_new(rl, "reps_paired_bandwidth", json_integer(pb.n_known));
      json_object_set_new(rl, "pct_of_bandwidth_paired_all", json_pct(pb.pct_all));
    }
    json_object_set_new(o, "roofline", rl);
    json_t *pr = json_object();
    int n_prof;
    const npulm_npu_profile *prof = npulm_npu_profiles(&n_prof);
    for (int p = 0; p < n_prof && p < MAX_PROFILES; p++) {
      const npulm_prediction *q = &r->pred[p];
      json_t *e = json_object();
      json_object_set_new(e, "avg_ts",
                          json_real(q->seconds > 0 ? bench_n_tokens(r) / q->seconds : 0));
      json_object_set_new(e, "seconds", json_real(q->seconds));
      json_object_set_new(e, "npu_s", json_real(q->npu_s));
      json_object_set_new(e, "cpu_s", json_real(q->cpu_s));
      json_object_set_new(e, "dispatch_s", json_real(q->dispatch_s));
      json_object_set_new(e, "transfer_s", json_real(q->transfer_s));
      json_object_set_new(e, "n_dispatches", json_integer(q->n_dispatches));
      json_object_set_new(pr, prof[p].name, e);
    }
    json_object_set_new(o, "predicted", pr);
  }
  return o;
}

/* ---- the command --------------------------------------------------------------------------- */

static void parse(struct cli_args *a, struct bench_opts *o, npulm_compile_params *cp) {
  for (a->i = 2; a->i < a->argc; a->i++) {
    const char *s = a->argv[a->i];
    if (cli_wants_help(a)) exit(0);
    else if (cli_is_opt(s, "-m", "--model")) o->model_path = cli_opt_value(a);
    else if (cli_is_opt(s, "-p", "--n-prompt"))
      o->n_prompts = cli_opt_list(a, o->prompts, MAX_LIST, 0, 1 << 20);
    else if (cli_is_opt(s, "-n", "--n-gen"))
      o->n_gens = cli_opt_list(a, o->gens, MAX_LIST, 0, 1 << 20);
    else if (cli_is_opt(s, "-t", "--threads"))
      o->n_threads = cli_opt_list(a, o->threads, MAX_LIST, 1, 1024);
    else if (cli_is_opt(s, "-r", "--repetitions")) o->reps = (int)cli_opt_int(a, 1, 1000);
    else if (cli_is_opt(s, "-o", "--output")) {
      const char *v = cli_opt_value(a);
      if (strcmp(v, "md") == 0) o->json = false;
      else if (strcmp(v, "json") == 0) o->json = true;
      else cli_die(a->cmd, "option -o: '%s' is not md or json", v);
    } else if (cli_is_opt(s, NULL, "--no-warmup")) o->warmup = false;
    else if (cli_is_opt(s, NULL, "--roofline")) o->roofline = true;
    else if (cli_is_opt(s, NULL, "--profile")) o->profile = true;
    else if (cli_session_option(a, &o->session)) continue;
    else if (cli_open_option(a, &o->open)) continue;
    else if (cli_is_opt(s, NULL, "--plot")) {
      o->plot = cli_opt_value(a);
      o->roofline = true;
    } else if (cli_compile_option(a, cp, false)) continue;
    else cli_unknown_option(a);
  }
}

int npulm_cmd_bench(int argc, char **argv) {
  struct cli_args a = {
      .argc = argc, .argv = argv, .i = 2, .cmd = "bench", .usage = npulm_usage_bench};
  struct bench_opts o = {.prompts = {512},
                         .n_prompts = 1,
                         .gens = {128},
                         .n_gens = 1,
                         .n_threads = 0,
                         .reps = 5,
                         .warmup = true};
  npulm_compile_params cp = npulm_compile_default_params();
  parse(&a, &o, &cp);
  if (o.n_threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads[0] = n > 0 ? (int)n : 1;
    o.n_threads = 1;
  }
  if (o.plot != NULL) {
    /* fail now rather than after minutes of measuring (and leave no empty file behind) */
    const bool existed = access(o.plot, F_OK) == 0;
    FILE *f = fopen(o.plot, "a");
    if (f == NULL) cli_die(a.cmd, "cannot write '%s'", o.plot);
    fclose(f);
    if (!existed) remove(o.plot);
  }

  /* the tests, in llama-bench's order: per thread count, every pp, then every tg */
  int n_tests = 0, max_ctx = 0;
  struct result *rs = calloc((size_t)o.n_threads * (size_t)(o.n_prompts + o.n_gens), sizeof(*rs));
  if (rs == NULL) cli_die(a.cmd, "out of memory");
  for (int t = 0; t < o.n_threads; t++) {
    for (int i = 0; i < o.n_prompts; i++) {
      if (o.prompts[i] > 0)
        rs[n_tests++] = (struct result){.n_prompt = o.prompts[i], .n_threads = o.threads[t]};
    }
    for (int i = 0; i < o.n_gens; i++) {
      if (o.gens[i] > 0)
        rs[n_tests++] = (struct result){.n_gen = o.gens[i], .n_threads = o.threads[t]};
    }
  }
  for (int i = 0; i < n_tests; i++) {
    if (bench_n_tokens(&rs[i]) > max_ctx) max_ctx = bench_n_tokens(&rs[i]);
  }
  if (n_tests == 0) cli_die(a.cmd, "no tests: -p and -n are both 0");

  const char *path = cli_resolve_model(a.cmd, o.model_path);
  npulm_model *model;
  npulm_error err;
  if (npulm_model_open_params(path, &o.open, &model, &err) != NPULM_OK) {
    cli_die(a.cmd, "%s", err.msg);
  }
  if (!npulm_model_has_program(model)) {
    struct cli_progress progress = {.lines = false};
    cp.progress = cli_progress;
    cp.progress_user = &progress;
    if (npulm_model_compile(model, &cp, &err) != NPULM_OK) cli_die(a.cmd, "%s", err.msg);
  }
  cli_free_compile_params(&cp);
  /* every test must fit before any runs: one session of the largest context */
  npulm_session_params sp = npulm_session_default_params();
  sp.n_ctx = max_ctx;
  npulm_session *probe;
  if (npulm_session_create(model, &sp, &probe, &err) != NPULM_OK) {
    cli_die(a.cmd, "a test of %d tokens does not fit: %s", max_ctx, err.msg);
  }
  npulm_session_free(probe);

  struct model_desc d;
  describe_model(a.cmd, model, path, &d);
  d.n_ubatch = npulm_program_max_rows(model);

  /* the host's ceilings, once per thread count, before and after the tests (best_of) */
  npulm_roofline hosts[MAX_LIST], before[MAX_LIST];
  for (int t = 0; o.roofline && t < o.n_threads; t++) {
    if (npulm_roofline_measure(o.threads[t], &before[t], &err) != NPULM_OK) {
      cli_die(a.cmd, "%s", err.msg);
    }
  }
  if (!o.json) print_md_header();
  for (int i = 0; i < n_tests; i++) {
    run_test(a.cmd, model, &o, &rs[i]);
    if (!o.json) print_md_row(&d, &rs[i]);
  }
  if (!o.json) printf("\nbuild: npulm (%s)\n", d.quant);

  if (o.roofline) {
    for (int t = 0; t < o.n_threads; t++) {
      if (npulm_roofline_measure(o.threads[t], &hosts[t], &err) != NPULM_OK) {
        cli_die(a.cmd, "%s", err.msg);
      }
      best_of(&hosts[t], &before[t]);
      if (!o.json) printf("\n");
      print_host(o.json ? stderr : stdout, &hosts[t], &d);
    }
    for (int i = 0; i < n_tests; i++) {
      int t = 0;
      while (o.threads[t] != rs[i].n_threads) t++;
      roofline_for(a.cmd, model, &rs[i], &hosts[t]);
    }
    if (!o.json) print_roofline_table(&d, rs, n_tests);
  }
  if (o.profile && !o.json) {
    for (int i = 0; i < n_tests; i++) print_profile(&rs[i]);
  }
  if (o.json) {
    json_t *arr = json_array();
    for (int i = 0; i < n_tests; i++) json_array_append_new(arr, result_json(&d, &rs[i]));
    json_dumpf(arr, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    fputc('\n', stdout);
    json_decref(arr);
  }
  fflush(stdout);
  if (o.plot != NULL) {
    if (!bench_write_svg(o.plot, &d, rs, n_tests, hosts, o.n_threads)) {
      cli_die(a.cmd, "cannot write '%s'", o.plot);
    }
    fprintf(stderr, "wrote %s\n", o.plot);
  }
  for (int i = 0; i < n_tests; i++) {
    free(rs[i].samples_ns);
    free(rs[i].rep_mem);
  }
  free(rs);
  npulm_model_close(model);
  return 0;
}
