/* Export of one specialization of a compiled program (decode, or a prefill chunk, at one context
 * bucket) as an ONNX model in the static-cache form of the vendors' NPU flows, with the integer
 * NPU's quantization as QuantizeLinear/DequantizeLinear pairs and, beside it, in an AIMET-style
 * encodings file.
 *
 * The graph is translated node by node. Every value of the program's graph has a float view in
 * ONNX; an integer one (an NPU op's output, int8 or int16) is the op's float result followed by
 * QuantizeLinear with that tensor's scale and zero point and DequantizeLinear back, so that the
 * next op reads what npulm's next op reads. An integer NPU op becomes its float op over the
 * dequantized inputs: the integer data of its site (multipliers, packed weights, block scales)
 * gives back the real scales it was made from (weights per output channel: scale_w = multiplier
 * * scale_y / scale_x), so the ONNX model computes npulm's arithmetic in float and rounds where
 * npulm rounds. Ops the precision policy keeps in float (attention, RoPE, the KV cache, pinned
 * ops) stay plain float ops.
 *
 * Interface (docs/export.md): inputs input_ids and position_ids int32 [1, C],
 * attention_mask float [1, 1, C, K] (additive: columns 0..P-1 are the past slots, P..K-1 this
 * step's rows, P = K - C), past_key_L and past_value_L float [1, P, kv_dim] (none when P is 0);
 * outputs logits float [1, C, n_vocab] and present_key_L, present_value_L float [1, C, kv_dim],
 * this step's cache rows, which the host writes into its cache at their positions.
 *
 * Opset 17, the one Debian's onnx checker (1.12) and the vendors' converters know: its
 * QuantizeLinear/DequantizeLinear take int8 and uint8 only, so int16 activations use the
 * com.microsoft domain's (ONNX Runtime's, and what its QNN flow writes for 16-bit QDQ), and int4
 * weights are int8 tensors holding values in [-8, 7] (LPBQ: the value times its block scale, at
 * most 120 in magnitude, so that one per-channel DequantizeLinear gives the real weight); the
 * encodings give their real bit widths. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/common.h"
#include "export/encodings.h"
#include "export/onnx_write.h"
#include "kernels/cpu/kernels.h"
#include "kernels/npu/npu_ukernels.h"
#include "model/model.h"
#include "npulm.h"
#include "program/program.h"
#include "program/qparams.h"

enum { OPSET = 17, NAME = NPU_ONNX_NAME_MAX };

/* What a lazy initializer's fill reads: a matmul's or gather's integer weights, or a float
 * weight. */
struct weight_fill {
  const struct npu_qsite *site; /* integer weights [n, k] (NULL: float) */
  const float *data;            /* float weights (site NULL) */
  size_t n, k;
};

struct exporter {
  struct npu_onnx *o;
  const struct npulm_model *m;
  const struct npu_program *p;
  const struct npu_graph *g;
  int32_t rows, ctx, past;
  char (*val)[NAME];      /* per graph tensor: its value in ONNX ("" until made) */
  char (*fval)[NAME];     /* its float view: val for a float tensor, the DequantizeLinear output for
                             an integer one */
  char (*cache)[2][NAME]; /* per layer, K and V: the whole cache [K, kv_dim] the step attends */
  char (*float_made)[NAME];  /* per weight: its float initializer ("" until made) */
  char (*site_made)[NAME];   /* per site: the float view of its integer weights ("" until made) */
  struct weight_fill *fills; /* lazy initializers' records: one per weight and per site at most */
  int32_t n_fills, cap_fills;
  struct npu_encodings enc; /* written as the translation goes */
  int32_t n_nodes, n_qdq;
  npulm_status st;
  npulm_error err;
};

static bool ok(const struct exporter *ex) {
  return ex->st == NPULM_OK && npu_onnx_status(ex->o, NULL) == NPULM_OK &&
         ex->enc.status == NPULM_OK;
}

static void fail(struct exporter *ex, npulm_status st, const char *fmt, ...) NPU_PRINTF(3, 4);
static void fail(struct exporter *ex, npulm_status st, const char *fmt, ...) {
  if (ex->st != NPULM_OK) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ex->err.msg, sizeof(ex->err.msg), fmt, ap);
  va_end(ap);
  ex->st = st;
}

/* A name from 'fmt' that no value has yet: with ".2", ".3", ... appended where needed (the
 * program's graph gives a value and its copies in the other arena one name). */
static const char *fresh(struct exporter *ex, char buf[NAME], const char *fmt, ...)
    NPU_PRINTF(3, 4);
static const char *fresh(struct exporter *ex, char buf[NAME], const char *fmt, ...) {
  char base[NAME - 16];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(base, sizeof(base), fmt, ap);
  va_end(ap);
  snprintf(buf, NAME, "%s", base);
  /* "logits" is the graph output, made last (the classifier's result is a Reshape away) */
  for (int i = 2; npu_onnx_has_value(ex->o, buf) || strcmp(buf, "logits") == 0; i++) {
    snprintf(buf, NAME, "%s.%d", base, i);
  }
  return buf;
}

static struct npu_onnx_node *node(struct exporter *ex, const char *op, const char *domain, int n_in,
                                  const char *const *in, const char *out) {
  ex->n_nodes++;
  return npu_onnx_node(ex->o, op, domain, NULL, n_in, in, 1, &out);
}

static void op1(struct exporter *ex, const char *op, const char *a, const char *out) {
  node(ex, op, NULL, 1, (const char *[]){a}, out);
}

static void op2(struct exporter *ex, const char *op, const char *a, const char *b,
                const char *out) {
  node(ex, op, NULL, 2, (const char *[]){a, b}, out);
}

/* An int64 constant vector (a shape, axes), made once per value. */
static const char *ints_const(struct exporter *ex, char buf[NAME], int n, const int64_t *v) {
  int at = snprintf(buf, NAME, "const.i64");
  for (int i = 0; i < n && at < NAME; i++)
    at += snprintf(buf + at, NAME - at, "_%lld", (long long)v[i]);
  if (!npu_onnx_has_value(ex->o, buf)) npu_onnx_init_i64s(ex->o, buf, n, v);
  return buf;
}

static const char *f32_const(struct exporter *ex, char buf[NAME], float v) {
  snprintf(buf, NAME, "const.f32_%a", (double)v);
  if (!npu_onnx_has_value(ex->o, buf)) npu_onnx_init_f32(ex->o, buf, v);
  return buf;
}

/* out = Reshape(x, shape) */
static void reshape(struct exporter *ex, const char *x, int n, const int64_t *shape,
                    const char *out) {
  char s[NAME];
  op2(ex, "Reshape", x, ints_const(ex, s, n, shape), out);
}

static void transpose(struct exporter *ex, const char *x, int n, const int64_t *perm,
                      const char *out) {
  npu_onnx_attr_ints(node(ex, "Transpose", NULL, 1, (const char *[]){x}, out), "perm", n, perm);
}

