/* The sparse FFN of a decode step (sparse_ffn.h). */
#include "backends/sparse_ffn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pool.h"
#include "kernels/npu/fixedpoint.h"
#include "program/program.h"
#include "ref/forward.h"

enum { MAX_TASKS = 64 };

/* One layer's integer data, gathered once. */
struct layer_run {
  struct npu_sparse_sites sites;
  const struct npu_sparse_layer *data;
  /* kept iff acc * mult_j >= thr_hi[j] or thr_lo_a[j] <= acc * mult_j <= thr_lo_b[j], acc the
   * gate's accumulator with its bias: the layer's thresholds in the gate's steps times
   * 2^(31 - shift_j), so that the test is integer */
  int64_t *thr_hi, *thr_lo_a, *thr_lo_b;
  int32_t *down_bias; /* (dim) the down matmul's bias, as packed */
};

struct npu_sparse_run {
  const struct npu_program *prog;
  const struct npu_ukernels *uk;
  enum npu_sparse_mode mode;
  bool audit;
  int32_t n_layers, dim, n_ff, max_rank;
  struct layer_run *layers;
  struct npu_bundle_source source;
  /* one step's work (a session runs one decode step at a time) */
  int8_t *h;          /* (max_rank) the predictor's middle */
  int16_t *pred;      /* (n_ff) its output */
  int32_t *cand;      /* (n_ff) candidate neurons */
  const int8_t **ptr; /* (n_ff) their gate rows */
  int32_t *acc;       /* (n_ff) their gate accumulators */
  int32_t *gate_acc;  /* (n_ff) by neuron: the kept's, with the bias */
  int32_t *kept;      /* (n_ff) the kept neurons */
  const int8_t **down_ptr;
  const int8_t **up_ptr;                   /* (n_ff) the kept's up rows */
  int32_t *acc_up;                         /* (n_ff) their up accumulators */
  int8_t *gate_q, *up_q, *silu_q, *prod_q; /* (n_ff) of the kept */
  int32_t *coef;                           /* (n_ff) products less the down input's zero point */
  int32_t *down_acc;                       /* (MAX_TASKS, dim) each task's down sums */
  int32_t *all_ids;                        /* (n_ff) audit: every neuron, in the source's order */
  struct npu_sparse_stats stats;
};

static size_t resident_get(void *user, int32_t layer, enum npu_bundle_parts parts, int32_t *ids,
                           size_t n, const int8_t **gates, size_t *n_given) {
  const struct npu_sparse *sp = user;
  const struct npu_sparse_layer *ly = &sp->layers[layer];
  const size_t kp = (size_t)sp->kp;
  for (size_t i = 0; i < n; i++) {
    const int32_t at = ly->place[ids[i]];
    gates[i] = ly->bundles + (parts == NPU_BUNDLE_REST ? npu_sparse_pair_at(kp, ly->n_ff, at)
                                                       : npu_sparse_gate_at(kp, at));
  }
  *n_given = n;
  return n;
}

/* ceil / floor of t * 2^(31 - shift), saturated to +-2^62 (beyond any acc * mult). */
static int64_t scaled_bound(double t, int32_t shift, bool up) {
  const double lim = 0x1.0p62;
  if (isnan(t)) return up ? INT64_MAX : INT64_MIN;
  const double v = ldexp(t, 31 - shift);
  const double r = up ? ceil(v) : floor(v);
  if (r >= lim) return (int64_t)lim;
  if (r <= -lim) return -(int64_t)lim;
  return (int64_t)r;
}

void npu_sparse_run_free(struct npu_sparse_run *r) {
  if (r == NULL) return;
  for (int32_t l = 0; r->layers != NULL && l < r->n_layers; l++) {
    free(r->layers[l].thr_hi);
    free(r->layers[l].thr_lo_a);
    free(r->layers[l].thr_lo_b);
    free(r->layers[l].down_bias);
  }
  free(r->layers);
  free(r->h);
  free(r->pred);
  free(r->cand);
  free(r->ptr);
  free(r->acc);
  free(r->gate_acc);
  free(r->kept);
  free(r->down_ptr);
  free(r->up_ptr);
  free(r->acc_up);
  free(r->gate_q);
  free(r->up_q);
  free(r->silu_q);
  free(r->prod_q);
  free(r->coef);
  free(r->down_acc);
  free(r->all_ids);
  free(r);
}

