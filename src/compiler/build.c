/* The compiler front: the weight table of a model, the one builder of the llama/qwen2 block, and
 * npu_compile(), which builds, partitions and plans a graph for every specialization. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "compiler/compiler.h"

/* ---- Options -------------------------------------------------------------------------------- */

void npu_compile_default_options(const struct npu_config *cfg, struct npu_compile_options *o) {
  memset(o, 0, sizeof(*o));
  /* 64 rows is the smallest chunk that keeps the matmuls compute-bound; 16 serves short prompts
   * without padding them to 64; 128 is where a larger chunk stops paying (its attention and
   * arena grow, and it leaves the two workers less to overlap). A chunk longer than the model's
   * context is left out: no bucket could hold it. */
  static const int32_t chunks[] = {16, 64, 128};
  for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
    if (chunks[i] <= cfg->n_ctx_train) o->chunks[o->n_chunks++] = chunks[i];
  }
  for (int32_t k = 128; k < cfg->n_ctx_train && o->n_buckets < NPU_MAX_BUCKETS - 1; k *= 2) {
    o->buckets[o->n_buckets++] = k;
  }
  o->buckets[o->n_buckets++] = cfg->n_ctx_train;
  o->float_ops = NPU_DEFAULT_FLOAT_OPS;
}

/* ---- The llama/qwen2 graph ------------------------------------------------------------------ */

struct block_builder {
  struct npu_ir_builder b;
  const struct npu_config *c;
  const struct npu_weight *weights;
  int32_t n_weights;
  bool fused_attention; /* NPU_OP_ATTN rather than QK, SOFTMAX, PV */
};

/* A WEIGHT tensor for weight number 'i', or -1 when the model lacks it (an absent bias). */
static int32_t weight(struct block_builder *bb, int32_t i) {
  const struct npu_weight *w = &bb->weights[i];
  if (w->data == NULL && !w->deferred) return -1;
  return npu_ir_add_tensor(&bb->b, NPU_TK_WEIGHT, NPU_DT_F32, w->ne1, w->ne0, 1, i, w->name);
}

/* A new activation [ne0, ne1, ne2] of 'role' in 'layer', named "blk.L.<role's name>" (or the
 * role's name outside the blocks). */
static int32_t act3(struct block_builder *bb, int32_t layer, enum npu_tensor_role role, int32_t ne0,
                    int32_t ne1, int32_t ne2) {
  char name[NPU_IR_NAME_MAX];
  const char *what = npu_tensor_role_name(role);
  if (layer >= 0) snprintf(name, sizeof(name), "blk.%d.%s", layer, what);
  else snprintf(name, sizeof(name), "%s", what);
  int32_t t = npu_ir_add_tensor(&bb->b, NPU_TK_ACT, NPU_DT_F32, ne0, ne1, ne2, -1, name);
  npu_ir_set_role(&bb->b, t, layer, role);
  return t;
}

static int32_t act(struct block_builder *bb, int32_t layer, enum npu_tensor_role role,
                   int32_t cols) {
  return act3(bb, layer, role, bb->b.g->rows, cols, 1);
}

/* out = op(in0, in1, in2) into a new activation of 'role' with 'cols' columns. */
static int32_t apply(struct block_builder *bb, enum npu_op op, int32_t layer,
                     enum npu_tensor_role role, int32_t cols, int32_t in0, int32_t in1, int32_t in2,
                     float param) {
  int32_t out = act(bb, layer, role, cols);
  npu_ir_add_node(&bb->b, op, in0, in1, in2, out, layer, param);
  return out;
}