static void unsqueeze(struct exporter *ex, const char *x, int n, const int64_t *axes,
                      const char *out) {
  char s[NAME];
  op2(ex, "Unsqueeze", x, ints_const(ex, s, n, axes), out);
}

/* ---- Quantized values ------------------------------------------------------------------------ */

static bool is_int(const struct npu_ir_tensor *t) {
  return t->dtype == NPU_DT_I8 || t->dtype == NPU_DT_I16;
}

/* Tensor 't' (integer) := QuantizeLinear(float value 'x') with its scale and zero point, and its
 * float view DequantizeLinear of that. */
static void quantize_into(struct exporter *ex, int32_t t, const char *x) {
  const struct npu_ir_tensor *tt = &ex->g->tensors[t];
  const bool wide = tt->dtype == NPU_DT_I16;
  const char *domain = wide ? "com.microsoft" : NULL;
  char scale[NAME], zp[NAME];
  fresh(ex, scale, "%s.scale", x);
  fresh(ex, zp, "%s.zero_point", x);
  npu_onnx_init_f32(ex->o, scale, tt->q.scale);
  if (wide) {
    const int16_t z = (int16_t)tt->q.zero_point;
    npu_onnx_init_copy(ex->o, zp, NPU_ONNX_INT16, 0, NULL, &z);
  } else {
    const int8_t z = (int8_t)tt->q.zero_point;
    npu_onnx_init_copy(ex->o, zp, NPU_ONNX_INT8, 0, NULL, &z);
  }
  fresh(ex, ex->val[t], "%s.q", x);
  node(ex, "QuantizeLinear", domain, 3, (const char *[]){x, scale, zp}, ex->val[t]);
  fresh(ex, ex->fval[t], "%s.dq", x);
  node(ex, "DequantizeLinear", domain, 3, (const char *[]){ex->val[t], scale, zp}, ex->fval[t]);
  ex->n_qdq++;
  npu_encodings_activation(&ex->enc, x, wide ? 16 : 8, tt->q.scale, tt->q.zero_point);
}

/* The name of the float result of the op that writes tensor 't'. */
static const char *result_name(struct exporter *ex, char buf[NAME], int32_t t) {
  return fresh(ex, buf, "%s", ex->g->tensors[t].name);
}

/* Tensor 't' is the float value 'x' (a float tensor), or its quantization (an integer one). */
static void set_result(struct exporter *ex, int32_t t, const char *x) {
  if (is_int(&ex->g->tensors[t])) {
    quantize_into(ex, t, x);
  } else {
    snprintf(ex->val[t], NAME, "%s", x);
    snprintf(ex->fval[t], NAME, "%s", x);
  }
}

static const char *in_f(struct exporter *ex, int32_t t);

/* Tensor 'out' is tensor 'in' (a copy, the one row of a decode step), or its float view. */
static void same_value(struct exporter *ex, int32_t out, int32_t in, bool float_view) {
  const char *f = in_f(ex, in);
  memcpy(ex->val[out], float_view ? f : ex->val[in], NAME);
  memcpy(ex->fval[out], f, NAME);
}

static const char *in_f(struct exporter *ex, int32_t t) {
  if (ex->fval[t][0] == '\0') {
    fail(ex, NPULM_ERR_FORMAT, "export: tensor '%s' is read before it is made",
         ex->g->tensors[t].name);
  }
  return ex->fval[t];
}

/* ---- Weights --------------------------------------------------------------------------------- */

static bool fill_weight(void *user, void *dst) {
  const struct weight_fill *f = user;
  if (f->site == NULL) {
    memcpy(dst, f->data, f->n * f->k * sizeof(float));
    return true;
  }
  const struct npu_qsite *s = f->site;
  int8_t *w = dst;
  if (s->op == NPU_OP_GATHER && s->table_site < 0) {
    memcpy(w, s->packed, f->n * f->k);
    return true;
  }
  uint8_t bscale[NPU_QS8_GEMM_MAX_K / NPU_QC4W_BLOCK];
  for (size_t r = 0; r < f->n; r++) {
    int8_t *row = w + r * f->k;
    if (s->w_bits == 8) {
      npu_qs8_gemm_unpack_row(f->k, s->packed, r, 0, f->k, row);
      continue;
    }
    npu_qc4w_gemm_unpack_row(f->k, s->w_block, s->packed, r, 0, f->k, row);
    if (s->w_block == 0) continue;
    /* LPBQ: the value times its block's integer scale (|q w| <= 15 * 8: an int8) */
    npu_qc4w_gemm_unpack_scales(f->k, s->packed, r, bscale);
    for (size_t c = 0; c < f->k; c++) row[c] = (int8_t)(row[c] * bscale[c / NPU_QC4W_BLOCK]);
  }
  return true;
}

/* The fill record of a new lazy initializer: 'fills' holds room for one per weight and per site
 * (what can have one), made before the translation, so that the records stay where the writer
 * was told they are. */
static struct weight_fill *new_fill(struct exporter *ex) {
  if (ex->n_fills == ex->cap_fills) {
    fail(ex, NPULM_ERR_FORMAT, "%s", "export: more weights than the program has");
    return NULL;
  }
  return &ex->fills[ex->n_fills++];
}

/* Float weight 'ref' as an initializer (made once): a matrix [ne1, ne0], or a vector [ne0]. */
static const char *float_weight(struct exporter *ex, int32_t ref, bool matrix) {
  const struct npu_weight *w = &ex->p->weights[ref];
  char *name = ex->float_made[ref];
  if (name[0] != '\0') return name;
  if (w->data == NULL) {
    fail(ex, NPULM_ERR_UNSUPPORTED,
         "the program holds no float copy of '%s', which its CPU reads: export from the GGUF "
         "model, or from a program compiled with --keep-float",
         w->name);
    return w->name;
  }
  struct weight_fill *f = new_fill(ex);
  if (f == NULL) return w->name;
  *f = (struct weight_fill){.data = w->data, .n = (size_t)w->ne1, .k = (size_t)w->ne0};
  const int64_t dims[2] = {w->ne1, w->ne0};
  fresh(ex, name, "%s", w->name);
  npu_onnx_init_lazy(ex->o, name, NPU_ONNX_FLOAT, matrix ? 2 : 1, matrix ? dims : dims + 1,
                     fill_weight, f);
  return name;
}

/* The per-row scales of site 's' (a matmul's output channels, a gather's table rows): the real
 * multiplier times scale_out / scale_in. A row of zeros has multiplier 0: its values are zero at
 * any scale, and it gets the largest of the others, as the vendors' tools divide by scales. */
static float *row_scales(struct exporter *ex, const struct npu_qsite *s, double in_scale,
                         double out_scale) {
  float *sc = malloc((size_t)s->n * sizeof(float));
  if (sc == NULL) {
    fail(ex, NPULM_ERR_NOMEM, "%s", "out of memory exporting the weights");
    return NULL;
  }
  float largest = 0.0f;
  for (int32_t r = 0; r < s->n; r++) {
    sc[r] = (float)(npu_multiplier_real(s->mult[r], s->shift[r]) * out_scale / in_scale);
    largest = sc[r] > largest ? sc[r] : largest;
  }
  for (int32_t r = 0; r < s->n; r++) sc[r] = sc[r] > 0.0f ? sc[r] : largest > 0.0f ? largest : 1.0f;
  return sc;
}