/* The FFN of layer 'l' in decode graph 'g' from node 'first': gate and up matmuls on its FFN
 * norm output, SiLU of the gate, product, down matmul, in that order, on the NPU; the number of
 * nodes, or 0. */
static int32_t ffn_span(const struct npu_graph *g, int32_t first, int32_t end, int32_t *layer) {
  static const uint8_t want_op[5] = {NPU_OP_MATMUL, NPU_OP_MATMUL, NPU_OP_SILU, NPU_OP_MUL,
                                     NPU_OP_MATMUL};
  static const uint8_t want_role[5] = {NPU_ROLE_FFN_GATE, NPU_ROLE_FFN_UP, NPU_ROLE_FFN_SILU,
                                       NPU_ROLE_FFN_GATE_PAR, NPU_ROLE_FFN_DOWN};
  if (g->rows != 1 || end - first < 5) return 0;
  const struct npu_ir_node *n = &g->nodes[first];
  if (n->op != NPU_OP_MATMUL || g->tensors[n->out].role != NPU_ROLE_FFN_GATE) return 0;
  for (int32_t i = 0; i < 5; i++) {
    const struct npu_ir_node *m = &g->nodes[first + i];
    const struct npu_ir_tensor *out = &g->tensors[m->out];
    if (m->op != want_op[i] || m->backend != NPU_BE_NPU || out->role != want_role[i] ||
        m->layer != n->layer) {
      return 0;
    }
  }
  if (g->nodes[first + 1].in[0] != n->in[0]) return 0;
  *layer = n->layer;
  return 5;
}

int32_t npu_sparse_span(const struct npu_sparse_run *r, const struct npu_graph *g, int32_t first,
                        int32_t end) {
  int32_t layer;
  const int32_t span = ffn_span(g, first, end, &layer);
  return span > 0 && layer >= 0 && layer < r->n_layers ? span : 0;
}

static npulm_status prepare_layer(struct npu_sparse_run *r, int32_t l, npulm_error *err) {
  struct layer_run *lr = &r->layers[l];
  npulm_status st = npu_sparse_sites_of(r->prog, l, &lr->sites, err);
  if (st != NPULM_OK) return st;
  lr->data = &r->prog->sparse->layers[l];
  const size_t n_ff = (size_t)r->n_ff, dim = (size_t)r->dim;
  if (lr->data->n_ff != r->n_ff || lr->sites.gate->n != r->n_ff || lr->sites.down->n != r->dim ||
      lr->sites.gate->k != r->dim || lr->sites.down->k != r->n_ff) {
    return npu_fail(err, NPULM_ERR_FORMAT, "layer %d's sparse data does not fit its FFN", l);
  }
  lr->thr_hi = malloc(n_ff * sizeof(int64_t));
  lr->thr_lo_a = malloc(n_ff * sizeof(int64_t));
  lr->thr_lo_b = malloc(n_ff * sizeof(int64_t));
  lr->down_bias = malloc(dim * sizeof(int32_t));
  if (lr->thr_hi == NULL || lr->thr_lo_a == NULL || lr->thr_lo_b == NULL || lr->down_bias == NULL)
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (size_t j = 0; j < n_ff; j++) {
    const int32_t shift = lr->sites.gate->shift[j];
    lr->thr_hi[j] = scaled_bound(lr->data->hi, shift, true);
    lr->thr_lo_a[j] = scaled_bound(lr->data->lo_a, shift, true);
    lr->thr_lo_b[j] = scaled_bound(lr->data->lo_b, shift, false);
  }
  for (size_t c = 0; c < dim; c++)
    lr->down_bias[c] = npu_qs8_gemm_bias(n_ff, lr->sites.down->packed, c);
  return NPULM_OK;
}

