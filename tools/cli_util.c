/* Helpers the npulm CLI commands share (see cli_util.h). */
#include "cli_util.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void cli_die(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "npulm %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

bool cli_is_opt(const char *arg, const char *short_name, const char *long_name) {
  return (short_name != NULL && strcmp(arg, short_name) == 0) || strcmp(arg, long_name) == 0;
}

const char *cli_opt_value(struct cli_args *a) {
  if (a->i + 1 >= a->argc) cli_die(a->cmd, "option %s needs a value", a->argv[a->i]);
  return a->argv[++a->i];
}

long long cli_opt_int(struct cli_args *a, long long min, long long max) {
  const char *name = a->argv[a->i];
  const char *s = cli_opt_value(a);
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || *s == '\0' || *end != '\0' || v < min || v > max) {
    cli_die(a->cmd, "option %s: '%s' is not an integer in [%lld, %lld]", name, s, min, max);
  }
  return v;
}

uint64_t cli_opt_size(struct cli_args *a) {
  const char *name = a->argv[a->i];
  const char *s = cli_opt_value(a);
  char *end;
  errno = 0;
  const double v = strtod(s, &end);
  double unit = 1.0;
  if (*end == 'K' || *end == 'k') unit = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') unit = 1024.0 * 1024.0, end++;
  else if (*end == 'G' || *end == 'g') unit = 1024.0 * 1024.0 * 1024.0, end++;
  if (errno != 0 || end == s || *end != '\0' || !(v > 0.0) || v * unit >= 0x1p63) {
    cli_die(a->cmd, "option %s: '%s' is not a size (a positive number, optionally K, M or G)", name,
            s);
  }
  return (uint64_t)(v * unit);
}

bool cli_open_option(struct cli_args *a, npulm_open_params *op) {
  const char *o = a->argv[a->i];
  if (cli_is_opt(o, NULL, "--mem-budget")) op->mem_budget = cli_opt_size(a);
  else if (cli_is_opt(o, NULL, "--cold")) op->cold = true;
  else if (cli_is_opt(o, NULL, "--buffered-io")) op->buffered_io = true;
  else return false;
  return true;
}

int cli_opt_list(struct cli_args *a, int *out, int max, long min, long max_value) {
  const char *name = a->argv[a->i];
  const char *s = cli_opt_value(a);
  int n = 0;
  const char *p = s;
  for (;;) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno != 0 || end == p || v < min || v > max_value || (*end != ',' && *end != '\0') ||
        n == max) {
      cli_die(a->cmd, "option %s: '%s' is not a list of at most %d integers in [%ld, %ld]", name, s,
              max, min, max_value);
    }
    out[n++] = (int)v;
    if (*end == '\0') break;
    p = end + 1;
  }
  return n;
}

void cli_unknown_option(struct cli_args *a) {
  cli_die(a->cmd, "unknown option '%s' (see 'npulm %s --help')", a->argv[a->i], a->cmd);
}

bool cli_wants_help(struct cli_args *a) {
  if (cli_is_opt(a->argv[a->i], "-h", "--help")) {
    fputs(a->usage, stdout);
    return true;
  }
  return false;
}

const char *cli_resolve_model(const char *cmd, const char *path) {
  if (path != NULL) return path;
  const char *env = getenv("NPULM_MODEL");
  if (env != NULL && *env != '\0') return env;
  if (access(CLI_DEFAULT_MODEL_PATH, R_OK) == 0) return CLI_DEFAULT_MODEL_PATH;
  cli_die(cmd, "no model given: pass -m MODEL.gguf or set NPULM_MODEL");
}

float cli_opt_float(struct cli_args *a) {
  const char *name = a->argv[a->i];
  const char *s = cli_opt_value(a);
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  /* strtof takes "inf" and "nan", which no option means */
  if (errno != 0 || *s == '\0' || *end != '\0' || !isfinite(v)) {
    cli_die(a->cmd, "option %s: '%s' is not a finite number", name, s);
  }
  return v;
}

/* The whole of stream 'f' ('name' for the message), as cli_read_file. */
static char *read_stream(const char *cmd, FILE *f, const char *name, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf != NULL) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    char *bigger = realloc(buf, cap *= 2);
    if (bigger == NULL) free(buf);
    buf = bigger;
  }
  if (buf == NULL) cli_die(cmd, "out of memory");
  if (ferror(f)) cli_die(cmd, "cannot read %s", name);
  *len = n;
  return buf;
}

