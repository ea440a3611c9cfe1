/* The FP32 reference forward pass: plain C, one token at a time over a KV cache. It is the oracle
 * every quantized and compiled path is judged against, so it stays simple enough to trust. */
#ifndef NPU_REF_FORWARD_H
#define NPU_REF_FORWARD_H

#include "model.h"

/* Activations and KV cache of one sequence. */
struct npu_ref_state {
  int n_ctx;
  float *x;           /* (dim) residual stream */
  float *xb;          /* (max(dim, q_dim)) normed input / attention output */
  float *xb2;         /* (dim) projection output */
  float *hb;          /* (ffn_dim) gate */
  float *hb2;         /* (ffn_dim) up */
  float *q;           /* (n_heads * head_dim) */
  float *att;         /* (n_ctx) attention scores of one head */
  float *key_cache;   /* (n_layers, n_ctx, n_kv_heads * head_dim) */
  float *value_cache; /* (n_layers, n_ctx, n_kv_heads * head_dim) */
};

npulm_status npu_ref_state_init(struct npu_ref_state *s, const struct npu_config *cfg, int n_ctx,
                                npulm_error *err);
void npu_ref_state_free(struct npu_ref_state *s);

/* Sees every intermediate activation of one token, named as the graph builder names its tensors
 * ("embd", "attn_norm", "attn_q", ..., "ffn_residual", "output_norm", "logits"; 'layer' is -1
 * outside the blocks). Calibration and error attribution use it. The attention scores ("kq",
 * after the 1/sqrt(head_dim) scale) and probabilities ("kq_softmax") are shown one head at a
 * time, heads in order, each with the pos + 1 values of the positions the token attends to (the
 * graph's [heads, rows, ctx] tensors, without the masked rest): npu_ref_per_head() says which. */
struct npu_ref_observer {
  void (*fn)(void *user, int layer, const char *what, const float *values, int n);
  void *user;
};

/* True for the names shown one head at a time (see npu_ref_observer). */
bool npu_ref_per_head(const char *what);

/* Run token 'token' at position 'pos' (0 <= pos < s->n_ctx; positions before it must already be
 * in the cache) and write n_vocab logits to 'logits'. 'observer' may be NULL. */
void npu_ref_forward(const struct npulm_model *m, struct npu_ref_state *s, int32_t token, int pos,
                     float *logits, const struct npu_ref_observer *observer);

/* Building blocks, shared with tests and calibration. */
void npu_ref_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);
/* out[o] = sum_i w[o * n_in + i] * x[i] (+ bias[o] if bias != NULL), for o < n_out. */
void npu_ref_matvec(float *out, const float *w, const float *bias, const float *x, int n_in,
                    int n_out);
void npu_ref_softmax(float *x, int n);
void npu_ref_rope(float *vec, int n_heads, const struct npu_config *cfg, const float *freq_factors,
                  int pos);

#endif /* NPU_REF_FORWARD_H */