npulm_status npu_sparse_run_create(const struct npu_program *p, enum npu_sparse_mode mode,
                                   bool audit, struct npu_sparse_run **out, npulm_error *err) {
  *out = NULL;
  const struct npu_sparse *sp = p->sparse;
  if (sp == NULL || sp->n_layers < 1) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "the program has no sparse decode data: compile it with --sparsity");
  }
  struct npu_sparse_run *r = calloc(1, sizeof(*r));
  if (r == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  r->prog = p;
  r->uk = &p->uk;
  r->mode = mode;
  r->audit = audit;
  r->n_layers = sp->n_layers;
  r->dim = sp->dim;
  r->n_ff = sp->layers[0].n_ff;
  r->source = (struct npu_bundle_source){(void *)sp, resident_get, NULL};
  for (int32_t l = 0; l < sp->n_layers; l++) {
    if (sp->layers[l].rank > r->max_rank) r->max_rank = sp->layers[l].rank;
  }
  const size_t n_ff = (size_t)r->n_ff, dim = (size_t)r->dim;
  r->layers = calloc((size_t)r->n_layers, sizeof(*r->layers));
  r->h = malloc((size_t)r->max_rank + 1);
  r->pred = malloc(n_ff * sizeof(int16_t));
  r->cand = malloc(n_ff * sizeof(int32_t));
  r->ptr = malloc(n_ff * sizeof(*r->ptr));
  r->acc = malloc(n_ff * sizeof(int32_t));
  r->gate_acc = malloc(n_ff * sizeof(int32_t));
  r->up_ptr = malloc(n_ff * sizeof(*r->up_ptr));
  r->acc_up = malloc(n_ff * sizeof(int32_t));
  r->kept = malloc(n_ff * sizeof(int32_t));
  r->down_ptr = malloc(n_ff * sizeof(*r->down_ptr));
  r->gate_q = malloc(n_ff);
  r->up_q = malloc(n_ff);
  r->silu_q = malloc(n_ff);
  r->prod_q = malloc(n_ff);
  r->coef = malloc(n_ff * sizeof(int32_t));
  r->down_acc = malloc(MAX_TASKS * dim * sizeof(int32_t));
  r->all_ids = malloc(n_ff * sizeof(int32_t));
  npulm_status st = NPULM_OK;
  if (r->layers == NULL || r->h == NULL || r->pred == NULL || r->cand == NULL || r->ptr == NULL ||
      r->acc == NULL || r->gate_acc == NULL || r->up_ptr == NULL || r->acc_up == NULL ||
      r->kept == NULL || r->down_ptr == NULL || r->gate_q == NULL || r->up_q == NULL ||
      r->silu_q == NULL || r->prod_q == NULL || r->coef == NULL || r->down_acc == NULL ||
      r->all_ids == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  for (int32_t l = 0; st == NPULM_OK && l < r->n_layers; l++) st = prepare_layer(r, l, err);
  /* every decode graph's FFN must be the pattern the sparse step replaces */
  for (int32_t gi = 0; st == NPULM_OK && gi < p->n_graphs; gi++) {
    const struct npu_graph *g = &p->graphs[gi];
    if (g->rows != 1) continue;
    int32_t found = 0;
    for (int32_t s = 0; s < g->n_subgraphs; s++) {
      const int32_t end = g->subgraphs[s].first + g->subgraphs[s].count;
      for (int32_t i = g->subgraphs[s].first; i < end; i++)
        found += npu_sparse_span(r, g, i, end) > 0;
    }
    if (found != r->n_layers) {
      st = npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "sparse decode needs every layer's FFN on the NPU as gate, up, SiLU, product "
                    "and down; the decode graph for context %d has %d of %d such",
                    g->ctx, found, r->n_layers);
    }
  }
  if (st != NPULM_OK) {
    npu_sparse_run_free(r);
    return st;
  }
  *out = r;
  return NPULM_OK;
}

void npu_sparse_run_set_source(struct npu_sparse_run *r, const struct npu_bundle_source *src) {
  r->source = *src;
}

