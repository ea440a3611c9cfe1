/* Calibration: statistics of every named activation of the FP32 reference over calibration text. */
#include "compiler/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/cpu/cpu_ukernels.h"
#include "ref/forward.h"

struct collector {
  struct npu_calib *calib;
  int32_t cap;
  int32_t last; /* index of the last activation seen: the next is usually the one after it */
  npulm_status status;
};

static int32_t bin_of(float v) {
  /* |v| = 1.f * 2^(e - 127): the octave from the exponent bits, the bin within it from the top
   * bits of the fraction (frexpf's (2m - 1) * NPU_CALIB_BINS_PER_OCTAVE, truncated); zeros,
   * subnormals and NaN fall in bin 0, infinities in the last */
  _Static_assert(NPU_CALIB_BINS_PER_OCTAVE == 16, "four fraction bits per octave");
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  const int32_t e = (int32_t)((bits >> 23) & 0xff);
  if (e == 0 || (e == 0xff && (bits & 0x7fffff) != 0)) return 0;
  int64_t bin = ((int64_t)(e - 127) - NPU_CALIB_MIN_EXP) * NPU_CALIB_BINS_PER_OCTAVE +
                (int64_t)((bits >> 19) & 0xf);
  return bin < 0 ? 0 : bin >= NPU_CALIB_BINS ? NPU_CALIB_BINS - 1 : (int32_t)bin;
}

/* Upper edge of histogram bin 'b'. */
static float bin_upper(int32_t b) {
  int octave = b / NPU_CALIB_BINS_PER_OCTAVE, frac = b % NPU_CALIB_BINS_PER_OCTAVE;
  return ldexpf(1.0f + (float)(frac + 1) / NPU_CALIB_BINS_PER_OCTAVE, octave + NPU_CALIB_MIN_EXP);
}

/* The statistics of 'name' ('n' channels, or 0 for a per-head name whose length varies). */
static struct npu_act_stats *find_or_add(struct collector *c, const char *name, int32_t n) {
  struct npu_calib *cal = c->calib;
  /* usually the one after the last, or (scores and probabilities, head after head) next to it */
  for (int32_t d = 1; d >= -1 && cal->n_stats > 0; d--) {
    int32_t at = c->last + d;
    at = at < 0 ? cal->n_stats - 1 : at >= cal->n_stats ? 0 : at;
    if (strcmp(cal->stats[at].name, name) == 0) {
      c->last = at;
      return &cal->stats[at];
    }
  }
  for (int32_t i = 0; i < cal->n_stats; i++) {
    if (strcmp(cal->stats[i].name, name) == 0) {
      c->last = i;
      return &cal->stats[i];
    }
  }
  if (cal->n_stats == c->cap) {
    int32_t cap = c->cap ? 2 * c->cap : 64;
    struct npu_act_stats *bigger = realloc(cal->stats, (size_t)cap * sizeof(*bigger));
    if (bigger == NULL) return NULL;
    cal->stats = bigger;
    c->cap = cap;
  }
  struct npu_act_stats *s = &cal->stats[cal->n_stats];
  memset(s, 0, sizeof(*s));
  snprintf(s->name, sizeof(s->name), "%s", name);
  s->n_channels = n;
  s->min = INFINITY;
  s->max = -INFINITY;
  s->chan_absmax = n > 0 ? calloc((size_t)n, sizeof(float)) : NULL;
  s->chan_sumsq = n > 0 ? calloc((size_t)n, sizeof(double)) : NULL;
  if (n > 0 && (s->chan_absmax == NULL || s->chan_sumsq == NULL)) return NULL;
  c->last = cal->n_stats++;
  return s;
}

/* Fold 'n' values of activation 'name' (channels chan0 .. chan0 + n - 1 of its 'channels', or a
 * per-head one: channels 0) into its statistics. */
/* The statistics of 'name' ('channels' channels, or a per-head one: 0), or NULL with the
 * collector's status set. */
static struct npu_act_stats *stats_for(struct collector *c, const char *name, int32_t channels) {
  if (c->status != NPULM_OK) return NULL;
  struct npu_act_stats *s = find_or_add(c, name, channels);
  if (s == NULL || s->n_channels != channels) {
    c->status = s == NULL ? NPULM_ERR_NOMEM : NPULM_ERR_ARG;
    return NULL;
  }
  return s;
}

