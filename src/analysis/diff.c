/* Error attribution: the FP32 reference and the compiled program run side by side, token by
 * token; every activation the graph names is compared with the reference's value of the same
 * name (integer tensors dequantized, SmoothQuant's factors taken out), and the next-token
 * distributions by KL divergence. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/exec.h"
#include "base/common.h"
#include "program/program.h"
#include "ref/forward.h"
#include "runtime/session_internal.h"

/* One named activation: the reference's value for the current token, the graph's, and the
 * running error sums. */
struct slot {
  char name[NPU_IR_NAME_MAX];
  int32_t n;
  float *ref; /* (n) this token's reference value */
  float *got; /* (n) this token's graph value (the last node that wrote it) */
  bool have_ref, have_got;
  const char *op, *backend, *dtype;
  int32_t layer;
  /* attention scores and probabilities (npu_ref_per_head): the valid entries of every head, as
   * many as the token attends to, so 'n' changes from token to token within room for 'cap' */
  bool per_head;
  int32_t cap, n_got;
  double sum_ref2, sum_err2, max_abs;
  uint64_t count;
};

struct diff {
  struct slot *slots;
  int32_t n_slots, cap;
  npulm_status status;
};

/* The slot of 'name' with 'n' values (any number for a per-head slot), made if 'create'. */
static struct slot *slot_for(struct diff *d, const char *name, int32_t n, bool create) {
  for (int32_t i = 0; i < d->n_slots; i++) {
    if (strcmp(d->slots[i].name, name) == 0) {
      return d->slots[i].n == n || d->slots[i].per_head ? &d->slots[i] : NULL;
    }
  }
  if (!create) return NULL;
  if (d->n_slots == d->cap) {
    int32_t cap = d->cap ? 2 * d->cap : 64;
    struct slot *grown = realloc(d->slots, (size_t)cap * sizeof(*grown));
    if (grown == NULL) {
      d->status = NPULM_ERR_NOMEM;
      return NULL;
    }
    d->slots = grown;
    d->cap = cap;
  }
  struct slot *s = &d->slots[d->n_slots];
  memset(s, 0, sizeof(*s));
  snprintf(s->name, sizeof(s->name), "%s", name);
  s->n = n;
  s->layer = -1;
  s->ref = malloc((size_t)n * sizeof(float));
  s->got = malloc((size_t)n * sizeof(float));
  if (s->ref == NULL || s->got == NULL) {
    free(s->ref);
    free(s->got);
    d->status = NPULM_ERR_NOMEM;
    return NULL;
  }
  d->n_slots++;
  return s;
}

/* Room for 'n' values in a per-head slot. */
static bool reserve(struct diff *d, struct slot *s, int32_t n) {
  if (n <= s->cap) return true;
  int32_t cap = n > 2 * s->cap ? n : 2 * s->cap;
  float *ref = realloc(s->ref, (size_t)cap * sizeof(float));
  if (ref != NULL) s->ref = ref;
  float *got = ref != NULL ? realloc(s->got, (size_t)cap * sizeof(float)) : NULL;
  if (got != NULL) s->got = got;
  if (ref == NULL || got == NULL) {
    d->status = NPULM_ERR_NOMEM;
    return false;
  }
  s->cap = cap;
  return true;
}

/* The reference shows one head's scores or probabilities: appended to the token's. */
static void on_ref_head(struct diff *d, const char *name, int layer, const float *v, int n) {
  struct slot *s = NULL;
  for (int32_t i = 0; i < d->n_slots && s == NULL; i++) {
    if (strcmp(d->slots[i].name, name) == 0) s = &d->slots[i];
  }
  if (s == NULL && (s = slot_for(d, name, n, true)) != NULL) {
    s->per_head = true;
    s->cap = n;
    s->n = 0;
  }
  if (s == NULL || !s->per_head) return;
  if (!s->have_ref) s->n = 0; /* the token's first head */
  if (!reserve(d, s, s->n + n)) return;
  memcpy(s->ref + s->n, v, (size_t)n * sizeof(float));
  s->n += n;
  s->have_ref = true;
  s->layer = layer;
}

/* The reference shows each activation of the token. */
static void on_ref(void *user, int layer, const char *what, const float *v, int n) {
  struct diff *d = user;
  char name[NPU_IR_NAME_MAX];
  if (layer >= 0) snprintf(name, sizeof(name), "blk.%d.%s", layer, what);
  else snprintf(name, sizeof(name), "%s", what);
  if (npu_ref_per_head(what)) {
    on_ref_head(d, name, layer, v, n);
    return;
  }
  struct slot *s = slot_for(d, name, n, true);
  if (s == NULL) return;
  memcpy(s->ref, v, (size_t)n * sizeof(float));
  s->have_ref = true;
  s->layer = layer;
}