void npu_sparse_get_stats(const struct npu_sparse_run *r, struct npu_sparse_stats *out) {
  *out = r->stats;
}

void npu_sparse_reset_stats(struct npu_sparse_run *r) { memset(&r->stats, 0, sizeof(r->stats)); }

/* A loop of the step cut across the pool: task t of 'tasks' takes items [t n / tasks, (t + 1) n /
 * tasks) of 'n'. */
struct step_loop {
  struct npu_sparse_run *r;
  const struct layer_run *lr;
  const int8_t *x;
  size_t first; /* the dots: from this candidate on */
  size_t n, tasks;
  int phase; /* 0 predictor's second GEMM (in blocks of NR channels), 1 gate dots of the
                candidates, 2 up dots of the kept, 3 down */
};

static void item_range(const struct step_loop *s, size_t task, size_t unit, size_t *a, size_t *b) {
  const size_t units = (s->n + unit - 1) / unit;
  *a = task * units / s->tasks * unit;
  *b = (task + 1) * units / s->tasks * unit;
  if (*a > s->n) *a = s->n;
  if (*b > s->n) *b = s->n;
}

static void step_task(void *arg, size_t task) {
  const struct step_loop *s = arg;
  struct npu_sparse_run *r = s->r;
  const struct layer_run *lr = s->lr;
  const size_t dim = (size_t)r->dim;
  size_t a, b;
  if (s->phase == 0) {
    const int32_t rank = lr->data->rank;
    const struct npu_qs8_gemm_params pa = {lr->data->mult + rank, lr->data->shift + rank, 0, 0};
    item_range(s, task, NPU_QS8_GEMM_NR, &a, &b);
    if (a < b)
      r->uk->qs8_gemm_qs16(1, a, b, (size_t)rank, r->h, (size_t)rank, lr->data->pred_a, r->pred,
                           (size_t)r->n_ff, &pa);
  } else if (s->phase == 1 || s->phase == 2) { /* gate rows of candidates; up rows of kept */
    item_range(s, task, 1, &a, &b);
    a += s->first;
    b += s->first;
    const int8_t *const *rows = s->phase == 1 ? r->ptr : r->up_ptr;
    int32_t *acc = s->phase == 1 ? r->acc : r->acc_up;
    if (a < b) r->uk->qs8_rows_dot(dim, s->x, 0, b - a, rows + a, acc + a); /* zx: the bias */
  } else {
    item_range(s, task, 1, &a, &b);
    int32_t *acc = r->down_acc + task * dim; /* cleared at the step's start */
    if (a < b) r->uk->qs8_cols_down(dim, b - a, r->down_ptr + a, r->coef + a, acc);
  }
}

/* The tasks a loop is cut into: one per thread of 'pool', at most MAX_TASKS. */
static size_t loop_tasks(struct npu_pool *pool) {
  size_t tasks = (size_t)npu_pool_threads(pool);
  if (tasks > MAX_TASKS) tasks = MAX_TASKS;
  return tasks < 1 ? 1 : tasks;
}

static void run_loop(struct step_loop *s, struct npu_pool *pool, int phase, size_t n) {
  s->phase = phase;
  s->n = n;
  npu_pool_run(pool, s->tasks, step_task, s);
}

/* A round of gate rows: the source takes some of the 'n' neurons 'ids' from 'first' on (the
 * step's first round if first == 0), sets their rows in r->ptr and their dots in r->acc (those
 * in memory while the others are read, then those); the number it took. */
static size_t gate_round(struct step_loop *loop, struct npu_pool *pool, int32_t layer, int32_t *ids,
                         size_t first, size_t n) {
  struct npu_sparse_run *r = loop->r;
  size_t n_given;
  const enum npu_bundle_parts parts = first == 0 ? NPU_BUNDLE_GATE : NPU_BUNDLE_GATE_NEXT;
  const size_t n_in =
      r->source.get(r->source.user, layer, parts, ids + first, n - first, r->ptr + first, &n_given);
  loop->first = first;
  run_loop(loop, pool, 1, n_in);
  if (n_in < n_given) {
    r->source.wait(r->source.user);
    loop->first = first + n_in;
    run_loop(loop, pool, 1, n_given - n_in);
  }
  return n_given;
}