/* Fold rows [r0, r1) of 'rows' rows of 'n' values at 'v' (row stride n; channels chan0 .. of
 * 'absmax' and 'sumsq', both NULL or neither) into a minimum, a maximum and a histogram. */
static void fold_rows(const float *v, int n, int r0, int r1, float *absmax, double *sumsq,
                      float *min, float *max, uint64_t *hist) {
  for (int r = r0; r < r1; r++) {
    const float *row = v + (size_t)r * (size_t)n;
    for (int i = 0; i < n; i++) {
      float x = row[i], a = fabsf(x);
      if (x < *min) *min = x;
      if (x > *max) *max = x;
      if (absmax != NULL) {
        if (a > absmax[i]) absmax[i] = a;
        sumsq[i] += (double)x * x;
      }
      hist[bin_of(x)]++;
    }
  }
}

/* Fold 'n' values of activation 'name' (channels chan0 .. chan0 + n - 1 of its 'channels', or a
 * per-head one: channels 0) into its statistics. */
static void accumulate(struct collector *c, const char *name, int32_t channels, int32_t chan0,
                       const float *v, int n) {
  struct npu_act_stats *s = stats_for(c, name, channels);
  if (s == NULL) return;
  const bool chans = channels > 0;
  fold_rows(v, n, 0, 1, chans ? s->chan_absmax + chan0 : NULL, chans ? s->chan_sumsq + chan0 : NULL,
            &s->min, &s->max, s->hist);
  s->count += (uint64_t)n;
}

static void observe(void *user, int layer, const char *what, const float *v, int n) {
  char name[NPU_IR_NAME_MAX];
  if (layer >= 0) snprintf(name, sizeof(name), "blk.%d.%s", layer, what);
  else snprintf(name, sizeof(name), "%s", what);
  accumulate(user, name, npu_ref_per_head(what) ? 0 : n, 0, v, n);
}

void npu_calib_free(struct npu_calib *c) {
  if (c == NULL) return;
  for (int32_t i = 0; i < c->n_stats; i++) {
    free(c->stats[i].chan_absmax);
    free(c->stats[i].chan_sumsq);
  }
  free(c->stats);
  free(c);
}

/* ---- Runs ----------------------------------------------------------------------------------- */

struct npu_calib_run {
  struct npu_config cfg;
  bool scores; /* gather the attention scores' and probabilities' statistics */
  struct collector c;
  struct npu_ref_state state; /* one window's rows at a time */
  struct npu_pool *pool;
  struct npu_cpu_ukernels uk;
  size_t n_rows;         /* rows of all windows, one after another */
  int32_t *ids;          /* (n_rows) their tokens */
  int32_t n_windows;     /* windows, each from position 0 */
  int32_t *win_rows;     /* (n_windows) rows of each */
  float *x;              /* (n_rows, dim) the residual stream after the steps so far */
  struct partial *parts; /* (npu_pool_threads(pool)) one per task of a parallel fold */
};

/* One task's share of a parallel fold: the channels it takes, folded over every row. */
struct partial {
  float min, max;
  uint64_t hist[NPU_CALIB_BINS];
};

struct fold_job {
  const struct npu_calib_run *run;
  const float *v;
  int n, rows, chans_per_task;
  float *absmax; /* (n) or NULL */
  double *sumsq; /* (n) or NULL, as absmax */
};

static void fold_task(void *arg, size_t task) {
  const struct fold_job *j = arg;
  struct partial *part = &j->run->parts[task];
  part->min = INFINITY;
  part->max = -INFINITY;
  memset(part->hist, 0, sizeof(part->hist));
  const int c0 = (int)task * j->chans_per_task;
  const int c1 = c0 + j->chans_per_task < j->n ? c0 + j->chans_per_task : j->n;
  for (int r = 0; r < j->rows && c0 < c1; r++) {
    fold_rows(j->v + (size_t)r * (size_t)j->n + c0, c1 - c0, 0, 1,
              j->absmax != NULL ? j->absmax + c0 : NULL, j->sumsq != NULL ? j->sumsq + c0 : NULL,
              &part->min, &part->max, part->hist);
  }
}

