/* A program's lookups, weight table and policy (see program.h): what the compiler, the loader and
 * the readers of a program share; who frees it is ownership.c's. */
#include "program/program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

/* ---- Ownership and lookups ------------------------------------------------------------------ */

void npu_program_float_weights(const struct npu_program *p, bool *reads_out) {
  for (int32_t i = 0; i < p->n_weights; i++) reads_out[i] = false;
  for (int32_t gi = 0; gi < p->n_graphs; gi++) {
    const struct npu_graph *g = &p->graphs[gi];
    for (int32_t i = 0; i < g->n_nodes; i++) {
      const struct npu_ir_node *n = &g->nodes[i];
      if (!npu_node_reads_float(p, n)) continue;
      for (int s = 0; s < NPU_IR_MAX_IN; s++) {
        const struct npu_ir_tensor *t = n->in[s] >= 0 ? &g->tensors[n->in[s]] : NULL;
        if (t != NULL && t->kind == NPU_TK_WEIGHT && t->ref >= 0 && t->ref < p->n_weights) {
          reads_out[t->ref] = true;
        }
      }
    }
  }
}

const struct npu_graph *npu_program_find(const struct npu_program *p, int32_t rows, int32_t end,
                                         bool last_logits) {
  const int32_t logit_rows = last_logits ? 1 : rows;
  const struct npu_graph *best = NULL;
  for (int32_t i = 0; i < p->n_graphs; i++) {
    const struct npu_graph *g = &p->graphs[i];
    /* a decode graph serves both kinds; only a chunk's logit rows need looking up */
    if (g->rows == rows && g->ctx >= end && (rows == 1 || npu_graph_logit_rows(g) == logit_rows) &&
        (best == NULL || g->ctx < best->ctx)) {
      best = g;
    }
  }
  return best;
}

const struct npu_qsite *npu_program_qsite(const struct npu_program *p, const char *name) {
  for (int32_t i = 0; i < p->n_qsites; i++) {
    if (strcmp(p->qsites[i].name, name) == 0) return &p->qsites[i];
  }
  return NULL;
}

const struct npu_qtensor *npu_program_qtensor(const struct npu_program *p, const char *name) {
  for (int32_t i = 0; i < p->n_qtensors; i++) {
    if (strcmp(p->qtensors[i].name, name) == 0) return &p->qtensors[i];
  }
  return NULL;
}

int npulm_program_max_rows(const npulm_model *model) {
  const struct npu_program *p = model->program;
  int rows = 0;
  for (int32_t i = 0; p != NULL && i < p->n_graphs; i++) {
    if (p->graphs[i].rows > rows) rows = p->graphs[i].rows;
  }
  return rows;
}

/* ---- Options and the weight table ---------------------------------------------------------- */

npulm_status npu_compile_check_options(const struct npu_config *cfg,
                                       const struct npu_compile_options *o, npulm_error *err) {
  if (o->n_chunks < 0 || o->n_chunks > NPU_MAX_CHUNKS || o->n_buckets < 1 ||
      o->n_buckets > NPU_MAX_BUCKETS) {
    return npu_fail(err, NPULM_ERR_ARG, "between 0 and %d chunk sizes and 1 to %d context buckets",
                    NPU_MAX_CHUNKS, NPU_MAX_BUCKETS);
  }
  for (int32_t i = 0; i < o->n_chunks; i++) {
    if (o->chunks[i] < 2 || (i > 0 && o->chunks[i] <= o->chunks[i - 1])) {
      return npu_fail(err, NPULM_ERR_ARG, "chunk sizes must be ascending and at least 2 (got %d)",
                      o->chunks[i]);
    }
  }
  for (int32_t i = 0; i < o->n_buckets; i++) {
    if (o->buckets[i] < 1 || o->buckets[i] > cfg->n_ctx_train ||
        (i > 0 && o->buckets[i] <= o->buckets[i - 1])) {
      return npu_fail(
          err, NPULM_ERR_ARG,
          "context buckets must be ascending and within the model's context %d (got %d)",
          cfg->n_ctx_train, o->buckets[i]);
    }
  }
  if (o->n_chunks > 0 && o->chunks[o->n_chunks - 1] > o->buckets[o->n_buckets - 1]) {
    return npu_fail(err, NPULM_ERR_ARG, "chunk size %d exceeds the largest context bucket %d",
                    o->chunks[o->n_chunks - 1], o->buckets[o->n_buckets - 1]);
  }
  return NPULM_OK;
}

/* Whether model 'm', read with defer_matrices, has matrix 'name' (its view NULL till read). */
static bool deferred_matrix(const struct npulm_model *m, const char *name) {
  const struct npu_gguf_tensor *t = m->defer_matrices ? npu_gguf_find_tensor(m->gguf, name) : NULL;
  return t != NULL && t->n_dims == 2;
}