void cli_compile_batch(struct cli_args *a, npulm_compile_params *cp, int batch) {
  static const int defaults[] = {16, 64, 128};
  assert(batch >= 1 && batch <= CLI_MAX_BATCH);
  int sizes[NPULM_MAX_CHUNKS + 12], n = 0; /* 12 powers of two reach CLI_MAX_BATCH */
  if (cp->n_chunks == 0) {
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) sizes[n++] = defaults[i];
  } else {
    for (int i = 0; i < cp->n_chunks; i++) sizes[n++] = cp->chunks[i];
  }
  for (int b = 2; b / 2 < batch; b *= 2) sizes[n++] = b;
  int out = 0; /* insertion sort, dropping repeats */
  for (int i = 0; i < n; i++) {
    int j = out;
    while (j > 0 && cp->chunks[j - 1] > sizes[i]) j--;
    if (j > 0 && cp->chunks[j - 1] == sizes[i]) continue;
    if (out == NPULM_MAX_CHUNKS) {
      cli_die(a->cmd, "batch %d: with the chunk sizes, more than %d sizes", batch,
              NPULM_MAX_CHUNKS);
    }
    memmove(&cp->chunks[j + 1], &cp->chunks[j], (size_t)(out - j) * sizeof(int));
    cp->chunks[j] = sizes[i];
    out++;
  }
  cp->n_chunks = out;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) cli_die(cmd, "cannot open '%s': %s", path, strerror(errno));
  char name[4096 + 2];
  snprintf(name, sizeof(name), "'%s'", path);
  char *buf = read_stream(cmd, f, name, len);
  fclose(f);
  return buf;
}

char *cli_read_stdin(const char *cmd, size_t *len) { return read_stream(cmd, stdin, "stdin", len); }

bool cli_compile_option(struct cli_args *a, npulm_compile_params *cp, bool ctx_is_buckets) {
  const char *o = a->argv[a->i];
  if (cli_is_opt(o, NULL, "--chunks")) {
    /* a --batch before it would be lost: the list replaces the chunk sizes */
    for (int i = 2; i < a->i; i++) {
      if (strcmp(a->argv[i], "--batch") == 0) {
        cli_die(a->cmd, "%s", "give --chunks before --batch (which adds to the chunk sizes)");
      }
    }
    cp->n_chunks = cli_opt_list(a, cp->chunks, NPULM_MAX_CHUNKS, 1, 1L << 24);
  } else if (cli_is_opt(o, NULL, "--batch")) {
    cli_compile_batch(a, cp, (int)cli_opt_int(a, 1, CLI_MAX_BATCH));
  } else if (cli_is_opt(o, NULL, "--buckets") || (ctx_is_buckets && cli_is_opt(o, NULL, "--ctx"))) {
    cp->n_buckets = cli_opt_list(a, cp->buckets, NPULM_MAX_BUCKETS, 1, 1L << 24);
  } else if (cli_is_opt(o, NULL, "--quant")) {
    cp->quant = cli_opt_value(a);
  } else if (cli_is_opt(o, NULL, "--float-ops")) {
    cp->float_ops = cli_opt_value(a);
  } else if (cli_is_opt(o, NULL, "--calib-tokens")) {
    cp->calib_tokens = (int)cli_opt_int(a, 1, 1 << 24);
  } else if (cli_is_opt(o, NULL, "--smooth-alpha")) {
    /* "auto": chosen per block and matmul input */
    const char *v = a->i + 1 < a->argc ? a->argv[a->i + 1] : NULL;
    if (v != NULL && strcmp(v, "auto") == 0) {
      a->i++;
      cp->smooth_alpha = NPULM_SMOOTH_ALPHA_AUTO;
    } else {
      /* 0 is the library's "default" (0.5): as an option it is out of range like 1 */
      cp->smooth_alpha = cli_opt_float(a);
      if (!(cp->smooth_alpha > 0.0f && cp->smooth_alpha < 1.0f)) {
        cli_die(a->cmd, "option --smooth-alpha: %g is not in (0, 1) (nor auto)",
                (double)cp->smooth_alpha);
      }
    }
  } else if (cli_is_opt(o, NULL, "--shadow-threshold")) {
    cp->shadow_threshold = cli_opt_float(a);
    if (!(cp->shadow_threshold > 1.0f)) { /* 0 too, the library's "default" (6) */
      cli_die(a->cmd, "option --shadow-threshold: %g is not above 1", (double)cp->shadow_threshold);
    }
  } else if (cli_is_opt(o, NULL, "--sparsity")) {
    /* "auto": the largest level within 1 % of dense perplexity */
    const char *v = a->i + 1 < a->argc ? a->argv[a->i + 1] : NULL;
    if (v != NULL && strcmp(v, "auto") == 0) {
      a->i++;
      cp->sparsity = NPULM_SPARSITY_AUTO;
    } else {
      cp->sparsity = cli_opt_float(a);
      if (!(cp->sparsity >= 0.0f && cp->sparsity < 1.0f)) {
        cli_die(a->cmd, "option --sparsity: %g is not in [0, 1) nor auto", (double)cp->sparsity);
      }
    }
  } else if (cli_is_opt(o, NULL, "--sparse-form")) {
    const char *v = cli_opt_value(a);
    if (strcmp(v, "input") == 0) cp->sparse_form = NPULM_SPARSE_FORM_INPUT;
    else if (strcmp(v, "neuron") == 0) cp->sparse_form = NPULM_SPARSE_FORM_NEURON;
    else cli_die(a->cmd, "option --sparse-form: '%s' is not input or neuron", v);
  } else if (cli_is_opt(o, NULL, "--sparse-rank")) {
    cp->sparse_rank = (int)cli_opt_int(a, 1, 1 << 16);
  } else if (cli_is_opt(o, NULL, "--sparse-recall")) {
    cp->sparse_recall = cli_opt_float(a);
    if (!(cp->sparse_recall > 0.0f && cp->sparse_recall <= 1.0f)) {
      cli_die(a->cmd, "option --sparse-recall: %g is not in (0, 1]", (double)cp->sparse_recall);
    }
  } else if (cli_is_opt(o, NULL, "--keep-float")) {
    cp->keep_float = true;
  } else if (cli_is_opt(o, NULL, "--calib")) {
    free((char *)cp->calib_text);
    cp->calib_text = cli_read_file(a->cmd, cli_opt_value(a), &cp->calib_len);
  } else {
    return false;
  }
  return true;
}