/* Fold 'rows' rows of 'n' values at 'v' (row stride 'stride') of activation 'name' (channels
 * chan0 .. of its 'channels') into its statistics, the channels cut across the pool's threads:
 * each task keeps its own minimum, maximum and histogram, added up after (the same statistics as
 * row after row, since none depends on the order). */
static void accumulate_rows(struct npu_calib_run *r, const char *name, int32_t channels,
                            int32_t chan0, const float *v, int n, int rows) {
  struct npu_act_stats *s = stats_for(&r->c, name, channels);
  if (s == NULL) return;
  const int tasks = npu_pool_threads(r->pool);
  struct fold_job j = {r,
                       v,
                       n,
                       rows,
                       (n + tasks - 1) / tasks,
                       channels > 0 ? s->chan_absmax + chan0 : NULL,
                       channels > 0 ? s->chan_sumsq + chan0 : NULL};
  npu_pool_run(r->pool, (size_t)tasks, fold_task, &j);
  for (int t = 0; t < tasks; t++) {
    const struct partial *part = &r->parts[t];
    s->min = fminf(s->min, part->min);
    s->max = fmaxf(s->max, part->max);
    for (int b = 0; b < NPU_CALIB_BINS; b++) s->hist[b] += part->hist[b];
  }
  s->count += (uint64_t)n * (uint64_t)rows;
}

/* npu_ref_observer.fn of a run: one row of an activation (the per-head scores). */
static void observe_row(void *user, int layer, const char *what, const float *v, int n) {
  observe(&((struct npu_calib_run *)user)->c, layer, what, v, n);
}

/* npu_ref_observer.rows_fn of a run: a block's activation, all its rows at once. */
static void observe_block(void *user, int layer, const char *what, const float *v, int n,
                          int rows) {
  char name[NPU_IR_NAME_MAX];
  if (layer >= 0) snprintf(name, sizeof(name), "blk.%d.%s", layer, what);
  else snprintf(name, sizeof(name), "%s", what);
  accumulate_rows(user, name, n, 0, v, n, rows);
}

/* One pool task of a matmul: a range of its rows. */
struct matmul_job {
  const struct npu_calib_run *run;
  float *out;
  const float *w, *bias, *x;
  int n_in, n_out, rows, rows_per_task;
};

static void matmul_task(void *arg, size_t task) {
  const struct matmul_job *j = arg;
  int r0 = (int)task * j->rows_per_task;
  int r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
  if (r0 >= r1) return;
  j->run->uk.f32_matmul(j->out + (size_t)r0 * (size_t)j->n_out, j->x + (size_t)r0 * (size_t)j->n_in,
                        j->w, j->bias, r1 - r0, j->n_in, j->n_out);
}

/* npu_ref_matmul_fn: the CPU kernels' float matmul (the reference's bits), its rows cut across
 * the pool's threads. */
static void run_matmul(void *user, float *out, const float *w, const float *bias, const float *x,
                       int n_in, int n_out, int rows) {
  const struct npu_calib_run *r = user;
  int tasks = npu_pool_threads(r->pool);
  struct matmul_job j = {r, out, w, bias, x, n_in, n_out, rows, (rows + tasks - 1) / tasks};
  npu_pool_run(r->pool, (size_t)tasks, matmul_task, &j);
}

/* One pool task of attention: a range of its rows. */
struct attention_job {
  const struct npu_calib_run *run;
  float *out;
  const float *q, *keys, *values;
  int heads, kv_heads, hd, rows, pos0, rows_per_task;
  float scale;
};

static void attention_task(void *arg, size_t task) {
  const struct attention_job *j = arg;
  int r0 = (int)task * j->rows_per_task;
  int r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
  if (r0 >= r1) return;
  const size_t width = (size_t)j->heads * (size_t)j->hd;
  /* rows r0 .. r1 - 1 as a step of their own at position pos0 + r0: row t sees pos0 + r0 + t + 1
   * keys, as npu_ref_block's row r0 + t */
  j->run->uk.f32_attention(j->out + (size_t)r0 * width, j->q + (size_t)r0 * width, j->keys,
                           j->values, j->heads, j->kv_heads, j->hd, r1 - r0, j->pos0 + r0, r1 - r0,
                           j->scale);
}

/* npu_ref_attention_fn: the CPU kernels' fused attention (the reference's bits), its rows cut
 * across the pool's threads (later rows attend over more keys: more tasks than threads). */