/* One transformer block on the residual stream 'x'; returns the new residual stream. */
static int32_t build_block(struct block_builder *bb, int32_t l, int32_t x) {
  const struct npu_config *c = bb->c;
  int32_t rows = bb->b.g->rows, ctx = bb->b.g->ctx;
  int32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
  float eps = c->rms_eps;

  /* attention rmsnorm */
  int32_t xn = apply(bb, NPU_OP_RMSNORM, l, NPU_ROLE_ATTN_NORM, c->dim, x,
                     weight(bb, npu_layer_weight(l, NPU_LW_ATTN_NORM)), -1, eps);
  /* q, k, v projections */
  int32_t q =
      apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_Q, q_dim, xn, weight(bb, npu_layer_weight(l, NPU_LW_Q)),
            weight(bb, npu_layer_weight(l, NPU_LW_BQ)), 0);
  int32_t k =
      apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_K, kv_dim, xn, weight(bb, npu_layer_weight(l, NPU_LW_K)),
            weight(bb, npu_layer_weight(l, NPU_LW_BK)), 0);
  int32_t v =
      apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_V, kv_dim, xn, weight(bb, npu_layer_weight(l, NPU_LW_V)),
            weight(bb, npu_layer_weight(l, NPU_LW_BV)), 0);
  /* rotary position embedding */
  int32_t qr = apply(bb, NPU_OP_ROPE, l, NPU_ROLE_Q_ROPE, q_dim, q, -1, -1, 0);
  int32_t kr = apply(bb, NPU_OP_ROPE, l, NPU_ROLE_K_ROPE, kv_dim, k, -1, -1, 0);
  /* append k and v to the cache of this layer */
  int32_t k_cache = npu_ir_add_tensor(&bb->b, NPU_TK_KV, NPU_DT_F32, ctx, kv_dim, 1, l,
                                      npu_tensor_role_name(NPU_ROLE_K_CACHE));
  npu_ir_set_role(&bb->b, k_cache, l, NPU_ROLE_K_CACHE);
  int32_t v_cache = npu_ir_add_tensor(&bb->b, NPU_TK_KV, NPU_DT_F32, ctx, kv_dim, 1, l,
                                      npu_tensor_role_name(NPU_ROLE_V_CACHE));
  npu_ir_set_role(&bb->b, v_cache, l, NPU_ROLE_V_CACHE);
  if (v_cache >= 0) bb->b.g->tensors[v_cache].kv_is_value = 1;
  npu_ir_add_node(&bb->b, NPU_OP_KV_WRITE, kr, -1, -1, k_cache, l, 0);
  npu_ir_add_node(&bb->b, NPU_OP_KV_WRITE, v, -1, -1, v_cache, l, 0);
  /* attention: all in float on the CPU, fused (online softmax: no scores kept); else scores,
   * softmax and weighted values as three ops, for the parts the NPU may run */
  float scale = 1.0f / sqrtf((float)c->head_dim);
  int32_t o;
  if (bb->fused_attention) {
    o = apply(bb, NPU_OP_ATTN, l, NPU_ROLE_KQV, q_dim, qr, k_cache, v_cache, scale);
  } else {
    int32_t s = act3(bb, l, NPU_ROLE_KQ, c->n_heads, rows, ctx);
    npu_ir_add_node(&bb->b, NPU_OP_QK, qr, k_cache, -1, s, l, scale);
    int32_t p = act3(bb, l, NPU_ROLE_KQ_SOFTMAX, c->n_heads, rows, ctx);
    npu_ir_add_node(&bb->b, NPU_OP_SOFTMAX, s, -1, -1, p, l, 0);
    o = apply(bb, NPU_OP_PV, l, NPU_ROLE_KQV, q_dim, p, v_cache, -1, 0);
  }
  /* output projection and residual */
  int32_t ao = apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_ATTN_OUT, c->dim, o,
                     weight(bb, npu_layer_weight(l, NPU_LW_O)), -1, 0);
  int32_t h = apply(bb, NPU_OP_ADD, l, NPU_ROLE_ATTN_RESIDUAL, c->dim, x, ao, -1, 0);
  /* ffn rmsnorm and SwiGLU feed-forward */
  int32_t hn = apply(bb, NPU_OP_RMSNORM, l, NPU_ROLE_FFN_NORM, c->dim, h,
                     weight(bb, npu_layer_weight(l, NPU_LW_FFN_NORM)), -1, eps);
  int32_t gate = apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_FFN_GATE, c->ffn_dim, hn,
                       weight(bb, npu_layer_weight(l, NPU_LW_GATE)), -1, 0);
  int32_t up = apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_FFN_UP, c->ffn_dim, hn,
                     weight(bb, npu_layer_weight(l, NPU_LW_UP)), -1, 0);
  int32_t act_gate = apply(bb, NPU_OP_SILU, l, NPU_ROLE_FFN_SILU, c->ffn_dim, gate, -1, -1, 0);
  int32_t prod = apply(bb, NPU_OP_MUL, l, NPU_ROLE_FFN_GATE_PAR, c->ffn_dim, act_gate, up, -1, 0);
  int32_t down = apply(bb, NPU_OP_MATMUL, l, NPU_ROLE_FFN_DOWN, c->dim, prod,
                       weight(bb, npu_layer_weight(l, NPU_LW_DOWN)), -1, 0);
  /* residual */
  return apply(bb, NPU_OP_ADD, l, NPU_ROLE_FFN_RESIDUAL, c->dim, h, down, -1, 0);
}