/* What a matmul site's multipliers divide by besides the weights' scales: the input's scale,
 * and for an int16 input the 2^acc_shift its sums are narrowed by first. */
static double multiplier_in_scale(const struct npu_qsite *s, const struct npu_ir_tensor *x) {
  return ldexp(x->q.scale, x->dtype == NPU_DT_I16 ? s->gemm16.acc_shift : 0);
}

/* The float view of the integer weights [n, k] of site 'si', read by node 'i' (a matmul, or a
 * gather of its own table), made once per site: an int8 initializer and DequantizeLinear per row
 * with the scales the site's multipliers give back, named by the weight ('wref'), with its
 * encodings: per channel, or for LPBQ per (channel, 32-k block) in channel-major order. */
static const char *site_weight(struct exporter *ex, int32_t si, int32_t i, int32_t wref) {
  char *out = ex->site_made[si];
  if (out[0] != '\0') return out;
  const struct npu_qsite *s = &ex->p->qsites[si];
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct npu_ir_tensor *x = &ex->g->tensors[n->in[0]], *y = &ex->g->tensors[n->out];
  float *scales =
      row_scales(ex, s, s->op == NPU_OP_MATMUL ? multiplier_in_scale(s, x) : 1.0, y->q.scale);
  struct weight_fill *f = new_fill(ex);
  int8_t *zeros = calloc((size_t)s->n, 1);
  if (scales == NULL || f == NULL || zeros == NULL) {
    fail(ex, NPULM_ERR_NOMEM, "%s", "out of memory exporting the weights");
  } else {
    const char *wname = ex->p->weights[wref].name;
    char wq[NAME], sc[NAME], zp[NAME];
    *f = (struct weight_fill){.site = s, .n = (size_t)s->n, .k = (size_t)s->k};
    npu_onnx_init_lazy(ex->o, fresh(ex, wq, "%s.q", wname), NPU_ONNX_INT8, 2,
                       (const int64_t[]){s->n, s->k}, fill_weight, f);
    fresh(ex, out, "%s", wname);
    fresh(ex, sc, "%s.scale", out);
    fresh(ex, zp, "%s.zero_point", out);
    const int64_t rows = s->n;
    npu_onnx_init_copy(ex->o, sc, NPU_ONNX_FLOAT, 1, &rows, scales);
    npu_onnx_init_copy(ex->o, zp, NPU_ONNX_INT8, 1, &rows, zeros);
    npu_onnx_attr_int(node(ex, "DequantizeLinear", NULL, 3, (const char *[]){wq, sc, zp}, out),
                      "axis", 0);
    ex->n_qdq++;
    const bool lpbq = s->op == NPU_OP_MATMUL && s->w_bits == 4 && s->w_block != 0;
    const int bits = s->op == NPU_OP_MATMUL ? s->w_bits : 8;
    uint8_t bscale[NPU_ENCODINGS_MAX_BLOCKS];
    const int32_t nb = (s->k + NPU_QC4W_BLOCK - 1) / NPU_QC4W_BLOCK;
    npu_encodings_param_begin(&ex->enc, out);
    for (int32_t r = 0; r < s->n && ok(ex); r++) {
      if (lpbq) npu_qc4w_gemm_unpack_scales((size_t)s->k, s->packed, (size_t)r, bscale);
      npu_encodings_param_channel(&ex->enc, bits, scales[r], bscale, lpbq ? nb : 0, NPU_QC4W_BLOCK);
    }
    npu_encodings_param_end(&ex->enc);
  }
  free(zeros);
  free(scales);
  return out;
}

/* ---- Ops ------------------------------------------------------------------------------------- */

static const struct npu_qsite *site_of(struct exporter *ex, int32_t i) {
  const int32_t si = ex->g->node_site != NULL ? ex->g->node_site[i] : -1;
  if (si < 0 || si >= ex->p->n_qsites) {
    fail(ex, NPULM_ERR_FORMAT, "export: NPU op %d has no integer data", (int)i);
    return NULL;
  }
  return &ex->p->qsites[si];
}

/* The index of the node whose integer data is site 'si', or -1. */
static int32_t node_of_site(const struct exporter *ex, int32_t si) {
  for (int32_t j = 0; j < ex->g->n_nodes; j++) {
    if (ex->g->node_site[j] == si) return j;
  }
  return -1;
}

static void op_gather(struct exporter *ex, int32_t i, bool integer) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const char *ids = "input_ids.flat";
  if (!npu_onnx_has_value(ex->o, ids)) {
    reshape(ex, "input_ids", 1, (const int64_t[]){ex->rows}, ids);
  }
  const int32_t wref = ex->g->tensors[n->in[1]].ref;
  const char *table = NULL;
  char out[NAME];
  if (!integer) {
    table = float_weight(ex, wref, true);
  } else {
    const struct npu_qsite *s = site_of(ex, i);
    if (s == NULL) return;
    if (s->table_site < 0) {
      table = site_weight(ex, ex->g->node_site[i], i, wref);
    } else {
      /* a tied embedding: the classifier's weights, one parameter for both (the gather's own
       * multipliers give the same row scales, to their rounding) */
      const int32_t j = node_of_site(ex, s->table_site);
      if (j < 0) {
        fail(ex, NPULM_ERR_FORMAT, "export: '%s' reads the weights of a matmul the graph lacks",
             ex->g->tensors[n->out].name);
        return;
      }
      table = site_weight(ex, s->table_site, j, ex->g->tensors[ex->g->nodes[j].in[1]].ref);
    }
  }
  npu_onnx_attr_int(
      node(ex, "Gather", NULL, 2, (const char *[]){table, ids}, result_name(ex, out, n->out)),
      "axis", 0);
  set_result(ex, n->out, out);
}

/* The int32 bias of matmul site 's' (x, y: its input and output) as an initializer in units of
 * scale_x * scale_w[r], and its float view 'out'. */
