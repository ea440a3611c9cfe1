/* The quantizer's pass: from a compiled FP32 program and calibration statistics to an integer NPU
 * program, block after block (see quantize.h for the conventions and the three outlier modes);
 * each NPU operation's integer data is made in quant_sites.c, the graphs rewritten in
 * quant_rewrite.c. */
#include "compiler/quantize.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pages.h"
#include "base/pool.h"
#include "compiler/quant_internal.h"
#include "compiler/smooth.h"
#include "compiler/wquant.h"
#include "program/qparams.h"
#include "program/sparse_data.h"

/* Headroom over the calibrated magnitude for int16 tensors: text unlike the calibration text may
 * go somewhat further, and int16 has resolution to spare. */
#define I16_HEADROOM 2.0f

void npu_quant_default_options(struct npu_quant_options *o) {
  memset(o, 0, sizeof(*o));
  o->mode = NPU_QUANT_SMOOTH;
  o->smooth_alpha = 0.5f;
  o->shadow_threshold = 6.0f;
}

/* ---- A block's weights and statistics ------------------------------------------------------- */

/* The calibration statistics of the tensor of 'role' in 'layer' of graph 'g' (by its name, which
 * the reference forward gives its values too), or NULL. */
static const struct npu_act_stats *stats_of(const struct npu_calib *cal, const struct npu_graph *g,
                                            int32_t layer, enum npu_tensor_role role) {
  int32_t t = npu_ir_find_tensor(g, layer, role);
  return t >= 0 ? npu_calib_find(cal, g->tensors[t].name) : NULL;
}

/* The weights of block 'l' as the program's table has them now (possibly smoothed), as the
 * reference reads them: each field the weight (slot 1) or bias (slot 2) of the op writing a
 * role's tensor. */
static void layer_view(const struct npu_program *p, int32_t l, struct npu_layer_weights *lw) {
  memset(lw, 0, sizeof(*lw));
  const struct {
    const float **field;
    enum npu_tensor_role role;
    int slot;
  } read_by[] = {{&lw->attn_norm, NPU_ROLE_ATTN_NORM, 1},
                 {&lw->wq, NPU_ROLE_Q, 1},
                 {&lw->wk, NPU_ROLE_K, 1},
                 {&lw->wv, NPU_ROLE_V, 1},
                 {&lw->bq, NPU_ROLE_Q, 2},
                 {&lw->bk, NPU_ROLE_K, 2},
                 {&lw->bv, NPU_ROLE_V, 2},
                 {&lw->wo, NPU_ROLE_ATTN_OUT, 1},
                 {&lw->ffn_norm, NPU_ROLE_FFN_NORM, 1},
                 {&lw->w_gate, NPU_ROLE_FFN_GATE, 1},
                 {&lw->w_up, NPU_ROLE_FFN_UP, 1},
                 {&lw->w_down, NPU_ROLE_FFN_DOWN, 1}};
  for (size_t f = 0; f < sizeof(read_by) / sizeof(read_by[0]); f++) {
    int32_t wi = npu_ir_weight_of(&p->graphs[0], l, read_by[f].role, read_by[f].slot);
    if (wi >= 0) *read_by[f].field = p->weights[wi].data;
  }
}

/* ---- Tensor quantization -------------------------------------------------------------------- */

/* Whether tensors 'a' and 'b' hold one value: the same tensor, or copies of it in the two arenas
 * (a copy keeps its value's layer and role). */
static bool same_value(const struct npu_graph *g, int32_t a, int32_t b) {
  const struct npu_ir_tensor *x = &g->tensors[a], *y = &g->tensors[b];
  return a == b || (x->role != NPU_ROLE_NONE && x->role == y->role && x->layer == y->layer);
}

/* True if an NPU matmul reads tensor 't' (or a copy of it) as its activation. */
static bool feeds_matmul(const struct npu_graph *g, int32_t t) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    if (n->backend == NPU_BE_NPU && n->op == NPU_OP_MATMUL && same_value(g, n->in[0], t)) {
      return true;
    }
  }
  return false;
}