npulm_status npu_weight_table(const struct npulm_model *m, struct npu_weight **out, int32_t *n,
                              npulm_error *err) {
  const struct npu_config *c = &m->cfg;
  int32_t count = NPU_W_GLOBALS + c->n_layers * NPU_LW_COUNT;
  struct npu_weight *w = calloc((size_t)count, sizeof(*w));
  if (w == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  int32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
#define SET(i, nm, data_, cols, rows_)                                                             \
  do {                                                                                             \
    snprintf(w[i].name, sizeof(w[i].name), "%s", nm);                                              \
    w[i].data = (data_);                                                                           \
    w[i].deferred = w[i].data == NULL && deferred_matrix(m, nm);                                   \
    w[i].ne0 = (cols);                                                                             \
    w[i].ne1 = (rows_);                                                                            \
  } while (0)
  SET(NPU_W_EMBD, "token_embd.weight", m->w.token_embd, c->dim, c->n_vocab);
  SET(NPU_W_OUT_NORM, "output_norm.weight", m->w.output_norm, c->dim, 1);
  SET(NPU_W_OUTPUT, c->tied_output ? "token_embd.weight" : "output.weight", m->w.output, c->dim,
      c->n_vocab);
  for (int32_t l = 0; l < c->n_layers; l++) {
    const struct npu_layer_weights *lw = &m->w.layers[l];
    struct {
      const char *suffix;
      const float *data;
      int32_t cols, rows;
    } specs[NPU_LW_COUNT] = {
        [NPU_LW_ATTN_NORM] = {"attn_norm.weight", lw->attn_norm, c->dim, 1},
        [NPU_LW_Q] = {"attn_q.weight", lw->wq, c->dim, q_dim},
        [NPU_LW_K] = {"attn_k.weight", lw->wk, c->dim, kv_dim},
        [NPU_LW_V] = {"attn_v.weight", lw->wv, c->dim, kv_dim},
        [NPU_LW_BQ] = {"attn_q.bias", lw->bq, q_dim, 1},
        [NPU_LW_BK] = {"attn_k.bias", lw->bk, kv_dim, 1},
        [NPU_LW_BV] = {"attn_v.bias", lw->bv, kv_dim, 1},
        [NPU_LW_O] = {"attn_output.weight", lw->wo, q_dim, c->dim},
        [NPU_LW_FFN_NORM] = {"ffn_norm.weight", lw->ffn_norm, c->dim, 1},
        [NPU_LW_GATE] = {"ffn_gate.weight", lw->w_gate, c->dim, c->ffn_dim},
        [NPU_LW_UP] = {"ffn_up.weight", lw->w_up, c->dim, c->ffn_dim},
        [NPU_LW_DOWN] = {"ffn_down.weight", lw->w_down, c->ffn_dim, c->dim},
    };
    for (int32_t k = 0; k < NPU_LW_COUNT; k++) {
      char name[64];
      snprintf(name, sizeof(name), "blk.%d.%s", l, specs[k].suffix);
      SET(npu_layer_weight(l, k), name, specs[k].data, specs[k].cols, specs[k].rows);
    }
  }
#undef SET
  *out = w;
  *n = count;
  return NPULM_OK;
}

/* ---- The precision policy ------------------------------------------------------------------ */

const char *npu_fallback_reason(enum npu_op op, uint32_t float_ops) {
  if (op == NPU_OP_ATTN) {
    /* the builder makes it only where the policy pins all three (npu_attention_fused) */
    return "qk, softmax and pv pinned to float by the precision policy, fused (online softmax)";
  }
  if (!npu_op_info(op)->on_npu) return "not on the NPU's supported list";
  if (float_ops & (1u << op)) return "pinned to float by the precision policy";
  return NULL;
}

bool npu_attention_fused(uint32_t float_ops) {
  return npu_fallback_reason(NPU_OP_QK, float_ops) != NULL &&
         npu_fallback_reason(NPU_OP_SOFTMAX, float_ops) != NULL &&
         npu_fallback_reason(NPU_OP_PV, float_ops) != NULL;
}

/* ---- SmoothQuant's record ------------------------------------------------------------------ */

void npu_smooth_unsmooth(const struct npu_program *p, const struct npu_config *c, int32_t layer,
                         enum npu_tensor_role role, float *v, int32_t n) {
  if (p->smooth_factors == NULL || layer < 0 || layer >= c->n_layers) return;
  /* the activations that carry a group's 1/s: its input, and for the down projection's input
   * up's output too (its rows took 1/s), for the output projection's V too (likewise) */
  int gi;
  switch (role) {
  case NPU_ROLE_ATTN_NORM: gi = NPU_SMOOTH_QKV; break;
  case NPU_ROLE_FFN_NORM: gi = NPU_SMOOTH_GATE_UP; break;
  case NPU_ROLE_FFN_UP:
  case NPU_ROLE_FFN_GATE_PAR: gi = NPU_SMOOTH_DOWN; break;
  case NPU_ROLE_V:
  case NPU_ROLE_KQV: gi = NPU_SMOOTH_OUT; break;
  default: return;
  }
  const float *s = p->smooth_factors[(size_t)layer * NPU_SMOOTH_GROUPS + (size_t)gi];
  if (s == NULL) return;
  const int32_t group = c->n_heads / c->n_kv_heads;
  for (int32_t i = 0; i < n; i++) {
    /* KQV's channel i is the KV channel of its head's group */
    const int32_t j =
        role == NPU_ROLE_KQV ? (i / c->head_dim / group) * c->head_dim + i % c->head_dim : i;
    v[i] *= s[j];
  }
}