static bool kept_by(const struct layer_run *lr, int32_t j, int32_t acc) {
  const int64_t v = (int64_t)acc * lr->sites.gate->mult[j];
  return v >= lr->thr_hi[j] || (v >= lr->thr_lo_a[j] && v <= lr->thr_lo_b[j]);
}

/* Audit: the |SiLU| mass the thresholds keep over every neuron's exact gate (after the step: its
 * candidates' rows and dots, r->ptr and r->acc, are used again). */
static double exact_mass(struct step_loop *loop, struct npu_pool *pool, int32_t layer) {
  struct npu_sparse_run *r = loop->r;
  const struct layer_run *lr = loop->lr;
  const size_t n_ff = (size_t)r->n_ff;
  for (size_t j = 0; j < n_ff; j++) r->all_ids[j] = (int32_t)j;
  for (size_t done = 0; done < n_ff;) done += gate_round(loop, pool, layer, r->all_ids, done, n_ff);
  double mass = 0.0;
  for (size_t i = 0; i < n_ff; i++) {
    const int32_t j = r->all_ids[i], acc = r->acc[i] + lr->data->bias[2 * j];
    if (!kept_by(lr, j, acc)) continue;
    const double v = ldexp((double)acc * lr->sites.gate->mult[j], lr->sites.gate->shift[j] - 31);
    mass += fabs(npu_ref_silu((float)(v * lr->sites.gate_scale)));
  }
  return mass;
}