/* With int8 activations, int8 unless no NPU consumer needs it: matmul inputs, SiLU and products
 * are int8; the residual stream and what the NPU hands back to the CPU are int16. With int16
 * activations ('act_bits' 16), all int16. */
static enum npu_dtype npu_dtype_of(const struct npu_graph *g, int32_t t, int act_bits) {
  if (act_bits == 16) return NPU_DT_I16;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const struct npu_ir_node *n = &g->nodes[i];
    if (n->backend != NPU_BE_NPU) continue;
    bool reads = false;
    for (int s = 0; s < NPU_IR_MAX_IN; s++) {
      reads |= n->in[s] >= 0 && same_value(g, n->in[s], t);
    }
    if (reads && (n->op == NPU_OP_MATMUL || n->op == NPU_OP_SILU || n->op == NPU_OP_MUL ||
                  n->op == NPU_OP_QK)) {
      return NPU_DT_I8;
    }
  }
  return NPU_DT_I16;
}

static npulm_status add_qtensor(struct npu_program *p, const char *name, enum npu_dtype dt,
                                const struct npu_act_stats *st, const int32_t *outliers,
                                int32_t n_outliers, npulm_error *err) {
  struct npu_qtensor *t = &p->qtensors[p->n_qtensors++];
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s", name);
  t->dtype = (uint8_t)dt;
  if (st == NULL) return npu_fail(err, NPULM_ERR_ARG, "no calibration statistics for '%s'", name);
  float lo = st->min, hi = st->max;
  if (n_outliers > 0) {
    /* the range the NPU must cover without the channels the CPU takes over */
    float absmax = 0.0f;
    for (int32_t c = 0, o = 0; c < st->n_channels; c++) {
      if (o < n_outliers && outliers[o] == c) o++;
      else absmax = fmaxf(absmax, st->chan_absmax[c]);
    }
    lo = fmaxf(lo, -absmax);
    hi = fminf(hi, absmax);
  }
  if (dt == NPU_DT_I8) {
    npu_choose_qparams_s8(lo, hi, &t->q.scale, &t->q.zero_point);
  } else {
    t->q.scale = npu_choose_scale_sym(I16_HEADROOM * fmaxf(fabsf(lo), fabsf(hi)), 32767);
    t->q.zero_point = 0;
  }
  return NPULM_OK;
}

/* The graphs for generation copy the last real row of the residual stream before the output
 * norm (LAST_ROW), an op the graph of the table above (graph 0) lacks: its output takes its
 * input's quantization (the same integers) and the op its (empty) integer data. */
static npulm_status add_row_copies(const struct npulm_model *m, struct npu_program *p,
                                   const struct npu_calib *cal, const struct npu_quant_options *o,
                                   npulm_error *err) {
  for (int32_t gi = 0; gi < p->n_graphs; gi++) {
    const struct npu_graph *g = &p->graphs[gi];
    for (int32_t i = 0; i < g->n_nodes; i++) {
      const struct npu_ir_node *n = &g->nodes[i];
      if (n->op != NPU_OP_LAST_ROW || n->backend != NPU_BE_NPU) continue;
      const char *name = g->tensors[n->out].name;
      if (npu_program_qsite(p, name) != NULL) continue;
      const struct npu_qtensor *in = npu_program_qtensor(p, g->tensors[n->in[0]].name);
      if (in == NULL) return npu_fail(err, NPULM_ERR_ARG, "no quantization for '%s'", name);
      struct npu_qtensor *t = &p->qtensors[p->n_qtensors++];
      *t = *in;
      snprintf(t->name, sizeof(t->name), "%s", name);
      npulm_status st = npu_quant_make_site(m, p, g, n, cal, o, NULL, err);
      if (st != NPULM_OK) return st;
    }
  }
  return NPULM_OK;
}

/* ---- The pass ------------------------------------------------------------------------------- */

/* Quantization of the NPU tensors of block 'layer' (-1: outside the blocks) not quantized yet,
 * from the statistics 'cal': with 'embd_only', only the embedding's (what block 0 reads before
 * the head's statistics exist). The NPU's int8 copies of the caches its attention ops read take
 * the range of what the cache holds: k after RoPE, v. 'outliers' has room for any width. */