static const char *dtype_name(uint8_t dt) {
  return dt == NPU_DT_I8 ? "i8" : dt == NPU_DT_I16 ? "i16" : "f32";
}

/* n values of tensor 't' at 'src' as floats (integer tensors dequantized by 'uk'). */
static void values(const struct npu_cpu_ukernels *uk, const struct npu_ir_tensor *t,
                   const void *src, size_t n, float *out) {
  if (t->dtype == NPU_DT_I8) uk->dequantize_s8(src, n, t->q.scale, t->q.zero_point, out);
  else if (t->dtype == NPU_DT_I16) uk->dequantize_s16(src, n, t->q.scale, t->q.zero_point, out);
  else memcpy(out, src, n * sizeof(float));
}

/* The activation name without its "blk.L." prefix, as the reference names it. */
static const char *what_of(const char *name) {
  if (strncmp(name, "blk.", 4) != 0) return name;
  const char *dot = strchr(name + 4, '.');
  return dot != NULL ? dot + 1 : name;
}

/* The graph ran a node: record its output, dequantized, under the reference's name. A shadowed
 * matmul's sum stands for the matmul (its first operand); the outlier share alone is skipped. */
static void on_node(void *user, const struct npu_graph *g, int32_t node,
                    const struct npu_exec_ctx *ctx) {
  struct diff *d = user;
  const struct npu_ir_node *nd = &g->nodes[node];
  const struct npu_ir_tensor *t = &g->tensors[nd->out];
  if (g->rows != 1 || (t->kind != NPU_TK_ACT && t->kind != NPU_TK_LOGITS)) return;
  if (t->role == NPU_ROLE_SHADOW) return;
  const struct npu_ir_tensor *named =
      t->role == NPU_ROLE_SHADOW_SUM && nd->in[0] >= 0 ? &g->tensors[nd->in[0]] : t;
  const char *name = named->name;
  const void *src = t->kind == NPU_TK_LOGITS ? (const void *)ctx->logits
                                             : (const void *)(ctx->arena[t->backend] + t->offset);
  struct slot *s;
  if (npu_ref_per_head(what_of(name))) {
    /* [heads, 1, ctx] scores or probabilities: the first pos0 + 1 of each head's row */
    s = slot_for(d, name, -1, false);
    int32_t heads = t->ne[0], attended = ctx->pos0 + 1, n = heads * attended;
    if (s == NULL || !s->per_head || attended > t->ne[2] || !reserve(d, s, n)) return;
    size_t row = (size_t)t->ne[2] * npu_dtype_size((enum npu_dtype)t->dtype);
    for (int32_t h = 0; h < heads; h++) {
      values(ctx->cpu_uk, t, (const uint8_t *)src + (size_t)h * row, (size_t)attended,
             s->got + (size_t)h * (size_t)attended);
    }
    s->n_got = n;
  } else {
    s = slot_for(d, name, t->ne[1] * t->ne[2], false);
    if (s == NULL) return;
    values(ctx->cpu_uk, t, src, (size_t)s->n, s->got);
    /* SmoothQuant's activations are divided by its factors: compared as the model's own */
    npu_smooth_unsmooth(ctx->prog, ctx->cfg, nd->layer, (enum npu_tensor_role)named->role, s->got,
                        s->n);
  }
  s->have_got = true;
  /* a transfer only moves the value: the op and place that made it are the ones to report */
  if (nd->op != NPU_OP_TRANSFER || s->op == NULL) {
    s->op = npu_op_name((enum npu_op)nd->op);
    s->backend = npu_backend_name((enum npu_backend)nd->backend);
    s->dtype = dtype_name(t->dtype);
  }
}

/* Fold this token's pair of values into the error sums. */
static void settle(struct diff *d) {
  for (int32_t i = 0; i < d->n_slots; i++) {
    struct slot *s = &d->slots[i];
    if (s->have_ref && s->have_got && (!s->per_head || s->n_got == s->n)) {
      for (int32_t k = 0; k < s->n; k++) {
        double r = s->ref[k], e = (double)s->got[k] - r;
        s->sum_ref2 += r * r;
        s->sum_err2 += e * e;
        if (fabs(e) > s->max_abs) s->max_abs = fabs(e);
      }
      s->count += (uint64_t)s->n;
    }
    s->have_ref = s->have_got = false;
  }
}