static void run_attention(void *user, float *out, const float *q, const float *keys,
                          const float *values, int heads, int kv_heads, int hd, int rows, int pos0,
                          float scale) {
  const struct npu_calib_run *r = user;
  int tasks = 4 * npu_pool_threads(r->pool);
  struct attention_job j = {
      r, out, q, keys, values, heads, kv_heads, hd, rows, pos0, (rows + tasks - 1) / tasks, scale};
  npu_pool_run(r->pool, (size_t)tasks, attention_task, &j);
}

void npu_calib_run_free(struct npu_calib_run *r) {
  if (r == NULL) return;
  npu_calib_free(r->c.calib);
  npu_ref_state_free(&r->state);
  free(r->ids);
  free(r->win_rows);
  free(r->x);
  free(r->parts);
  free(r);
}

const struct npu_calib *npu_calib_run_stats(const struct npu_calib_run *r) { return r->c.calib; }

npulm_status npu_calib_run_create(const struct npu_config *cfg, const int32_t *tokens,
                                  size_t n_tokens, int32_t window, int32_t bos, bool scores,
                                  struct npu_pool *pool, struct npu_calib_run **out,
                                  npulm_error *err) {
  *out = NULL;
  if (n_tokens == 0 || window < 2) {
    return npu_fail(err, NPULM_ERR_ARG, "calibration needs text and a window of at least 2 tokens");
  }
  struct npu_calib_run *r = calloc(1, sizeof(*r));
  if (r == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  r->cfg = *cfg;
  r->scores = scores;
  r->pool = pool;
  r->c = (struct collector){.last = -1, .status = NPULM_OK};
  npu_cpu_ukernels_select(npu_isa_detect(), &r->uk);
  /* the windows: BOS first, as the model saw it in training, then up to 'window' rows in all */
  const size_t per_window = (size_t)window - (bos >= 0);
  const size_t n_windows = (n_tokens + per_window - 1) / per_window;
  r->n_rows = n_tokens + (bos >= 0 ? n_windows : 0);
  r->c.calib = calloc(1, sizeof(*r->c.calib));
  r->ids = malloc(r->n_rows * sizeof(int32_t));
  r->win_rows = malloc(n_windows * sizeof(int32_t));
  r->x = malloc(r->n_rows * (size_t)cfg->dim * sizeof(float));
  r->parts = malloc((size_t)npu_pool_threads(pool) * sizeof(*r->parts));
  npulm_status st = !r->c.calib || !r->ids || !r->win_rows || !r->x || !r->parts
                        ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory")
                        : npu_ref_state_init_rows(&r->state, cfg, window, window, err);
  if (st != NPULM_OK) {
    npu_calib_run_free(r);
    return st;
  }
  r->state.matmul = run_matmul;
  r->state.attention = run_attention;
  r->state.matmul_user = r;
  size_t row = 0, done = 0;
  for (size_t w = 0; w < n_windows; w++) {
    size_t first = row;
    if (bos >= 0) r->ids[row++] = bos;
    for (size_t i = 0; i < per_window && done < n_tokens; i++) r->ids[row++] = tokens[done++];
    r->win_rows[w] = (int32_t)(row - first);
  }
  r->n_windows = (int32_t)n_windows;
  r->c.calib->n_tokens = n_tokens;
  *out = r;
  return NPULM_OK;
}

/* The run's first failure to gather statistics, as an error. */
static npulm_status run_status(const struct npu_calib_run *r, npulm_error *err) {
  if (r->c.status == NPULM_OK) return NPULM_OK;
  return npu_fail(err, r->c.status, "calibration failed: %s",
                  r->c.status == NPULM_ERR_NOMEM ? "out of memory"
                                                 : "inconsistent activation sizes");
}

npulm_status npu_calib_embed(struct npu_calib_run *r, npu_calib_rows_fn *embd, void *user,
                             npulm_error *err) {
  const size_t dim = (size_t)r->cfg.dim;
  for (size_t i = 0; i < r->n_rows; i++) {
    const float *row;
    npulm_status st = embd(user, r->ids[i], 1, r->x + i * dim, &row, err);
    if (st != NPULM_OK) return st;
    if (row != r->x + i * dim) memcpy(r->x + i * dim, row, dim * sizeof(float));
  }
  accumulate_rows(r, "embd", (int32_t)dim, 0, r->x, (int)dim, (int)r->n_rows);
  return run_status(r, err);
}

npulm_status npu_calib_layer(struct npu_calib_run *r, const struct npu_layer_weights *lw,
                             const float *rope_freqs, int layer, npulm_error *err) {
  const size_t dim = (size_t)r->cfg.dim;
  const struct npu_ref_observer obs = {
      .fn = observe_row, .rows_fn = observe_block, .user = r, .scores = r->scores};
  float *x = r->x;
  for (int32_t w = 0; w < r->n_windows; w++) {
    const size_t n = (size_t)r->win_rows[w];
    memcpy(r->state.x, x, n * dim * sizeof(float));
    npu_ref_block(&r->cfg, lw, rope_freqs, &r->state, layer, 0, (int)n, &obs);
    memcpy(x, r->state.x, n * dim * sizeof(float));
    x += n * dim;
  }
  return run_status(r, err);
}

npulm_status npu_calib_head(struct npu_calib_run *r, const float *output_norm,
                            npu_calib_rows_fn *output, void *user, npulm_error *err) {
  /* vocabulary rows per block: the block's weights and logits stay tens of MB at every size */
  enum { VOCAB_BLOCK = 2048 };
  const int dim = r->cfg.dim, n_vocab = r->cfg.n_vocab;
  for (size_t i = 0; i < r->n_rows; i++) {
    float *x = r->x + i * (size_t)dim;
    npu_ref_rmsnorm(x, x, output_norm, dim, r->cfg.rms_eps);
  }
  accumulate_rows(r, "output_norm", dim, 0, r->x, dim, (int)r->n_rows);
  const int block = n_vocab < VOCAB_BLOCK ? n_vocab : VOCAB_BLOCK;
  float *w = malloc((size_t)block * (size_t)dim * sizeof(float));
  float *logits = malloc(r->n_rows * (size_t)block * sizeof(float));
  npulm_status st = w && logits ? NPULM_OK : npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int v0 = 0; v0 < n_vocab && st == NPULM_OK; v0 += block) {
    const int nb = n_vocab - v0 < block ? n_vocab - v0 : block;
    const float *rows;
    if ((st = output(user, v0, nb, w, &rows, err)) != NPULM_OK) break;
    run_matmul(r, logits, rows, NULL, r->x, dim, nb, (int)r->n_rows);
    accumulate_rows(r, "logits", n_vocab, v0, logits, nb, (int)r->n_rows);
  }
  free(w);
  free(logits);
  return st != NPULM_OK ? st : run_status(r, err);
}