static npulm_status quantize_tensors(const struct npulm_model *m, struct npu_program *p,
                                     const struct npu_calib *cal, const struct npu_quant_options *o,
                                     int32_t layer, bool embd_only, int32_t *outliers,
                                     npulm_error *err) {
  const struct npu_graph *g0 = &p->graphs[0];
  npulm_status st = NPULM_OK;
  for (int32_t t = 0; t < g0->n_tensors && st == NPULM_OK; t++) {
    const struct npu_ir_tensor *tensor = &g0->tensors[t];
    bool on_npu = (tensor->kind == NPU_TK_ACT && tensor->backend == NPU_BE_NPU) ||
                  tensor->kind == NPU_TK_LOGITS;
    if (!on_npu || tensor->layer != layer || (embd_only && tensor->role != NPU_ROLE_EMBD) ||
        npu_program_qtensor(p, tensor->name) != NULL) {
      continue;
    }
    if (tensor->role == NPU_ROLE_KQ_SOFTMAX) {
      /* probabilities: Q15, no calibration needed */
      struct npu_qtensor *probs = &p->qtensors[p->n_qtensors++];
      memset(probs, 0, sizeof(*probs));
      snprintf(probs->name, sizeof(probs->name), "%s", tensor->name);
      probs->dtype = NPU_DT_I16;
      probs->q = (struct npu_qparams){.scale = npu_prob_scale(), .zero_point = 0};
      continue;
    }
    enum npu_dtype dt = npu_dtype_of(g0, t, npu_quant_act_bits(o->mode));
    const struct npu_act_stats *stats = npu_calib_find(cal, tensor->name);
    int32_t n_out = 0;
    if (npu_quant_outliers(o->mode) == NPU_OUTLIERS_SHADOW && stats != NULL &&
        feeds_matmul(g0, t) && npu_quant_shadowable(g0, t) &&
        stats->n_channels <= 4 * m->cfg.ffn_dim + 16) {
      n_out = npu_quant_find_outliers(stats, o->shadow_threshold, outliers);
    }
    st = add_qtensor(p, tensor->name, dt, stats, outliers, n_out > 0 ? n_out : 0, err);
  }
  for (int32_t i = 0; i < g0->n_nodes && st == NPULM_OK && !embd_only; i++) {
    const struct npu_ir_node *n = &g0->nodes[i];
    if (n->layer != layer || n->backend != NPU_BE_NPU ||
        (n->op != NPU_OP_QK && n->op != NPU_OP_PV)) {
      continue;
    }
    char name[NPU_IR_NAME_MAX];
    npu_quant_kv_copy_name(n->layer, n->op == NPU_OP_PV, name);
    if (npu_program_qtensor(p, name) == NULL) {
      const struct npu_act_stats *src =
          stats_of(cal, g0, n->layer, n->op == NPU_OP_PV ? NPU_ROLE_V : NPU_ROLE_K_ROPE);
      st = add_qtensor(p, name, NPU_DT_I8, src, NULL, 0, err);
    }
  }
  return st;
}

/* The integer data of every NPU operation of block 'layer' (-1: outside the blocks). */
static npulm_status quantize_sites(const struct npulm_model *m, struct npu_program *p,
                                   const struct npu_calib *cal, const struct npu_quant_options *o,
                                   struct npu_pool *pool, int32_t layer, npulm_error *err) {
  const struct npu_graph *g0 = &p->graphs[0];
  npulm_status st = NPULM_OK;
  for (int32_t i = 0; i < g0->n_nodes && st == NPULM_OK; i++) {
    const struct npu_ir_node *n = &g0->nodes[i];
    if (n->layer != layer || n->backend != NPU_BE_NPU || n->op == NPU_OP_TRANSFER) continue;
    st = npu_quant_make_site(m, p, g0, n, cal, o, pool, err);
  }
  return st;
}

/* Whether weight 'wi' is of block 'l' (its name "blk.L.*"). */
static bool of_layer(const struct npu_program *p, int32_t wi, int32_t l) {
  char prefix[24];
  int len = snprintf(prefix, sizeof(prefix), "blk.%d.", (int)l);
  return strncmp(p->weights[wi].name, prefix, (size_t)len) == 0;
}