/* KL(p || q) of the softmax distributions of two logit vectors. */
static double kl_divergence(const float *p_logits, const float *q_logits, int n) {
  double pmax = p_logits[0], qmax = q_logits[0], psum = 0, qsum = 0, kl = 0;
  for (int i = 1; i < n; i++) {
    pmax = fmax(pmax, p_logits[i]);
    qmax = fmax(qmax, q_logits[i]);
  }
  for (int i = 0; i < n; i++) {
    psum += exp(p_logits[i] - pmax);
    qsum += exp(q_logits[i] - qmax);
  }
  double lp = log(psum), lq = log(qsum);
  for (int i = 0; i < n; i++) {
    double logp = p_logits[i] - pmax - lp, logq = q_logits[i] - qmax - lq;
    kl += exp(logp) * (logp - logq);
  }
  return kl;
}

static int32_t argmax(const float *v, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++) best = v[i] > v[best] ? i : best;
  return best;
}

void npulm_diff_free(npulm_diff_report *r) {
  if (r == NULL) return;
  free(r->entries);
  free(r);
}

npulm_status npulm_diff(const npulm_model *m, const char *text, size_t len,
                        npulm_diff_report **report_out, npulm_error *err) {
  *report_out = NULL;
  struct diff d = {.status = NPULM_OK};
  struct npu_ref_state ref = {0};
  npulm_session *session = NULL;
  npulm_diff_report *r = calloc(1, sizeof(*r));
  int32_t *ids = NULL;
  float *ref_logits = malloc((size_t)m->cfg.n_vocab * sizeof(float));
  size_t n = 0;
  npulm_session_params sp = {.n_ctx = 0, .n_threads = 1, .reference = false};
  npulm_status st = r && ref_logits ? NPULM_OK : npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  if (st == NPULM_OK) st = npu_model_check_float(m, "diff (it runs the reference forward)", err);
  if (st == NPULM_OK) st = npu_tokenize_alloc(m, text, len, true, &ids, &n, err);
  if (st == NPULM_OK) st = npulm_session_create(m, &sp, &session, err);
  if (st == NPULM_OK && n > (size_t)npulm_session_ctx(session))
    n = (size_t)npulm_session_ctx(session);
  if (st == NPULM_OK) st = npu_ref_state_init(&ref, &m->cfg, (int)(n > 0 ? n : 1), err);
  if (st != NPULM_OK) goto done;
  npu_session_observe(session, on_node, &d);
  struct npu_ref_observer obs = {.fn = on_ref, .rows_fn = NULL, .user = &d, .scores = true};
  double kl_sum = 0;
  int agree = 0;
  for (size_t t = 0; t < n && st == NPULM_OK && d.status == NPULM_OK; t++) {
    npu_ref_forward(m, &ref, ids[t], (int)t, ref_logits, &obs);
    st = npulm_session_eval(session, &ids[t], 1, NULL, err);
    if (st != NPULM_OK) break;
    settle(&d);
    const float *got = npulm_session_logits(session);
    double kl = kl_divergence(ref_logits, got, m->cfg.n_vocab);
    kl_sum += kl;
    r->kl_max = fmax(r->kl_max, kl);
    agree += argmax(ref_logits, m->cfg.n_vocab) == argmax(got, m->cfg.n_vocab);
  }
  if (st == NPULM_OK && d.status != NPULM_OK) st = npu_fail(err, d.status, "out of memory");
  if (st != NPULM_OK) goto done;
  r->n_tokens = (int)n;
  r->quant = npu_quant_mode_name((enum npu_quant_mode)npu_session_program(session)->quant_mode);
  r->kl_mean = n > 0 ? kl_sum / (double)n : 0.0;
  r->top1_agreement = n > 0 ? (double)agree / (double)n : 0.0;
  r->entries = calloc((size_t)d.n_slots + 1, sizeof(*r->entries));
  if (r->entries == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto done;
  }
  for (int32_t i = 0; i < d.n_slots; i++) {
    const struct slot *s = &d.slots[i];
    if (s->count == 0) continue; /* the reference names it, the graph does not (or vice versa) */
    npulm_diff_entry *e = &r->entries[r->n_entries++];
    snprintf(e->name, sizeof(e->name), "%s", s->name);
    e->op = s->op;
    e->backend = s->backend;
    e->dtype = s->dtype;
    e->layer = s->layer;
    e->sqnr_db = s->sum_err2 > 0 ? 10.0 * log10(s->sum_ref2 / s->sum_err2) : INFINITY;
    e->max_abs_err = s->max_abs;
    e->n_values = s->count;
  }
done:
  for (int32_t i = 0; i < d.n_slots; i++) {
    free(d.slots[i].ref);
    free(d.slots[i].got);
  }
  free(d.slots);
  npu_ref_state_free(&ref);
  npulm_session_free(session);
  free(ids);
  free(ref_logits);
  if (st != NPULM_OK) {
    npulm_diff_free(r);
    return st;
  }
  *report_out = r;
  return NPULM_OK;
}
