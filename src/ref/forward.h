/* The FP32 reference forward pass: plain C, one token at a time over a KV cache. It is the oracle
 * every quantized and compiled path is judged against, so it stays simple enough to trust. */
#ifndef NPU_REF_FORWARD_H
#define NPU_REF_FORWARD_H

#include <math.h>

#include "model/model.h"

/* SiLU, the activation of the SwiGLU feed-forward: x * sigmoid(x), computed as x / (1 + e^-x)
 * with libm's expf. The one definition: the reference, the CPU kernel and the executor's shadow
 * path all call it, so their results have the same bits. */
static inline float npu_ref_silu(float x) { return x / (1.0f + expf(-x)); }

/* out[r * n_out + o] = npu_ref_dot(w + o * n_in, x + r * n_in, n_in) (+ bias[o]) for r < rows:
 * the matmuls of a block over 'rows' positions. A faster function may stand in for the plain one
 * (npu_ref_matmul) only if it gives these bits: the CPU kernels' float matmul does. */
typedef void npu_ref_matmul_fn(void *user, float *out, const float *w, const float *bias,
                               const float *x, int n_in, int n_out, int rows);

/* out [rows, heads * hd]: row r's query heads q [rows, heads * hd] over cache positions 0 ..
 * pos0 + r (keys and values: rows of kv_heads * hd floats from position 0; head h reads KV head
 * h / (heads / kv_heads)), each as npu_ref_attention computes it with 'scale'. A faster function
 * may stand in only if it gives those bits: the CPU kernels' fused attention does. */
typedef void npu_ref_attention_fn(void *user, float *out, const float *q, const float *keys,
                                  const float *values, int heads, int kv_heads, int hd, int rows,
                                  int pos0, float scale);

/* Activations and KV cache of one sequence, for blocks of up to max_rows positions at a time. */
struct npu_ref_state {
  int n_ctx, max_rows;
  float *x;                        /* (max_rows, dim) residual stream */
  float *xb;                       /* (max_rows, max(dim, q_dim)) normed input / attention output */
  float *xb2;                      /* (max_rows, dim) projection output */
  float *hb;                       /* (max_rows, ffn_dim) gate */
  float *hb2;                      /* (max_rows, ffn_dim) up */
  float *q;                        /* (max_rows, n_heads * head_dim) */
  float *att;                      /* (n_ctx) attention scores of one head */
  float *key_cache;                /* (n_layers, n_ctx, n_kv_heads * head_dim) */
  float *value_cache;              /* (n_layers, n_ctx, n_kv_heads * head_dim) */
  npu_ref_matmul_fn *matmul;       /* NULL: npu_ref_matmul */
  npu_ref_attention_fn *attention; /* NULL: npu_ref_attention row by row, head by head */
  void *matmul_user;               /* the 'user' of both */
};

/* A state for one position at a time (max_rows 1). */
npulm_status npu_ref_state_init(struct npu_ref_state *s, const struct npu_config *cfg, int n_ctx,
                                npulm_error *err);
/* A state for blocks of up to 'max_rows' positions (npu_ref_block). */
npulm_status npu_ref_state_init_rows(struct npu_ref_state *s, const struct npu_config *cfg,
                                     int n_ctx, int max_rows, npulm_error *err);
void npu_ref_state_free(struct npu_ref_state *s);

/* Sees every intermediate activation of one token, named as the graph builder names its tensors
 * ("embd", "attn_norm", "attn_q", ..., "ffn_residual", "output_norm", "logits"; 'layer' is -1
 * outside the blocks). Calibration and error attribution use it. The attention scores ("kq",
 * after the 1/sqrt(head_dim) scale) and probabilities ("kq_softmax") are shown one head at a
 * time, heads in order, each with the pos + 1 values of the positions the token attends to (the
 * [heads, rows, ctx] tensors of a graph whose attention runs as QK, SOFTMAX, PV, without the
 * masked rest): npu_ref_per_head() says which. The probabilities are the scores' softmax as one
 * row (npu_ref_softmax), computed for the observer only: the attention output itself is
 * npu_ref_attention's online softmax, which agrees with them to rounding. */