static const char *int_bias(struct exporter *ex, const struct npu_qsite *s,
                            const struct npu_ir_tensor *x, const struct npu_ir_tensor *y,
                            int32_t bref, char out[NAME]) {
  const char *bname = ex->p->weights[bref].name;
  int32_t *b = malloc((size_t)s->n * sizeof(int32_t));
  int32_t *zeros = calloc((size_t)s->n, sizeof(int32_t));
  float *bs =
      b != NULL && zeros != NULL ? row_scales(ex, s, multiplier_in_scale(s, x), y->q.scale) : NULL;
  if (bs == NULL) {
    fail(ex, NPULM_ERR_NOMEM, "%s", "out of memory exporting the weights");
  } else {
    for (int32_t r = 0; r < s->n; r++) {
      b[r] = s->w_bits == 8 ? npu_qs8_gemm_bias((size_t)s->k, s->packed, (size_t)r)
                            : npu_qc4w_gemm_bias((size_t)s->k, s->w_block, s->packed, (size_t)r);
      bs[r] = (float)(x->q.scale * (double)bs[r]);
    }
    const int64_t rows = s->n;
    char bq[NAME], bsc[NAME], bzp[NAME];
    npu_onnx_init_copy(ex->o, fresh(ex, bq, "%s.q", bname), NPU_ONNX_INT32, 1, &rows, b);
    fresh(ex, out, "%s", bname);
    npu_encodings_param_begin(&ex->enc, out);
    for (int32_t r = 0; r < s->n; r++) npu_encodings_param_channel(&ex->enc, 32, bs[r], NULL, 0, 0);
    npu_encodings_param_end(&ex->enc);
    npu_onnx_init_copy(ex->o, fresh(ex, bsc, "%s.scale", out), NPU_ONNX_FLOAT, 1, &rows, bs);
    npu_onnx_init_copy(ex->o, fresh(ex, bzp, "%s.zero_point", out), NPU_ONNX_INT32, 1, &rows,
                       zeros);
    npu_onnx_attr_int(node(ex, "DequantizeLinear", NULL, 3, (const char *[]){bq, bsc, bzp}, out),
                      "axis", 0);
    ex->n_qdq++;
  }
  free(b);
  free(bs);
  free(zeros);
  return out;
}

static void op_matmul(struct exporter *ex, int32_t i, bool integer) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct npu_ir_tensor *x = &ex->g->tensors[n->in[0]], *y = &ex->g->tensors[n->out];
  const int32_t wref = ex->g->tensors[n->in[1]].ref;
  const int32_t bref = n->in[2] >= 0 ? ex->g->tensors[n->in[2]].ref : -1;
  char bf[NAME], out[NAME];
  const char *w = NULL, *bias = NULL;
  if (!integer) {
    w = float_weight(ex, wref, true);
    if (bref >= 0) bias = float_weight(ex, bref, false);
  } else {
    const struct npu_qsite *s = site_of(ex, i);
    if (s == NULL) return;
    w = site_weight(ex, ex->g->node_site[i], i, wref);
    if (bref >= 0) bias = int_bias(ex, s, x, y, bref, bf);
  }
  const char *in[3] = {in_f(ex, n->in[0]), w, bias};
  struct npu_onnx_node *gemm =
      node(ex, "Gemm", NULL, bias != NULL ? 3 : 2, in, result_name(ex, out, n->out));
  npu_onnx_attr_int(gemm, "transB", 1);
  set_result(ex, n->out, out);
}

/* out = x / sqrt(mean(x^2) + eps) * gain, per row (opset 17 has no RMSNormalization). */
static void rmsnorm(struct exporter *ex, const char *x, const char *gain, float eps,
                    const char *out) {
  char sq[NAME], mean[NAME], var[NAME], root[NAME], normed[NAME], e[NAME];
  op2(ex, "Mul", x, x, fresh(ex, sq, "%s.sq", out));
  struct npu_onnx_node *rm =
      node(ex, "ReduceMean", NULL, 1, (const char *[]){sq}, fresh(ex, mean, "%s.mean", out));
  npu_onnx_attr_ints(rm, "axes", 1, (const int64_t[]){-1});
  npu_onnx_attr_int(rm, "keepdims", 1);
  op2(ex, "Add", mean, f32_const(ex, e, eps), fresh(ex, var, "%s.var", out));
  op1(ex, "Sqrt", var, fresh(ex, root, "%s.rms", out));
  op2(ex, "Div", x, root, fresh(ex, normed, "%s.normed", out));
  op2(ex, "Mul", normed, gain, out);
}

static void op_rmsnorm(struct exporter *ex, int32_t i, bool integer) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  char out[NAME], gname[NAME];
  result_name(ex, out, n->out);
  if (!integer) {
    rmsnorm(ex, in_f(ex, n->in[0]), float_weight(ex, ex->g->tensors[n->in[1]].ref, false), n->param,
            out);
  } else {
    /* gain and eps back from the integer form (qparams.c npu_rmsnorm_params_make):
     * mult[c] 2^(shift - 31) = gain[c] sqrt(cols) / scale_y, eps_int = cols eps / scale_x^2 */
    const struct npu_qsite *s = site_of(ex, i);
    if (s == NULL) return;
    const struct npu_ir_tensor *x = &ex->g->tensors[n->in[0]], *y = &ex->g->tensors[n->out];
    const double root = sqrt((double)s->n);
    float *gain = malloc((size_t)s->n * sizeof(float));
    if (gain == NULL) {
      fail(ex, NPULM_ERR_NOMEM, "%s", "out of memory exporting a norm");
      return;
    }
    for (int32_t c = 0; c < s->n; c++) {
      gain[c] = (float)(npu_multiplier_real(s->mult[c], s->rmsnorm.shift) * y->q.scale / root);
    }
    const double eps = (double)s->rmsnorm.eps * x->q.scale * x->q.scale / s->n;
    const int64_t nn = s->n;
    npu_onnx_init_copy(ex->o, fresh(ex, gname, "%s.gain", out), NPU_ONNX_FLOAT, 1, &nn, gain);
    free(gain);
    rmsnorm(ex, in_f(ex, n->in[0]), gname, (float)eps, out);
  }
  set_result(ex, n->out, out);
}

/* The rotation of row t at position_ids[t]: cos and sin [C, 1, half, 1] (norm: adjacent pairs)
 * or [C, 1, 1, half] (neox), gathered from tables of the bucket's K positions made as npulm makes
 * its own. */
static void rope_rows(struct exporter *ex, const char *names[2]) {
  static const char *const tab[2] = {"rope.cos", "rope.sin"}, *const rows[2] = {"rope.cos_rows",
                                                                                "rope.sin_rows"};
  names[0] = rows[0];
  names[1] = rows[1];
  if (npu_onnx_has_value(ex->o, rows[0])) return;
  const struct npu_config *c = &ex->m->cfg;
  const int32_t half = c->rope_dim / 2;
  float *cs = malloc((size_t)ex->ctx * (size_t)half * 2 * sizeof(float));
  if (cs == NULL) {
    fail(ex, NPULM_ERR_NOMEM, "%s", "out of memory making the RoPE tables");
    return;
  }
  npu_f32_rope_table(cs, cs + (size_t)ex->ctx * half, ex->ctx, c, ex->m->w.rope_freqs);
  const char *pos = "position_ids.flat";
  reshape(ex, "position_ids", 1, (const int64_t[]){ex->rows}, pos);
  const bool norm = c->rope_type == NPU_ROPE_NORM;
  for (int k = 0; k < 2; k++) {
    npu_onnx_init_copy(ex->o, tab[k], NPU_ONNX_FLOAT, 2, (const int64_t[]){ex->ctx, half},
                       cs + (size_t)k * ex->ctx * half);
    char picked[NAME];
    npu_onnx_attr_int(node(ex, "Gather", NULL, 2, (const char *[]){tab[k], pos},
                           fresh(ex, picked, "%s.picked", rows[k])),
                      "axis", 0);
    const int64_t shape[4] = {ex->rows, 1, norm ? half : 1, norm ? 1 : half};
    reshape(ex, picked, 4, shape, rows[k]);
  }
  free(cs);
}