bool cli_session_option(struct cli_args *a, npulm_session_params *sp) {
  const char *o = a->argv[a->i];
  if (cli_is_opt(o, NULL, "--sparse")) {
    const char *v = cli_opt_value(a);
    if (strcmp(v, "predict") == 0) sp->sparse = NPULM_SPARSE_PREDICT;
    else if (strcmp(v, "off") == 0) sp->sparse = NPULM_SPARSE_OFF;
    else if (strcmp(v, "exact") == 0) sp->sparse = NPULM_SPARSE_EXACT;
    else cli_die(a->cmd, "option --sparse: '%s' is not predict, exact or off", v);
  } else if (cli_is_opt(o, NULL, "--sparse-audit")) {
    sp->sparse_audit = true;
  } else {
    return false;
  }
  return true;
}

void cli_compile_if_needed(const char *cmd, npulm_model *model, npulm_compile_params *cp,
                           bool reference) {
  npulm_error err;
  if (reference || npulm_model_has_program(model)) return;
  struct cli_progress progress = {.lines = false};
  cp->progress = cli_progress;
  cp->progress_user = &progress;
  const npulm_status st = npulm_model_compile(model, cp, &err);
  cp->progress = NULL; /* 'progress' ends here */
  cp->progress_user = NULL;
  if (st != NPULM_OK) cli_die(cmd, "%s", err.msg);
}

void cli_free_compile_params(npulm_compile_params *cp) {
  free((char *)cp->calib_text);
  cp->calib_text = NULL;
}

/* "12.3 / 45.6 MB" for bytes, "3 / 16 blocks" for other units. */
static void format_count(char *buf, size_t cap, const char *unit, uint64_t done, uint64_t total) {
  if (strcmp(unit, "bytes") == 0) {
    snprintf(buf, cap, "%.1f / %.1f MB", (double)done / 1e6, (double)total / 1e6);
  } else {
    snprintf(buf, cap, "%" PRIu64 " / %" PRIu64 " %s", done, total, unit);
  }
}

void cli_progress(void *user, const char *phase, const char *unit, uint64_t done, uint64_t total) {
  struct cli_progress *p = user;
  const double now = cli_now();
  if (strcmp(p->phase, phase) != 0) { /* a new phase */
    snprintf(p->phase, sizeof(p->phase), "%s", phase);
    p->start = now;
    p->drawn = false;
  }
  const bool tty = isatty(STDERR_FILENO);
  const double elapsed = now - p->start;
  char count[64];
  format_count(count, sizeof(count), unit, done, total);
  if (done >= total) {
    if (tty && p->drawn) fputc('\r', stderr);
    if (tty || p->lines) fprintf(stderr, "%-9s %s in %.1f s\n", phase, count, elapsed);
    p->phase[0] = '\0';
    return;
  }
  if (!tty || elapsed < 0.5 || now - p->last_draw < 0.1) return;
  enum { WIDTH = 30 };
  const int filled = total ? (int)(WIDTH * done / total) : 0;
  char bar[WIDTH + 1], eta[24] = "--:--";
  for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
  bar[WIDTH] = '\0';
  if (done > 0) {
    const int left = (int)(elapsed * (double)(total - done) / (double)done + 0.5);
    snprintf(eta, sizeof(eta), "%d:%02d", left / 60, left % 60);
  }
  fprintf(stderr, "\r%-9s [%s] %3d%%  %s  ETA %s  ", phase, bar,
          total ? (int)(100 * done / total) : 0, count, eta);
  p->drawn = true;
  p->last_draw = now;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double percent_of(uint64_t part, uint64_t whole) {
  return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

struct cli_memory_rates cli_memory_rates(const npulm_memory_stats *m) {
  return (struct cli_memory_rates){
      .from_memory = m->bytes_used > 0 ? 100.0 - percent_of(m->bytes_read, m->bytes_used) : 0.0,
      .gate_hits = percent_of(m->hits, m->hits + m->misses),
      .pair_hits = percent_of(m->kept_hits, m->kept_hits + m->kept_misses),
      .read_mib_s = m->read_s > 0 ? (double)m->storage_bytes / 1048576.0 / m->read_s : 0.0};
}