npulm_status npu_build_graph(const struct npulm_model *m, const struct npu_weight *weights,
                             int32_t n_weights, int32_t rows, int32_t ctx, uint32_t float_ops,
                             bool last_logits, struct npu_graph *g, npulm_error *err) {
  struct block_builder bb = {.c = &m->cfg,
                             .weights = weights,
                             .n_weights = n_weights,
                             .fused_attention = npu_attention_fused(float_ops)};
  const struct npu_config *c = &m->cfg;
  npu_ir_builder_init(&bb.b, g, rows, ctx);
  /* token embedding */
  int32_t ids = npu_ir_add_tensor(&bb.b, NPU_TK_INPUT_IDS, NPU_DT_I32, rows, 1, 1, -1, "ids");
  int32_t x =
      apply(&bb, NPU_OP_GATHER, -1, NPU_ROLE_EMBD, c->dim, ids, weight(&bb, NPU_W_EMBD), -1, 0);
  for (int32_t l = 0; l < c->n_layers; l++) x = build_block(&bb, l, x);
  /* final rmsnorm and classifier: on every row, or only on the last real one, whose logits are
   * all that generating the next token needs (for a large vocabulary, the classifier is a fifth
   * or more of a prefill's multiply-accumulates) */
  int32_t out_rows = last_logits ? 1 : rows;
  if (out_rows != rows) {
    int32_t last = act3(&bb, -1, NPU_ROLE_LAST_ROW, 1, c->dim, 1);
    npu_ir_add_node(&bb.b, NPU_OP_LAST_ROW, x, -1, -1, last, -1, 0);
    x = last;
  }
  int32_t xn = act3(&bb, -1, NPU_ROLE_OUTPUT_NORM, out_rows, c->dim, 1);
  npu_ir_add_node(&bb.b, NPU_OP_RMSNORM, x, weight(&bb, NPU_W_OUT_NORM), -1, xn, -1, c->rms_eps);
  int32_t logits = npu_ir_add_tensor(&bb.b, NPU_TK_LOGITS, NPU_DT_F32, out_rows, c->n_vocab, 1, -1,
                                     npu_tensor_role_name(NPU_ROLE_LOGITS));
  npu_ir_set_role(&bb.b, logits, -1, NPU_ROLE_LOGITS);
  npu_ir_add_node(&bb.b, NPU_OP_MATMUL, xn, weight(&bb, NPU_W_OUTPUT), -1, logits, -1, 0);
  if (bb.b.status != NPULM_OK) {
    npu_graph_free(g);
    if (err != NULL) *err = bb.b.err;
    return bb.b.status;
  }
  return NPULM_OK;
}