static void op_rope(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct npu_config *c = &ex->m->cfg;
  const int32_t hd = c->head_dim, half = c->rope_dim / 2;
  const int32_t heads = ex->g->tensors[n->out].ne[1] / hd;
  const bool norm = c->rope_type == NPU_ROPE_NORM;
  const char *cs[2];
  rope_rows(ex, cs);
  char out[NAME], x4[NAME], a[NAME], b[NAME], ac[NAME], bs[NAME], as[NAME], bc[NAME], ya[NAME],
      yb[NAME], y4[NAME];
  result_name(ex, out, n->out);
  /* the pairs (a, b) of each head: a_i = x[2i], b_i = x[2i + 1] (norm) or x[i], x[i + half] */
  const int64_t shape[4] = {ex->rows, heads, norm ? half : 2, norm ? 2 : half};
  reshape(ex, in_f(ex, n->in[0]), 4, shape, fresh(ex, x4, "%s.pairs", out));
  const char *halves[2] = {fresh(ex, a, "%s.a", out), fresh(ex, b, "%s.b", out)};
  struct npu_onnx_node *split =
      npu_onnx_node(ex->o, "Split", NULL, NULL, 1, (const char *[]){x4}, 2, halves);
  ex->n_nodes++;
  npu_onnx_attr_int(split, "axis", norm ? 3 : 2);
  /* a' = a cos - b sin, b' = a sin + b cos: the reference's products and one sum each */
  op2(ex, "Mul", a, cs[0], fresh(ex, ac, "%s.a_cos", out));
  op2(ex, "Mul", b, cs[1], fresh(ex, bs, "%s.b_sin", out));
  op2(ex, "Mul", a, cs[1], fresh(ex, as, "%s.a_sin", out));
  op2(ex, "Mul", b, cs[0], fresh(ex, bc, "%s.b_cos", out));
  op2(ex, "Sub", ac, bs, fresh(ex, ya, "%s.a_rot", out));
  op2(ex, "Add", as, bc, fresh(ex, yb, "%s.b_rot", out));
  npu_onnx_attr_int(
      node(ex, "Concat", NULL, 2, (const char *[]){ya, yb}, fresh(ex, y4, "%s.rot", out)), "axis",
      norm ? 3 : 2);
  reshape(ex, y4, 2, (const int64_t[]){ex->rows, (int64_t)heads * hd}, out);
  set_result(ex, n->out, out);
}

/* The step's rows of layer L's K or V cache are an output (present_*), and with the past slots
 * before them the cache the step attends. */
static void op_kv_write(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct npu_ir_tensor *kv = &ex->g->tensors[n->out];
  const int32_t layer = kv->ref, v = kv->kv_is_value ? 1 : 0, cols = kv->ne[1];
  char present[NAME], all[NAME], past[NAME];
  snprintf(present, NAME, "present_%s_%d", v ? "value" : "key", (int)layer);
  snprintf(past, NAME, "past_%s_%d", v ? "value" : "key", (int)layer);
  reshape(ex, in_f(ex, n->in[0]), 3, (const int64_t[]){1, ex->rows, cols}, present);
  snprintf(ex->cache[layer][v], NAME, "blk.%d.%s_cache", (int)layer, v ? "v" : "k");
  if (ex->past == 0) {
    reshape(ex, present, 2, (const int64_t[]){ex->ctx, cols}, ex->cache[layer][v]);
  } else {
    npu_onnx_attr_int(node(ex, "Concat", NULL, 2, (const char *[]){past, present},
                           fresh(ex, all, "%s.all", ex->cache[layer][v])),
                      "axis", 1);
    reshape(ex, all, 2, (const int64_t[]){ex->ctx, cols}, ex->cache[layer][v]);
  }
}

/* Attention's shape: query head h of 'heads' reads K/V head h / grp of 'kvh'. */
struct attn_shape {
  int64_t hd, heads, kvh, grp;
};

static struct attn_shape attn_shape_of(const struct exporter *ex, int32_t q_cols, int32_t kv_cols) {
  const int64_t hd = ex->m->cfg.head_dim;
  return (struct attn_shape){hd, q_cols / hd, kv_cols / hd, (q_cols / hd) / (kv_cols / hd)};
}

/* The additive mask [C, K] (attention_mask without its leading ones). */
static const char *mask_rows(struct exporter *ex) {
  const char *mask = "attention_mask.rows";
  if (!npu_onnx_has_value(ex->o, mask)) {
    reshape(ex, "attention_mask", 2, (const int64_t[]){ex->rows, ex->ctx}, mask);
  }
  return mask;
}

/* 'out' = q k^T * scale [kvh, grp, C, K]: q [C, heads * hd], k [K, kvh * hd] (float views). */
static void attn_scores(struct exporter *ex, const struct attn_shape *a, const char *q,
                        const char *k, float scale, const char *out) {
  const int64_t C = ex->rows, K = ex->ctx;
  char q4[NAME], qh[NAME], k3[NAME], kt[NAME], k4[NAME], s[NAME], sc[NAME];
  reshape(ex, q, 4, (const int64_t[]){C, a->kvh, a->grp, a->hd}, fresh(ex, q4, "%s.query", out));
  transpose(ex, q4, 4, (const int64_t[]){1, 2, 0, 3}, fresh(ex, qh, "%s.q_heads", out));
  reshape(ex, k, 3, (const int64_t[]){K, a->kvh, a->hd}, fresh(ex, k3, "%s.k", out));
  transpose(ex, k3, 3, (const int64_t[]){1, 2, 0}, fresh(ex, kt, "%s.k_t", out));
  unsqueeze(ex, kt, 1, (const int64_t[]){1}, fresh(ex, k4, "%s.k_heads", out));
  op2(ex, "MatMul", qh, k4, fresh(ex, s, "%s.dots", out));
  op2(ex, "Mul", s, f32_const(ex, sc, scale), out);
}

/* 'out' = softmax(scores + mask) over the last axis (scores [..., C, K]). */
static void attn_softmax(struct exporter *ex, const char *scores, const char *out) {
  char masked[NAME];
  op2(ex, "Add", scores, mask_rows(ex), fresh(ex, masked, "%s.masked", out));
  npu_onnx_attr_int(node(ex, "Softmax", NULL, 1, (const char *[]){masked}, out), "axis", -1);
}