/* A streaming compile reads the matrices of block 'l' into memory the program owns (so that
 * SmoothQuant rewrites them in place), and lets go of them once the block's sites are made
 * (release_layer). */
static npulm_status acquire_layer(const struct npulm_model *m, struct npu_program *p, int32_t l,
                                  npulm_error *err) {
  for (int32_t i = 0; i < p->n_weights; i++) {
    struct npu_weight *w = &p->weights[i];
    if (w->data != NULL || !w->deferred || !of_layer(p, i, l)) continue;
    float **grown = realloc(p->owned, (size_t)(p->n_owned + 1) * sizeof(*grown));
    if (grown == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    p->owned = grown;
    float *rows = malloc((size_t)w->ne0 * (size_t)w->ne1 * sizeof(float));
    if (rows == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory reading '%s'", w->name);
    p->owned[p->n_owned++] = rows;
    w->data = rows;
    npulm_status st = npu_model_read_rows(m, w->name, 0, (uint64_t)w->ne1, rows, err);
    if (st != NPULM_OK) return st;
  }
  return NPULM_OK;
}

static void release_layer(struct npu_program *p, int32_t l) {
  for (int32_t i = 0; i < p->n_weights; i++) {
    struct npu_weight *w = &p->weights[i];
    if (w->data == NULL || !w->deferred || !of_layer(p, i, l)) continue;
    for (int32_t k = 0; k < p->n_owned; k++) {
      if (p->owned[k] != w->data) continue;
      free(p->owned[k]);
      p->owned[k] = p->owned[--p->n_owned];
      break;
    }
    w->data = NULL;
  }
}

/* The weight that the op writing the tensor of 'role' (outside the blocks) reads, as rows for
 * calibration (npu_calib_rows_fn). */
struct rows_source {
  const struct npulm_model *m;
  const struct npu_program *p;
  int32_t wi;
};

static npulm_status source_rows(void *user, int64_t row0, int64_t n_rows, float *scratch,
                                const float **rows_out, npulm_error *err) {
  const struct rows_source *src = user;
  return npu_quant_weight_rows(src->m, src->p, src->wi, (size_t)row0, (size_t)n_rows, scratch,
                               rows_out, err);
}

/* Bytes a streaming compile's spill file needs: every matrix packed for its matmul, the
 * embedding once more as the gather's table, each 64-byte aligned. */
static size_t spill_bound(const struct npu_program *p) {
  const int32_t embd = npu_ir_weight_of(&p->graphs[0], -1, NPU_ROLE_EMBD, 1);
  size_t total = 0;
  for (int32_t i = 0; i < p->n_weights; i++) {
    const struct npu_weight *w = &p->weights[i];
    bool seen = w->ne1 < 2;
    for (int32_t j = 0; j < i && !seen; j++) seen = strcmp(p->weights[j].name, w->name) == 0;
    if (!seen) total += npu_qs8_gemm_packed_size((size_t)w->ne1, (size_t)w->ne0) + 64;
  }
  if (embd >= 0) total += (size_t)p->weights[embd].ne0 * (size_t)p->weights[embd].ne1 + 64;
  return total;
}

/* Calibrate block 'l' and quantize it: with SmoothQuant, first over the model as read ('plain'),
 * whose statistics give the factors, then over the smoothed block ('final'), whose statistics the
 * quantization takes. */
static npulm_status quantize_layer(const struct npulm_model *m, struct npu_program *p,
                                   struct npu_calib_run *plain, struct npu_calib_run *final,
                                   const struct npu_quant_options *o, struct npu_pool *pool,
                                   int32_t l, int32_t *outliers, npulm_error *err) {
  struct npu_layer_weights lw;
  npulm_status st = acquire_layer(m, p, l, err);
  if (st == NPULM_OK && plain != NULL) {
    layer_view(p, l, &lw);
    if ((st = npu_calib_layer(plain, &lw, m->w.rope_freqs, l, err)) == NPULM_OK) {
      st = npu_smooth_layer(m, p, npu_calib_run_stats(plain), o->smooth_alpha, l, err);
    }
  }
  if (st == NPULM_OK) {
    layer_view(p, l, &lw);
    st = npu_calib_layer(final, &lw, m->w.rope_freqs, l, err);
  }
  const struct npu_calib *cal = npu_calib_run_stats(final);
  if (st == NPULM_OK) st = quantize_tensors(m, p, cal, o, l, false, outliers, err);
  if (st == NPULM_OK) st = quantize_sites(m, p, cal, o, pool, l, err);
  release_layer(p, l);
  return st;
}

npulm_status npu_quantize_program(const struct npulm_model *m, struct npu_program *p,
                                  const int32_t *tokens, size_t n_tokens, int32_t bos,
                                  const struct npu_quant_options *o,
                                  npulm_phase_progress_fn progress, void *user, npulm_error *err) {
  enum { WINDOW = 256 };
  if (o->mode == NPU_QUANT_F32) return NPULM_OK;
  if (npu_quant_float_ops(o->mode, p->opts.float_ops) != p->opts.float_ops) {
    return npu_fail(err, NPULM_ERR_ARG, "%s needs a program compiled with its norms in float",
                    npu_quant_mode_name(o->mode));
  }
  if (npu_quant_act_bits(o->mode) == 16 && !npu_attention_fused(p->opts.float_ops)) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "%s computes attention in float (the default --float-ops): the integer "
                    "NPU's attention reads int8 queries and caches",
                    npu_quant_mode_name(o->mode));
  }
  const struct npu_config *c = &m->cfg;
  const struct npu_graph *g0 = &p->graphs[0];
  struct npu_pool *pool = NULL;
  struct npu_calib_run *plain = NULL, *final = NULL;
  int32_t *outliers = NULL;
  long cpus = o->n_threads > 0 ? o->n_threads : sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
  npulm_status st = npu_pool_create(threads, threads - 1, &pool, err);
  if (st != NPULM_OK) return st;
  /* room for a shadow sum per matmul and two tensors per shadow, and for the row copy of the
   * graphs for generation (add_row_copies) */
  p->qtensors = calloc(3 * (size_t)g0->n_tensors + 2, sizeof(*p->qtensors));
  p->qsites = calloc(2 * (size_t)g0->n_nodes + 2, sizeof(*p->qsites));
  outliers = malloc((size_t)c->ffn_dim * 4 * sizeof(int32_t) + 64);
  if (p->qtensors == NULL || p->qsites == NULL || outliers == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  p->quant_mode = o->mode;
  npu_ukernels_select(npu_isa_detect(), &p->uk);
  p->smooth_alpha = o->smooth_alpha;
  p->shadow_threshold = o->shadow_threshold;
  if (o->spill_dir != NULL) {
    p->spill_size = spill_bound(p);
    p->spill = npu_pages_map_scratch(o->spill_dir, p->spill_size);
    p->qsites_mapped = true; /* the sites' packed weights are not the heap's */
    if (p->spill == NULL) {
      st = npu_fail(err, NPULM_ERR_IO,
                    "cannot write a %zu MiB scratch file for the packed weights in '%s': %s",
                    p->spill_size >> 20, o->spill_dir, strerror(errno));
      goto done;
    }
  }
  struct rows_source embd = {m, p, npu_ir_weight_of(g0, -1, NPU_ROLE_EMBD, 1)};
  struct rows_source output = {m, p, npu_ir_weight_of(g0, -1, NPU_ROLE_LOGITS, 1)};
  int32_t output_norm = npu_ir_weight_of(g0, -1, NPU_ROLE_OUTPUT_NORM, 1);
  if (embd.wi < 0 || output.wi < 0 || output_norm < 0) {
    st = npu_fail(err, NPULM_ERR_ARG, "the graph has no embedding, output norm or classifier");
    goto done;
  }
  /* the statistics of attention scores and probabilities serve only attention on the NPU */
  const bool scores = !npu_attention_fused(p->opts.float_ops);
  if ((st = npu_calib_run_create(c, tokens, n_tokens, WINDOW, bos, scores, pool, &final, err)) ||
      (npu_quant_outliers(o->mode) == NPU_OUTLIERS_SMOOTH &&
       (st = npu_calib_run_create(c, tokens, n_tokens, WINDOW, bos, scores, pool, &plain, err))) ||
      (st = npu_calib_embed(final, source_rows, &embd, err)) ||
      (plain != NULL && (st = npu_calib_embed(plain, source_rows, &embd, err))) ||
      (st = quantize_tensors(m, p, npu_calib_run_stats(final), o, -1, true, outliers, err))) {
    goto done;
  }
  /* a block at a time: only its float weights are in memory (progress: the blocks, and the head
   * as one more) */
  const uint64_t n_steps = (uint64_t)c->n_layers + 1;
  if (progress != NULL) progress(user, "quantize", "blocks", 0, n_steps);
  for (int32_t l = 0; l < c->n_layers && st == NPULM_OK; l++) {
    st = quantize_layer(m, p, plain, final, o, pool, l, outliers, err);
    if (progress != NULL) progress(user, "quantize", "blocks", (uint64_t)l + 1, n_steps);
  }
  if (st != NPULM_OK) goto done;
  /* the head: output norm, classifier (a block of rows at a time), embedding */
  const struct npu_calib *cal = npu_calib_run_stats(final);
  if ((st = npu_calib_head(final, p->weights[output_norm].data, source_rows, &output, err)) ||
      (st = quantize_tensors(m, p, cal, o, -1, false, outliers, err)) ||
      (st = quantize_sites(m, p, cal, o, pool, -1, err)) ||
      (st = add_row_copies(m, p, cal, o, err))) {
    goto done;
  }
  if (progress != NULL) progress(user, "quantize", "blocks", n_steps, n_steps);
  npu_quant_share_tables(p);
  /* a program that will run gets its weights placed; a streaming compile's only go to a file */
  if (p->spill == NULL && (st = npu_quant_place_packed(p, err)) != NPULM_OK) goto done;
  /* shadowed matmuls: the CPU share and the sum take the matmul's quantization */
  int32_t n_sites = p->n_qsites;
  for (int32_t i = 0; i < n_sites && st == NPULM_OK; i++) {
    const struct npu_qsite *mm = &p->qsites[i];
    if (mm->op != NPU_OP_MATMUL || mm->n_outliers == 0) continue;
    const struct npu_qtensor *y = npu_program_qtensor(p, mm->name);
    char base[NPU_IR_NAME_MAX - 10];
    snprintf(base, sizeof(base), "%.*s", (int)sizeof(base) - 1, mm->name);
    struct npu_qsite *add = &p->qsites[p->n_qsites++];
    memset(add, 0, sizeof(*add));
    add->table_site = -1;
    snprintf(add->name, sizeof(add->name), "%s.shadowed", base);
    add->op = NPU_OP_ADD;
    const char *suffixes[2] = {".shadow", ".shadowed"};
    for (int k = 0; k < 2; k++) {
      struct npu_qtensor *t = &p->qtensors[p->n_qtensors++];
      *t = *y;
      snprintf(t->name, sizeof(t->name), "%s%s", base, suffixes[k]);
    }
    if (!npu_qadd_params_make(y->q.scale, y->q.zero_point, y->q.scale, y->q.zero_point, y->q.scale,
                              y->q.zero_point, y->dtype == NPU_DT_I16, &add->add)) {
      st = npu_fail(err, NPULM_ERR_ARG, "'%s': shadow sum cannot be quantized", mm->name);
    }
  }
  for (int32_t i = 0; i < p->n_graphs && st == NPULM_OK; i++) {
    if ((st = npu_quant_rewrite_graph(p, &p->graphs[i], err)) == NPULM_OK) {
      st = npu_quant_link(p, &p->graphs[i], err);
    }
  }
done:
  npu_calib_run_free(plain);
  npu_calib_run_free(final);
  npu_pool_free(pool);
  free(outliers);
  if (st != NPULM_OK) npu_quant_free(p);
  return st;
}