struct npu_ref_observer {
  void (*fn)(void *user, int layer, const char *what, const float *values, int n);
  /* Optional: an activation of a block of positions shown at once, 'rows' rows of 'n' values
   * (npu_ref_block; the per-head scores still go to fn); without it, fn sees them row by row. */
  void (*rows_fn)(void *user, int layer, const char *what, const float *values, int n, int rows);
  void *user;
  bool scores; /* show "kq" and "kq_softmax" too (they cost a softmax per head for nothing else) */
};

/* True for the names shown one head at a time (see npu_ref_observer). */
bool npu_ref_per_head(const char *what);

/* Run token 'token' at position 'pos' (0 <= pos < s->n_ctx; positions before it must already be
 * in the cache) and write n_vocab logits to 'logits'. 'observer' may be NULL. */
void npu_ref_forward(const struct npulm_model *m, struct npu_ref_state *s, int32_t token, int pos,
                     float *logits, const struct npu_ref_observer *observer);

/* Decoder block 'layer' (weights 'lw'; 'rope_freqs' may be NULL) over 'rows' consecutive positions
 * pos0 .. pos0 + rows - 1 (< s->n_ctx, rows <= s->max_rows) of one sequence: s->x holds their
 * residual stream, rows after row, in and out; the positions before pos0 must be in the layer's
 * cache. Each row gets the bits npu_ref_forward gives it one position at a time, and the observer
 * sees each row's activations as it would, activation by activation over the rows. The
 * calibration runs the model this way, a layer at a time over all its text. */
void npu_ref_block(const struct npu_config *c, const struct npu_layer_weights *lw,
                   const float *rope_freqs, struct npu_ref_state *s, int layer, int pos0, int rows,
                   const struct npu_ref_observer *observer);

/* Building blocks, shared with tests and calibration. */
void npu_ref_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);
/* sum_i a[i] * b[i], as eight partial sums (lane j takes i = j mod 8, in order), the rest of
 * n past a multiple of 8 summed in order, plus the lanes reduced pairwise: the order the CPU
 * kernels' 8-lane vectors add in. */
float npu_ref_dot(const float *a, const float *b, int n);
/* out[o] = npu_ref_dot(w + o * n_in, x, n_in) (+ bias[o] if bias != NULL), for o < n_out. */
void npu_ref_matvec(float *out, const float *w, const float *bias, const float *x, int n_in,
                    int n_out);
/* npu_ref_matvec of each of 'rows' inputs x [rows, n_in] into out [rows, n_out]; an
 * npu_ref_matmul_fn ('user' unused). */
void npu_ref_matmul(void *user, float *out, const float *w, const float *bias, const float *x,
                    int n_in, int n_out, int rows);
void npu_ref_softmax(float *x, int n);

/* Keys per tile of the online softmax that defines attention (npu_ref_attention); the CPU
 * backend's fused attention kernel uses the same tiles, so that both give the same bits. */
#define NPU_REF_ATTN_TILE 32

/* Attention of one query head over cache positions 0 .. len-1 (len >= 1):
 * out (hd) = sum_j softmax_j(q . k_j * scale) v_j, where k_j = keys + j * stride and likewise v_j.
 * Defined over tiles of NPU_REF_ATTN_TILE keys: each tile on its own gives the maximum m of its
 * scores (npu_ref_dot(k_j, q) * scale), the sum l of its keys' p_j = npu_expf(score_j - m)
 * (base/expf.h) and the weighted sum u of their values (each element adding in key order); the
 * tiles are then folded in key order into a running (max, sum, output), the first tile being
 * the first running result: with M the larger of the two maxima, sum = sum * npu_expf(max - M) +
 * l * npu_expf(m - M), and the output likewise with u; at the end the output is divided by the
 * sum. A tile's result does not depend on any other tile, so tiles may be computed apart (decode
 * splits a step's keys across threads) and folded after. No [len] probabilities exist at once,
 * so memory does not grow with the context. 'att' (len) receives the scores. */
void npu_ref_attention(float *out, float *att, const float *q, const float *keys,
                       const float *values, size_t stride, int hd, int len, float scale);
void npu_ref_rope(float *vec, int n_heads, const struct npu_config *cfg, const float *freq_factors,
                  int pos);

#endif /* NPU_REF_FORWARD_H */