/* 'out' [C, heads * hd] = probs v: probs [kvh, grp, C, K], v [K, kvh * hd] (float views). */
static void attn_values(struct exporter *ex, const struct attn_shape *a, const char *probs,
                        const char *v, const char *out) {
  const int64_t C = ex->rows, K = ex->ctx;
  char v3[NAME], vt[NAME], v4[NAME], o4[NAME], ot[NAME];
  reshape(ex, v, 3, (const int64_t[]){K, a->kvh, a->hd}, fresh(ex, v3, "%s.v", out));
  transpose(ex, v3, 3, (const int64_t[]){1, 0, 2}, fresh(ex, vt, "%s.v_t", out));
  unsqueeze(ex, vt, 1, (const int64_t[]){1}, fresh(ex, v4, "%s.v_heads", out));
  op2(ex, "MatMul", probs, v4, fresh(ex, o4, "%s.heads", out));
  transpose(ex, o4, 4, (const int64_t[]){2, 0, 1, 3}, fresh(ex, ot, "%s.rows", out));
  reshape(ex, ot, 2, (const int64_t[]){C, a->heads * a->hd}, out);
}

/* The float cache [K, kv_dim] that KV tensor 't' holds, made by the step's cache writes. */
static const char *cache_of(struct exporter *ex, int32_t t) {
  const struct npu_ir_tensor *kv = &ex->g->tensors[t];
  const char *c = ex->cache[kv->ref][kv->kv_is_value ? 1 : 0];
  if (c[0] == '\0') {
    fail(ex, NPULM_ERR_FORMAT, "export: layer %d's cache is read before its write", (int)kv->ref);
  }
  return c;
}

/* Fused float attention: softmax(q k^T * scale + mask) v over the bucket's K columns. */
static void op_attn(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct attn_shape a =
      attn_shape_of(ex, ex->g->tensors[n->in[0]].ne[1], ex->g->tensors[n->in[1]].ne[1]);
  const char *kc = cache_of(ex, n->in[1]), *vc = cache_of(ex, n->in[2]);
  char out[NAME], s[NAME], pr[NAME];
  result_name(ex, out, n->out);
  attn_scores(ex, &a, in_f(ex, n->in[0]), kc, n->param, fresh(ex, s, "%s.scores", out));
  attn_softmax(ex, s, fresh(ex, pr, "%s.probs", out));
  attn_values(ex, &a, pr, vc, out);
  set_result(ex, n->out, out);
}

/* Attention as the NPU runs it, three ops (the precision policy lets them off the CPU): scores
 * [heads, C, K] from q and the K cache's copy (both quantized), the softmax of the scores that the
 * mask leaves (npulm's QK writes its own mask value where ONNX adds the mask in the softmax), the
 * probabilities' product with the V cache's copy. */
static void op_attn_part(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  char out[NAME], tmp[NAME];
  result_name(ex, out, n->out);
  if (n->op == NPU_OP_QK) {
    const struct attn_shape a =
        attn_shape_of(ex, ex->g->tensors[n->in[0]].ne[1], ex->g->tensors[n->in[1]].ne[1]);
    attn_scores(ex, &a, in_f(ex, n->in[0]), in_f(ex, n->in[1]), n->param,
                fresh(ex, tmp, "%s.grouped", out));
    reshape(ex, tmp, 3, (const int64_t[]){a.heads, ex->rows, ex->ctx}, out);
  } else if (n->op == NPU_OP_SOFTMAX) {
    attn_softmax(ex, in_f(ex, n->in[0]), out);
  } else { /* PV */
    const int32_t heads = ex->g->tensors[n->in[0]].ne[0];
    const struct attn_shape a =
        attn_shape_of(ex, heads * ex->m->cfg.head_dim, ex->g->tensors[n->in[1]].ne[1]);
    reshape(ex, in_f(ex, n->in[0]), 4, (const int64_t[]){a.kvh, a.grp, ex->rows, ex->ctx},
            fresh(ex, tmp, "%s.grouped", out));
    attn_values(ex, &a, tmp, in_f(ex, n->in[1]), out);
  }
  set_result(ex, n->out, out);
}

/* A float initializer copied from 'data' (shape 'dims'), named 'base' + 'suffix' made fresh. */
static const char *float_const(struct exporter *ex, char buf[NAME], const char *base,
                               const char *suffix, int nd, const int64_t *dims, const float *data) {
  npu_onnx_init_copy(ex->o, fresh(ex, buf, "%s%s", base, suffix), NPU_ONNX_FLOAT, nd, dims, data);
  return buf;
}

/* Shadow outlier execution's CPU share of a matmul (w8a8-shadow, exec.c's shadow()): the outlier
 * input channels of the float input, or for the FFN product silu(gate) * up recomputed for those
 * channels from the FFN norm's output, times their float weights [N, n_outliers]. The NPU's
 * matmul holds zeros in those channels; an ADD joins the two. */
static void op_shadow(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct npu_qsite *s = site_of(ex, i);
  if (s == NULL) return;
  char out[NAME], idx[NAME], v[NAME], g[NAME], u[NAME], sg[NAME], gs[NAME], w[NAME], wg[NAME],
      wu[NAME];
  result_name(ex, out, n->out);
  const char *x = in_f(ex, n->in[0]);
  const int64_t k = s->n_outliers;
  if (s->outlier_gate == NULL) {
    int64_t *channels = malloc((size_t)k * sizeof(int64_t));
    if (channels == NULL) {
      fail(ex, NPULM_ERR_NOMEM, "%s", "out of memory exporting a shadow");
      return;
    }
    for (int64_t c = 0; c < k; c++) channels[c] = s->outliers[c];
    npu_onnx_init_copy(ex->o, fresh(ex, idx, "%s.channels", out), NPU_ONNX_INT64, 1, &k, channels);
    free(channels);
    npu_onnx_attr_int(
        node(ex, "Gather", NULL, 2, (const char *[]){x, idx}, fresh(ex, v, "%s.inputs", out)),
        "axis", 1);
  } else {
    const int64_t dims[2] = {k, s->outlier_dim};
    float_const(ex, wg, out, ".gate_rows", 2, dims, s->outlier_gate);
    float_const(ex, wu, out, ".up_rows", 2, dims, s->outlier_up);
    npu_onnx_attr_int(
        node(ex, "Gemm", NULL, 2, (const char *[]){x, wg}, fresh(ex, g, "%s.gate", out)), "transB",
        1);
    npu_onnx_attr_int(
        node(ex, "Gemm", NULL, 2, (const char *[]){x, wu}, fresh(ex, u, "%s.up", out)), "transB",
        1);
    op1(ex, "Sigmoid", g, fresh(ex, sg, "%s.sigmoid", out));
    op2(ex, "Mul", g, sg, fresh(ex, gs, "%s.silu", out));
    op2(ex, "Mul", gs, u, fresh(ex, v, "%s.inputs", out));
  }
  float_const(ex, w, out, ".weights", 2, (const int64_t[]){s->n, k}, s->outlier_w);
  npu_onnx_attr_int(node(ex, "Gemm", NULL, 2, (const char *[]){v, w}, out), "transB", 1);
  set_result(ex, n->out, out);
}