/* npu_calib_rows_fn over a matrix in memory ('user': its rows, of 'cols' floats). */
struct matrix {
  const float *data;
  int64_t cols;
};

static npulm_status matrix_rows(void *user, int64_t row0, int64_t n_rows, float *scratch,
                                const float **rows_out, npulm_error *err) {
  (void)n_rows, (void)scratch, (void)err;
  const struct matrix *m = user;
  *rows_out = m->data + row0 * m->cols;
  return NPULM_OK;
}

npulm_status npu_calibrate(const struct npulm_model *m, const int32_t *tokens, size_t n_tokens,
                           int32_t window, int32_t bos, npulm_progress_fn progress, void *user,
                           struct npu_calib **out, npulm_error *err) {
  *out = NULL;
  const struct npu_config *c = &m->cfg;
  struct npu_calib_run *r = NULL;
  struct matrix embd = {m->w.token_embd, c->dim}, output = {m->w.output, c->dim};
  npulm_status st = npu_config_check_weights(c, err);
  if (st == NPULM_OK) {
    st = npu_calib_run_create(c, tokens, n_tokens, window, bos, true, NULL, &r, err);
  }
  if (st == NPULM_OK) st = npu_calib_embed(r, matrix_rows, &embd, err);
  for (int l = 0; l < c->n_layers && st == NPULM_OK; l++) {
    st = npu_calib_layer(r, &m->w.layers[l], m->w.rope_freqs, l, err);
    if (progress != NULL) progress(user, (uint64_t)l + 1, (uint64_t)c->n_layers + 1);
  }
  if (st == NPULM_OK) st = npu_calib_head(r, m->w.output_norm, matrix_rows, &output, err);
  if (st == NPULM_OK) {
    if (progress != NULL) progress(user, (uint64_t)c->n_layers + 1, (uint64_t)c->n_layers + 1);
    *out = r->c.calib;
    r->c.calib = NULL;
  }
  npu_calib_run_free(r);
  return st;
}