void npu_sparse_ffn_exec(struct npu_sparse_run *r, const struct npu_graph *g, int32_t first,
                         int32_t count, struct npu_pool *pool, uint8_t *const arena[NPU_BE_COUNT]) {
  (void)count;
  const int32_t layer = g->nodes[first].layer; /* npu_sparse_span checked the span */
  const struct layer_run *lr = &r->layers[layer];
  const struct npu_sparse_layer *d = lr->data;
  const struct npu_ir_tensor *xt = &g->tensors[g->nodes[first].in[0]];
  const struct npu_ir_tensor *yt = &g->tensors[g->nodes[first + 4].out];
  const int8_t *x = (const int8_t *)(arena[xt->backend] + xt->offset);
  void *y = arena[yt->backend] + yt->offset;
  const size_t n_ff = (size_t)r->n_ff, dim = (size_t)r->dim;
  struct step_loop loop = {.r = r, .lr = lr, .x = x, .tasks = loop_tasks(pool)};
  const double t0 = npu_now();
  /* 1. candidates */
  size_t n_cand = 0;
  if (r->mode == NPU_SPARSE_PREDICT && d->rank > 0) {
    const struct npu_qs8_gemm_params pb = {d->mult, d->shift, lr->sites.gate->gemm.x_zero_point, 0};
    r->uk->qs8_gemm(1, 0, (size_t)d->rank, dim, x, dim, d->pred_b, r->h, (size_t)d->rank, &pb);
    run_loop(&loop, pool, 0, n_ff);
    for (size_t j = 0; j < n_ff; j++) {
      const int32_t p = r->pred[j];
      if (p >= d->cand_hi || (p >= d->cand_lo_a && p <= d->cand_lo_b))
        r->cand[n_cand++] = (int32_t)j;
    }
  } else {
    for (size_t j = 0; j < n_ff; j++) r->cand[j] = (int32_t)j;
    n_cand = n_ff;
  }
  const double t1 = npu_now();
  /* 2. in rounds (as many of the candidates as the source takes at a time): their gates; of
   * those the thresholds keep, their up rows and down columns (those in memory first, while the
   * others are read), up rows' dots; requantized as the dense GEMMs do, SiLU, product; down:
   * each task's sums over its share of the kept */
  const struct npu_qsite *gs = lr->sites.gate, *us = lr->sites.up;
  const size_t kp = (size_t)r->prog->sparse->kp; /* from an up row to its down column */
  memset(r->down_acc, 0, loop.tasks * dim * sizeof(int32_t));
  size_t n_kept = 0;
  for (size_t done = 0; done < n_cand;) {
    const size_t n_given = gate_round(&loop, pool, layer, r->cand, done, n_cand);
    size_t n_round = 0; /* kept of this round */
    for (size_t i = done; i < done + n_given; i++) {
      const int32_t j = r->cand[i];
      const int32_t ag = r->acc[i] + d->bias[2 * j];
      if (!kept_by(lr, j, ag)) continue;
      r->gate_acc[j] = ag;
      r->kept[n_round++] = j;
    }
    done += n_given;
    n_kept += n_round;
    size_t n_all;
    const size_t n_ready = r->source.get(r->source.user, layer, NPU_BUNDLE_REST, r->kept, n_round,
                                         r->down_ptr, &n_all);
    for (size_t i = 0; i < n_round; i++) {
      const int32_t j = r->kept[i];
      r->gate_q[i] =
          npu_requantize_s8(r->gate_acc[j], gs->mult[j], gs->shift[j], gs->gemm.y_zero_point);
      r->up_ptr[i] = r->down_ptr[i];
      r->down_ptr[i] += kp;
    }
    loop.first = 0;
    run_loop(&loop, pool, 2, n_ready);
    if (n_ready < n_round) {
      r->source.wait(r->source.user);
      loop.first = n_ready;
      run_loop(&loop, pool, 2, n_round - n_ready);
    }
    for (size_t i = 0; i < n_round; i++) {
      const int32_t j = r->kept[i];
      r->up_q[i] = npu_requantize_s8(r->acc_up[i] + d->bias[2 * j + 1], us->mult[j], us->shift[j],
                                     us->gemm.y_zero_point);
    }
    r->uk->x8_lut(n_round, r->gate_q, r->silu_q, lr->sites.silu->lut);
    r->uk->qs8_vmul(n_round, r->silu_q, r->up_q, r->prod_q, &lr->sites.mul->mul);
    const int32_t zd = lr->sites.down->gemm.x_zero_point;
    for (size_t i = 0; i < n_round; i++) r->coef[i] = r->prod_q[i] - zd;
    run_loop(&loop, pool, 3, n_round);
  }
  /* the tasks' down sums added up, with the bias */
  int32_t *acc = r->down_acc;
  for (size_t t = 1; t < loop.tasks; t++) {
    const int32_t *share = r->down_acc + t * dim;
    for (size_t c = 0; c < dim; c++) acc[c] += share[c];
  }
  for (size_t c = 0; c < dim; c++) acc[c] += lr->down_bias[c];
  const struct npu_qsite *ds = lr->sites.down;
  if (yt->dtype == NPU_DT_I16) {
    r->uk->qs32_requant_qs16(dim, acc, ds->mult, ds->shift, ds->gemm.y_zero_point, y);
  } else {
    r->uk->qs32_requant_qs8(dim, acc, ds->mult, ds->shift, ds->gemm.y_zero_point, y);
  }
  const double t2 = npu_now();
  struct npu_sparse_stats *st = &r->stats;
  st->layer_steps++;
  st->neurons += n_ff;
  st->candidates += n_cand;
  st->kept += n_kept;
  st->predict_s += t1 - t0;
  st->ffn_s += t2 - t1;
  if (r->audit) {
    double kept_mass = 0.0;
    for (size_t i = 0; i < n_cand; i++) {
      const int32_t j = r->cand[i];
      const int32_t ag = r->acc[i] + d->bias[2 * j];
      if (!kept_by(lr, j, ag)) continue;
      const double v = ldexp((double)ag * gs->mult[j], gs->shift[j] - 31);
      kept_mass += fabs(npu_ref_silu((float)(v * lr->sites.gate_scale)));
    }
    st->kept_mass += kept_mass;
    st->exact_mass += exact_mass(&loop, pool, layer);
  }
}