static void op_elementwise(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  char out[NAME], sig[NAME];
  result_name(ex, out, n->out);
  if (n->op == NPU_OP_SILU) {
    const char *x = in_f(ex, n->in[0]);
    op1(ex, "Sigmoid", x, fresh(ex, sig, "%s.sigmoid", out));
    op2(ex, "Mul", x, sig, out);
  } else {
    op2(ex, n->op == NPU_OP_ADD ? "Add" : "Mul", in_f(ex, n->in[0]), in_f(ex, n->in[1]), out);
  }
  set_result(ex, n->out, out);
}

/* A copy to the other arena: the same value (same dtype), its float view (integer to float), or
 * its quantization (float to integer). */
static void op_transfer(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const struct npu_ir_tensor *a = &ex->g->tensors[n->in[0]], *out = &ex->g->tensors[n->out];
  if (a->kind == NPU_TK_KV) { /* the NPU's int8 copy of a cache, for its attention ops */
    const char *cache = cache_of(ex, n->in[0]);
    if (ok(ex)) quantize_into(ex, n->out, cache);
    return;
  }
  if (!is_int(out) || a->dtype == out->dtype) {
    same_value(ex, n->out, n->in[0], a->dtype != out->dtype);
  } else {
    quantize_into(ex, n->out, in_f(ex, n->in[0]));
  }
}

static void translate(struct exporter *ex, int32_t i) {
  const struct npu_ir_node *n = &ex->g->nodes[i];
  const bool integer = !npu_node_reads_float(ex->p, n);
  switch ((enum npu_op)n->op) {
  case NPU_OP_GATHER: op_gather(ex, i, integer); return;
  case NPU_OP_RMSNORM: op_rmsnorm(ex, i, integer); return;
  case NPU_OP_MATMUL: op_matmul(ex, i, integer); return;
  case NPU_OP_ROPE: op_rope(ex, i); return;
  case NPU_OP_KV_WRITE: op_kv_write(ex, i); return;
  case NPU_OP_ATTN: op_attn(ex, i); return;
  case NPU_OP_ADD:
  case NPU_OP_MUL:
  case NPU_OP_SILU: op_elementwise(ex, i); return;
  case NPU_OP_TRANSFER: op_transfer(ex, i); return;
  case NPU_OP_LAST_ROW:
    if (ex->rows == 1) { /* the one row */
      same_value(ex, n->out, n->in[0], false);
      return;
    }
    break;
  case NPU_OP_SHADOW: op_shadow(ex, i); return;
  case NPU_OP_QK:
  case NPU_OP_SOFTMAX:
  case NPU_OP_PV: op_attn_part(ex, i); return;
  default: break;
  }
  fail(ex, NPULM_ERR_UNSUPPORTED, "op %s of '%s' has no ONNX form here",
       npu_op_name((enum npu_op)n->op), ex->g->tensors[n->out].name);
}

/* ---- The model ----------------------------------------------------------------------------- */

static void declare_io(struct exporter *ex) {
  const struct npu_config *c = &ex->m->cfg;
  const int64_t kvd = (int64_t)c->n_kv_heads * c->head_dim;
  npu_onnx_input(ex->o, "input_ids", NPU_ONNX_INT32, 2, (const int64_t[]){1, ex->rows});
  npu_onnx_input(ex->o, "position_ids", NPU_ONNX_INT32, 2, (const int64_t[]){1, ex->rows});
  npu_onnx_input(ex->o, "attention_mask", NPU_ONNX_FLOAT, 4,
                 (const int64_t[]){1, 1, ex->rows, ex->ctx});
  char name[NAME];
  for (int32_t l = 0; l < c->n_layers && ex->past > 0; l++) {
    for (int v = 0; v < 2; v++) {
      snprintf(name, NAME, "past_%s_%d", v ? "value" : "key", (int)l);
      npu_onnx_input(ex->o, name, NPU_ONNX_FLOAT, 3, (const int64_t[]){1, ex->past, kvd});
    }
  }
  npu_onnx_output(ex->o, "logits", NPU_ONNX_FLOAT, 3,
                  (const int64_t[]){1, npu_graph_logit_rows(ex->g), c->n_vocab});
  for (int32_t l = 0; l < c->n_layers; l++) {
    for (int v = 0; v < 2; v++) {
      snprintf(name, NAME, "present_%s_%d", v ? "value" : "key", (int)l);
      npu_onnx_output(ex->o, name, NPU_ONNX_FLOAT, 3, (const int64_t[]){1, ex->rows, kvd});
    }
  }
}

static void translate_graph(struct exporter *ex) {
  const struct npu_graph *g = ex->g;
  declare_io(ex);
  for (int32_t i = 0; i < g->n_nodes && ok(ex); i++) translate(ex, i);
  for (int32_t t = 0; t < g->n_tensors && ok(ex); t++) {
    if (g->tensors[t].kind != NPU_TK_LOGITS) continue;
    reshape(ex, in_f(ex, t), 3, (const int64_t[]){1, npu_graph_logit_rows(g), ex->m->cfg.n_vocab},
            "logits");
    return;
  }
  fail(ex, NPULM_ERR_FORMAT, "%s", "export: the graph has no logits");
}

/* The graph of 'rows' rows at context 'ctx' that computes every row's logits, or NULL. */
static const struct npu_graph *find_graph(const struct npu_program *p, int32_t rows, int32_t ctx) {
  for (int32_t i = 0; i < p->n_graphs; i++) {
    const struct npu_graph *g = &p->graphs[i];
    if (g->rows == rows && g->ctx == ctx && npu_graph_logit_rows(g) == rows) return g;
  }
  return NULL;
}

/* "decode, prefill:16, prefill:64 at contexts 128, 256" */
static void describe_specializations(const struct npu_program *p, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "decode");
  for (int32_t c = 0; c < p->opts.n_chunks && at < cap; c++) {
    at += (size_t)snprintf(buf + at, cap - at, ", prefill:%d", (int)p->opts.chunks[c]);
  }
  for (int32_t b = 0; b < p->opts.n_buckets && at < cap; b++) {
    at += (size_t)snprintf(buf + at, cap - at, "%s%d", b == 0 ? " at contexts " : ", ",
                           (int)p->opts.buckets[b]);
  }
}

/* Finish the encodings file with the quantizer's arguments and put it in place; the model names
 * its digest (metadata npulm.encodings_xxh3_64), so that the two are known to be a pair. */