const struct npu_act_stats *npu_calib_find(const struct npu_calib *c, const char *name) {
  for (int32_t i = 0; i < c->n_stats; i++) {
    if (strcmp(c->stats[i].name, name) == 0) return &c->stats[i];
  }
  return NULL;
}

float npu_calib_percentile(const struct npu_act_stats *s, double p) {
  float absmax = fmaxf(fabsf(s->min), fabsf(s->max));
  if (p >= 1.0 || s->count == 0) return absmax;
  uint64_t want = (uint64_t)ceil(p * (double)s->count), seen = 0;
  for (int32_t b = 0; b < NPU_CALIB_BINS; b++) {
    seen += s->hist[b];
    if (seen >= want) return fminf(bin_upper(b), absmax);
  }
  return absmax;
}

/* Original prose written for npulm: everyday English, simple and varied, as small llama models
 * see in training. Used when the user passes no --calib file. */
const char npu_calib_default_text[] =
    "Once upon a time, in a small town near the sea, there lived a boy named Tom. Tom liked to "
    "walk along the beach every morning and look for shells. One day he found a big blue shell "
    "with a tiny crab inside. \"Hello, little crab,\" said Tom. \"Do you want to be my friend?\" "
    "The crab waved its claw, and Tom laughed. He carried the shell home very carefully and showed "
    "it to his mother. His mother smiled and said, \"That is a very special friend. We must take "
    "good care of him.\" So Tom made a small home for the crab with sand, water and a few smooth "
    "stones.\n"
    "The next day it was raining. Tom could not go outside, so he sat by the window and drew a "
    "picture of the sea. He drew the sun, the waves, a red boat and a happy fish. When his sister "
    "Mia came in, she asked if she could help. Together they painted the sky yellow and orange. "
    "\"It looks like a sunset,\" said Mia. They hung the picture on the wall, and everyone who saw "
    "it felt warm and happy.\n"
    "Lily had a little dog called Max. Max was brown and white and loved to run in the park. "
    "Every afternoon, Lily threw a ball and Max ran fast to bring it back. One afternoon the ball "
    "rolled under a big bush. Max barked and barked, but he could not reach it. Lily got down on "
    "her knees and looked under the bush. She saw the ball, and next to it a small bird with a "
    "hurt wing. Lily was gentle. She picked up the bird and took it to her dad, who knew how to "
    "help animals. After a few days, the bird could fly again. Lily and Max watched it fly high "
    "into the blue sky, and they were very proud.\n"
    "Ben and Sara wanted to build the tallest tower in the world. They used blocks, boxes, books "
    "and even a pillow. The tower grew and grew until it was taller than Ben. Then Sara put one "
    "more block on top, and the tower began to shake. \"Oh no!\" they shouted, as everything fell "
    "down with a loud crash. For a moment they were sad. Then Ben started to laugh, and Sara "
    "laughed too. \"Let's build it again,\" said Sara, \"but this time we will make the bottom "
    "wider.\" They worked slowly and carefully, and the new tower stood strong.\n"
    "An old owl lived in a tall tree at the edge of the forest. At night she watched over the "
    "animals while they slept. The rabbits, the mice and the deer all trusted her. One cold night "
    "the wind was very strong, and a young fox lost his way home. He was scared and began to cry. "
    "The owl flew down and said, \"Do not be afraid. Follow the light of the moon, and you will "
    "find the river. Your home is on the other side.\" The fox thanked the owl and walked along "
    "the bright path until he saw his mother waiting for him. From that day on, the fox always "
    "said goodnight to the wise old owl.\n"
    "In the kitchen, Grandma was making cookies. She let Anna mix the flour, the sugar and the "
    "butter in a big bowl. Anna added chocolate chips and a little bit of love, as Grandma always "
    "said. When the cookies came out of the oven, the whole house smelled sweet. They put some "
    "cookies on a plate and took them to the neighbors. The neighbors were surprised and very "
    "thankful. Anna learned that sharing makes a good day even better.\n";