static npulm_status commit_encodings(struct exporter *ex, npulm_error *err) {
  const enum npu_quant_mode mode = (enum npu_quant_mode)ex->p->quant_mode;
  char args[256];
  snprintf(args, sizeof(args),
           "{\"activation_bitwidth\": %d, \"param_bitwidth\": %d, \"dtype\": \"%s\", "
           "\"per_channel_quantization\": \"True\", \"npulm_quant\": \"%s\"}",
           mode ? npu_quant_act_bits(mode) : 32, mode ? npu_quant_weight_bits(mode) : 32,
           mode ? "int" : "float", npu_quant_mode_name(mode));
  uint64_t digest = 0;
  const npulm_status st = npu_encodings_commit(&ex->enc, args, &digest, err);
  if (st == NPULM_OK) {
    char hex[17];
    snprintf(hex, sizeof(hex), "%016" PRIx64, digest);
    npu_onnx_metadata(ex->o, "npulm.encodings_xxh3_64", hex);
  }
  return st;
}

npulm_export_params npulm_export_default_params(void) { return (npulm_export_params){.rows = 1}; }

void npulm_export_encodings_path(const char *onnx_path, char *buf, size_t cap) {
  size_t len = strlen(onnx_path);
  if (len >= 5 && strcmp(onnx_path + len - 5, ".onnx") == 0) len -= 5;
  snprintf(buf, cap, "%.*s.encodings.json", (int)len, onnx_path);
}

void npulm_export_data_path(const char *onnx_path, char *buf, size_t cap) {
  snprintf(buf, cap, "%s.data", onnx_path); /* as npu_onnx_write names it */
}

npulm_status npulm_model_export_onnx(const npulm_model *model, const char *path,
                                     const npulm_export_params *params, npulm_export_info *info_out,
                                     npulm_error *err) {
  const npulm_export_params defaults = npulm_export_default_params();
  if (params == NULL) params = &defaults;
  if (model == NULL || path == NULL) {
    return npu_fail(err, NPULM_ERR_ARG, "%s", "export: no model or no path");
  }
  const struct npu_program *p = model->program;
  if (p == NULL) {
    return npu_fail(err, NPULM_ERR_ARG, "%s", "export: the model has no program: compile it first");
  }
  const int32_t rows = params->rows > 0 ? params->rows : 1;
  const int32_t ctx = params->ctx > 0 ? params->ctx : p->opts.buckets[p->opts.n_buckets - 1];
  const struct npu_graph *g = find_graph(p, rows, ctx);
  if (g == NULL) {
    char have[512];
    describe_specializations(p, have, sizeof(have));
    char want[32];
    if (rows == 1) snprintf(want, sizeof(want), "decode");
    else snprintf(want, sizeof(want), "prefill:%d", (int)rows);
    return npu_fail(err, NPULM_ERR_ARG, "the program has no %s graph at context %d (it has %s)",
                    want, (int)ctx, have);
  }
  if (model->cfg.rope_dim != model->cfg.head_dim) {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "RoPE over %d of each head's %d dimensions has no ONNX form here",
                    model->cfg.rope_dim, model->cfg.head_dim);
  }
  char enc_path[4096];
  if (strlen(path) + sizeof(".encodings.json") > sizeof(enc_path)) {
    return npu_fail(err, NPULM_ERR_ARG, "export: the path '%.64s...' is too long", path);
  }
  npulm_export_encodings_path(path, enc_path, sizeof(enc_path));
  /* none of the files written may take the place of the one the model is read from */
  char data_path[4096];
  npulm_export_data_path(path, data_path, sizeof(data_path));
  const char *const outputs[] = {path, enc_path, data_path};
  for (size_t i = 0; i < sizeof(outputs) / sizeof(outputs[0]); i++) {
    if (npu_gguf_is_file(model->gguf, outputs[i])) {
      return npu_fail(err, NPULM_ERR_ARG,
                      "'%s' is the model's own file: write the output to another path", outputs[i]);
    }
    const npulm_status st = npu_afile_check_target(outputs[i], NULL, err);
    if (st != NPULM_OK) return st;
  }
  struct exporter ex = {.m = model, .p = p, .g = g, .rows = rows, .ctx = ctx, .past = ctx - rows};
  ex.cap_fills = p->n_weights + p->n_qsites;
  ex.fills = calloc((size_t)ex.cap_fills + 1, sizeof(*ex.fills));
  ex.float_made = calloc((size_t)p->n_weights + 1, sizeof(*ex.float_made));
  ex.site_made = calloc((size_t)p->n_qsites + 1, sizeof(*ex.site_made));
  ex.o = npu_onnx_new("npulm", OPSET);
  ex.val = calloc((size_t)g->n_tensors, sizeof(*ex.val));
  ex.fval = calloc((size_t)g->n_tensors, sizeof(*ex.fval));
  ex.cache = calloc((size_t)model->cfg.n_layers, sizeof(*ex.cache));
  npulm_status st = NPULM_OK;
  if (ex.o == NULL || ex.val == NULL || ex.fval == NULL || ex.cache == NULL || ex.fills == NULL ||
      ex.float_made == NULL || ex.site_made == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "%s", "out of memory starting the export");
  } else if ((st = npu_encodings_open(&ex.enc, enc_path, err)) == NPULM_OK) {
    char spec[64];
    if (rows == 1) snprintf(spec, sizeof(spec), "decode");
    else snprintf(spec, sizeof(spec), "prefill:%d", (int)rows);
    char ctx_s[16];
    snprintf(ctx_s, sizeof(ctx_s), "%d", (int)ctx);
    npu_onnx_metadata(ex.o, "npulm.specialization", spec);
    npu_onnx_metadata(ex.o, "npulm.context", ctx_s);
    npu_onnx_metadata(ex.o, "npulm.quant", npu_quant_mode_name((enum npu_quant_mode)p->quant_mode));
    npu_onnx_metadata(ex.o, "npulm.model", model->cfg.name);
    translate_graph(&ex);
    if (ex.st != NPULM_OK || ex.enc.status != NPULM_OK) {
      st = ex.st != NPULM_OK ? ex.st : ex.enc.status;
      if (err != NULL) *err = ex.st != NPULM_OK ? ex.err : ex.enc.err;
      npu_encodings_abort(&ex.enc);
    } else {
      const struct npu_onnx_write_options wo = {.external = params->external_data,
                                                .progress = params->progress,
                                                .progress_user = params->progress_user,
                                                .checksum_key = "npulm.initializers_xxh3_64"};
      bool external = false;
      /* the encodings first: they go if the model cannot be written, so that no half of a pair
       * is left */
      st = commit_encodings(&ex, err);
      if (st == NPULM_OK) {
        st = npu_onnx_write(ex.o, path, &wo, &external, err);
        if (st != NPULM_OK) unlink(enc_path);
      }
      if (st == NPULM_OK && info_out != NULL) {
        *info_out = (npulm_export_info){.rows = rows,
                                        .ctx = ctx,
                                        .n_nodes = ex.n_nodes,
                                        .n_qdq = ex.n_qdq,
                                        .external_data = external};
        snprintf(info_out->encodings_path, sizeof(info_out->encodings_path), "%s", enc_path);
      }
    }
  }
  free(ex.val);
  free(ex.fval);
  free(ex.cache);
  free(ex.fills);
  free(ex.float_made);
  free(ex.site_made);
  npu_onnx_free(ex.o);
  return st;
}
