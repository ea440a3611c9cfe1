/* Model loading: configuration from GGUF metadata, weight views checked against the expected
 * shapes, tokenizer; and the model's information and tokenizer in the public API. (Opening a file,
 * which may be a program file, is the pipeline layer's: src/pipeline/open.c.) */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/pages.h"

/* Read '{arch}.{suffix}' as a positive int no larger than 'max'. */
static npulm_status arch_int(const struct npu_gguf *g, const char *arch, const char *suffix,
                             int max, int *out, npulm_error *err) {
  char key[128];
  uint32_t v;
  snprintf(key, sizeof(key), "%s.%s", arch, suffix);
  npulm_status st = npu_gguf_get_u32(g, key, &v, err);
  if (st != NPULM_OK) return st;
  if (v == 0 || v > (uint32_t)max) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' = %u is out of range (1..%d)", key, v,
                    max);
  }
  *out = (int)v;
  return NPULM_OK;
}

static bool has_arch_key(const struct npu_gguf *g, const char *arch, const char *suffix) {
  char key[128];
  snprintf(key, sizeof(key), "%s.%s", arch, suffix);
  return npu_gguf_find(g, key) != NULL;
}

static npulm_status arch_float(const struct npu_gguf *g, const char *arch, const char *suffix,
                               float *out, npulm_error *err) {
  char key[128];
  snprintf(key, sizeof(key), "%s.%s", arch, suffix);
  npulm_status st = npu_gguf_get_f32(g, key, out, err);
  if (st == NPULM_OK && !(*out > 0)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' must be positive", key);
  }
  return st;
}

/* general.name into cfg->name (left as is when absent). */
static void read_name(const struct npu_gguf *g, struct npu_config *cfg) {
  struct npu_gguf_str s;
  if (npu_gguf_get_str(g, "general.name", &s, NULL) == NPULM_OK) {
    snprintf(cfg->name, sizeof(cfg->name), "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
  }
}

npulm_status npu_config_read(const struct npu_gguf *g, struct npu_config *cfg, npulm_error *err) {
  memset(cfg, 0, sizeof(*cfg));
  struct npu_gguf_str s;
  npulm_status st = npu_gguf_get_str(g, "general.architecture", &s, err);
  if (st != NPULM_OK) return st;
  const char *arch;
  if (npu_gguf_str_eq(s, "llama")) {
    arch = "llama";
    cfg->arch = NPU_ARCH_LLAMA;
    cfg->rope_type = NPU_ROPE_NORM;
  } else if (npu_gguf_str_eq(s, "qwen2")) {
    arch = "qwen2";
    cfg->arch = NPU_ARCH_QWEN2;
    cfg->rope_type = NPU_ROPE_NEOX;
    cfg->has_qkv_bias = true;
  } else {
    return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                    "architecture '%.*s' is not supported (llama and qwen2 are)",
                    (int)(s.len < 64 ? s.len : 64), s.ptr);
  }
  read_name(g, cfg);
  enum { MAX_WIDTH = 1 << 17, MAX_LAYERS = 1024, MAX_HEADS = 1024, MAX_CTX = 1 << 24 };
  if ((st = arch_int(g, arch, "embedding_length", MAX_WIDTH, &cfg->dim, err)) ||
      (st = arch_int(g, arch, "block_count", MAX_LAYERS, &cfg->n_layers, err)) ||
      (st = arch_int(g, arch, "feed_forward_length", MAX_WIDTH * 8, &cfg->ffn_dim, err)) ||
      (st = arch_int(g, arch, "attention.head_count", MAX_HEADS, &cfg->n_heads, err)) ||
      (st = arch_int(g, arch, "context_length", MAX_CTX, &cfg->n_ctx_train, err)) ||
      (st = arch_float(g, arch, "attention.layer_norm_rms_epsilon", &cfg->rms_eps, err))) {
    return st;
  }
  cfg->n_kv_heads = cfg->n_heads;
  if (has_arch_key(g, arch, "attention.head_count_kv") &&
      (st = arch_int(g, arch, "attention.head_count_kv", MAX_HEADS, &cfg->n_kv_heads, err))) {
    return st;
  }
  if (cfg->n_heads % cfg->n_kv_heads != 0) {
    return npu_fail(err, NPULM_ERR_FORMAT, "%d attention heads cannot share %d KV heads",
                    cfg->n_heads, cfg->n_kv_heads);
  }
  cfg->head_dim = cfg->dim / cfg->n_heads;
  if (has_arch_key(g, arch, "attention.key_length") &&
      (st = arch_int(g, arch, "attention.key_length", MAX_WIDTH, &cfg->head_dim, err))) {
    return st;
  }
  if (cfg->head_dim * cfg->n_heads != cfg->dim && !has_arch_key(g, arch, "attention.key_length")) {
    return npu_fail(err, NPULM_ERR_FORMAT, "embedding width %d is not a multiple of %d heads",
                    cfg->dim, cfg->n_heads);
  }
  cfg->rope_dim = cfg->head_dim;
  if (has_arch_key(g, arch, "rope.dimension_count") &&
      (st = arch_int(g, arch, "rope.dimension_count", cfg->head_dim, &cfg->rope_dim, err))) {
    return st;
  }
  if (cfg->rope_dim % 2 != 0 || cfg->head_dim % 2 != 0) {
    return npu_fail(err, NPULM_ERR_FORMAT, "RoPE needs even head dimensions (head %d, rope %d)",
                    cfg->head_dim, cfg->rope_dim);
  }
  cfg->rope_base = 10000.0f;
  if (has_arch_key(g, arch, "rope.freq_base") &&
      (st = arch_float(g, arch, "rope.freq_base", &cfg->rope_base, err))) {
    return st;
  }
  return NPULM_OK;
}

npulm_status npu_config_check_weights(const struct npu_config *cfg, npulm_error *err) {
  if (!cfg->vocab_only) return NPULM_OK;
  return npu_fail(err, NPULM_ERR_ARG, "the model was opened for its vocabulary only: no weights");
}

npulm_status npu_model_check_float(const struct npulm_model *m, const char *what,
                                   npulm_error *err) {
  if (m->n_omitted == 0) return NPULM_OK;
  return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                  "%s needs the float weights, and this program file holds no float copy of the "
                  "NPU's matrices (compiled without --keep-float): pass the GGUF model instead "
                  "(-m MODEL.gguf), or compile with --keep-float",
                  what);
}

bool npu_model_omits(const struct npulm_model *m, const char *name) {
  for (int32_t i = 0; i < m->n_omitted; i++) {
    if (strcmp(m->omitted[i], name) == 0) return true;
  }
  return false;
}

/* ---- Weights -------------------------------------------------------------------------------- */

/* The index of the first of x[0 .. n) that is NaN or infinite, or n if none. Whole blocks have
 * their bits tested (exponent all ones) in a loop of fixed count that vectorizes; the block with
 * one, or the tail, is searched value by value. One pass over the weights. */
static uint64_t first_non_finite(const float *x, uint64_t n) {
  enum { BLOCK = 1024 };
  uint64_t i = 0;
  for (; n - i >= BLOCK; i += BLOCK) {
    uint32_t bad = 0;
    for (int j = 0; j < BLOCK; j++) {
      uint32_t bits;
      memcpy(&bits, &x[i + (uint64_t)j], sizeof(bits));
      bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    if (bad) break;
  }
  for (; i < n; i++) {
    if (!isfinite(x[i])) return i;
  }
  return n;
}

/* Refuse tensor 'name' (n values at 'x') if a value is not finite: no path could compute with
 * it (the integer NPU's quantization cannot scale it; in float it turns the logits into NaN), so
 * every path refuses it here, naming it, rather than each in its own way further on. */
static npulm_status check_finite(const char *name, const float *x, uint64_t n, npulm_error *err) {
  uint64_t at = first_non_finite(x, n);
  if (at == n) return NPULM_OK;
  return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%s' has a value that is not finite: %g at %llu",
                  name, (double)x[at], (unsigned long long)at);
}

/* The tensors of a type npulm does not read, gathered over the whole model so that one error
 * names them all: "name (TYPE), ..." while it fits in 'list', then only counted. */
struct unread {
  bool check_only;     /* the first pass: shapes and types only, nothing dequantized */
  uint64_t copy_bytes; /* what the second pass will allocate: the float copies */
  char list[288];
  size_t len;
  int n, listed;
};

static void unread_add(struct unread *u, const char *name, uint32_t type) {
  u->n++;
  char item[160];
  int n =
      snprintf(item, sizeof(item), "%s%s (%s)", u->len ? ", " : "", name, npu_ggml_type_name(type));
  if (n < 0 || (size_t)n >= sizeof(u->list) - u->len) return; /* no room: counted only */
  memcpy(u->list + u->len, item, (size_t)n + 1);
  u->len += (size_t)n;
  u->listed++;
}

/* One line naming every tensor of 'u' (NPULM_ERR_UNSUPPORTED), or NPULM_OK if there is none. */
static npulm_status unread_fail(const struct unread *u, npulm_error *err) {
  if (u->n == 0) return NPULM_OK;
  char more[48] = "";
  if (u->n > u->listed) snprintf(more, sizeof(more), " and %d more", u->n - u->listed);
  char readable[160];
  npu_ggml_readable_types(readable, sizeof(readable));
  return npu_fail(err, NPULM_ERR_UNSUPPORTED, "%s of types npulm does not read: %s%s (it reads %s)",
                  u->n == 1 ? "a tensor" : "tensors", u->list, more, readable);
}

/* Find tensor 'name' with exactly the shape {ne0, ne1} (ne1 = 0 for a vector) and return a float
 * view of it: the mapping itself for aligned F32 data, else a dequantized copy owned by 'm'.
 * Every value must be finite. A tensor of a type npulm does not read is added to 'u' and left
 * NULL: the caller fails once all are known. With u->check_only, only the shape and the type are
 * checked ('*out' stays NULL). */
static npulm_status load_tensor(struct npulm_model *m, struct unread *u, const char *name,
                                uint64_t ne0, uint64_t ne1, bool required, const float **out,
                                npulm_error *err) {
  *out = NULL;
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(m->gguf, name);
  if (t == NULL && npu_model_omits(m, name)) {
    m->n_params += ne0 * (ne1 ? ne1 : 1); /* the model has it; its file holds no float copy */
    return NPULM_OK;
  }
  if (t == NULL) {
    return required ? npu_fail(err, NPULM_ERR_FORMAT, "missing tensor '%s'", name) : NPULM_OK;
  }
  uint32_t want_dims = ne1 ? 2 : 1;
  if (t->n_dims != want_dims || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1)) {
    char shape[96];
    int len = snprintf(shape, sizeof(shape), "[%llu", (unsigned long long)t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims && len < (int)sizeof(shape); d++) {
      len += snprintf(shape + len, sizeof(shape) - (size_t)len, ", %llu",
                      (unsigned long long)t->ne[d]);
    }
    if (ne1) {
      return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%s' has shape %s], expected [%llu, %llu]",
                      name, shape, (unsigned long long)ne0, (unsigned long long)ne1);
    }
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor '%s' has shape %s], expected [%llu]", name,
                    shape, (unsigned long long)ne0);
  }
  m->n_params += t->n_elems;
  if (npu_ggml_type_to_f32(t->type) == NULL) {
    unread_add(u, name, t->type);
    return NPULM_OK;
  }
  const bool in_place = t->type == NPU_GGML_F32 && ((uintptr_t)t->data % _Alignof(float)) == 0;
  if (m->defer_matrices && ne1 != 0) return NPULM_OK;
  if (u->check_only) {
    u->copy_bytes += in_place ? 0 : t->n_elems * sizeof(float);
    return NPULM_OK;
  }
  if (in_place) {
    *out = t->data;
    /* not scanned again where the checksums vouch for it: that would read every page of a
     * program's float matrices, which an integer program never touches at run time */
    return m->weights_vouched ? NPULM_OK : check_finite(name, *out, t->n_elems, err);
  }
  float *copy = malloc((size_t)t->n_elems * sizeof(float));
  if (copy == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading '%s'", name);
  m->owned[m->n_owned++] = copy; /* 'owned' has room for every tensor of the file */
  *out = copy;
  npulm_status st = npu_gguf_tensor_to_f32(t, copy, err);
  return st != NPULM_OK ? st : check_finite(name, copy, t->n_elems, err);
}

npulm_status npu_model_read_rows(const struct npulm_model *m, const char *name, uint64_t row0,
                                 uint64_t n_rows, float *out, npulm_error *err) {
  const struct npu_gguf_tensor *t = npu_gguf_find_tensor(m->gguf, name);
  if (t == NULL || t->n_dims != 2 || row0 + n_rows > t->ne[1]) {
    return npu_fail(err, NPULM_ERR_ARG, "no rows %llu..%llu of a matrix '%s' in the model",
                    (unsigned long long)row0, (unsigned long long)(row0 + n_rows), name);
  }
  npulm_status st = npu_gguf_tensor_rows_to_f32(t, row0, n_rows, out, err);
  npu_gguf_tensor_release_rows(t, row0, n_rows);
  if (st != NPULM_OK || m->weights_vouched) return st;
  return check_finite(name, out, n_rows * t->ne[0], err);
}

static npulm_status load_layer(struct npulm_model *m, struct unread *u, int l, npulm_error *err) {
  const struct npu_config *c = &m->cfg;
  struct npu_layer_weights *lw = &m->w.layers[l];
  uint64_t dim = (uint64_t)c->dim, q_dim = (uint64_t)c->n_heads * (uint64_t)c->head_dim;
  uint64_t kv_dim = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, ffn = (uint64_t)c->ffn_dim;
  struct {
    const char *suffix;
    uint64_t ne0, ne1;
    bool required;
    const float **dst;
  } specs[] = {
      {"attn_norm.weight", dim, 0, true, &lw->attn_norm},
      {"attn_q.weight", dim, q_dim, true, &lw->wq},
      {"attn_k.weight", dim, kv_dim, true, &lw->wk},
      {"attn_v.weight", dim, kv_dim, true, &lw->wv},
      {"attn_q.bias", q_dim, 0, c->has_qkv_bias, &lw->bq},
      {"attn_k.bias", kv_dim, 0, c->has_qkv_bias, &lw->bk},
      {"attn_v.bias", kv_dim, 0, c->has_qkv_bias, &lw->bv},
      {"attn_output.weight", q_dim, dim, true, &lw->wo},
      {"ffn_norm.weight", dim, 0, true, &lw->ffn_norm},
      {"ffn_gate.weight", dim, ffn, true, &lw->w_gate},
      {"ffn_up.weight", dim, ffn, true, &lw->w_up},
      {"ffn_down.weight", ffn, dim, true, &lw->w_down},
  };
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
    char name[96];
    snprintf(name, sizeof(name), "blk.%d.%s", l, specs[i].suffix);
    npulm_status st =
        load_tensor(m, u, name, specs[i].ne0, specs[i].ne1, specs[i].required, specs[i].dst, err);
    if (st != NPULM_OK) return st;
  }
  return NPULM_OK;
}

/* Every tensor the model reads, through load_tensor. */
static npulm_status load_all(struct npulm_model *m, struct unread *u, npulm_error *err) {
  struct npu_config *c = &m->cfg;
  npulm_status st;
  uint64_t dim = (uint64_t)c->dim, vocab = (uint64_t)c->n_vocab;
  if ((st = load_tensor(m, u, "token_embd.weight", dim, vocab, true, &m->w.token_embd, err)) ||
      (st = load_tensor(m, u, "output_norm.weight", dim, 0, true, &m->w.output_norm, err)) ||
      (st = load_tensor(m, u, "output.weight", dim, vocab, false, &m->w.output, err)) ||
      (st = load_tensor(m, u, "rope_freqs.weight", (uint64_t)c->rope_dim / 2, 0, false,
                        &m->w.rope_freqs, err))) {
    return st;
  }
  /* an absent output.weight ties the output to the embedding (one of a type npulm does not read
   * is present, and named; one a lean program file omits is the model's own) */
  c->tied_output = npu_gguf_find_tensor(m->gguf, "output.weight") == NULL &&
                   !npu_model_omits(m, "output.weight");
  if (c->tied_output) m->w.output = m->w.token_embd;
  for (int l = 0; l < c->n_layers; l++) {
    if ((st = load_layer(m, u, l, err)) != NPULM_OK) return st;
  }
  return NPULM_OK;
}

static npulm_status load_weights(struct npulm_model *m, npulm_error *err) {
  struct npu_config *c = &m->cfg;
  const struct npu_gguf_tensor *embd = npu_gguf_find_tensor(m->gguf, "token_embd.weight");
  if (embd == NULL && npu_model_omits(m, "token_embd.weight")) {
    c->n_vocab = npu_tok_n_vocab(m->tok); /* a lean program file's: the tokenizer's count */
  } else if (embd == NULL) {
    return npu_fail(err, NPULM_ERR_FORMAT, "missing tensor 'token_embd.weight'");
  } else if (embd->n_dims != 2 || embd->ne[1] > (1u << 24)) {
    return npu_fail(err, NPULM_ERR_FORMAT, "tensor 'token_embd.weight' has an invalid shape");
  } else {
    c->n_vocab = (int)embd->ne[1];
  }
  if (c->n_vocab != npu_tok_n_vocab(m->tok)) {
    return npu_fail(err, NPULM_ERR_FORMAT,
                    "token_embd.weight has %d rows but the tokenizer has %d tokens", c->n_vocab,
                    npu_tok_n_vocab(m->tok));
  }
  m->owned = calloc(m->gguf->n_tensors + 1, sizeof(*m->owned));
  m->w.layers = calloc((size_t)c->n_layers, sizeof(*m->w.layers));
  if (m->owned == NULL || m->w.layers == NULL) {
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  /* shapes and types of every tensor first, so that a file with tensors npulm cannot read is
   * refused, naming them all, before gigabytes are dequantized; then the weights */
  struct unread u = {.check_only = true};
  npulm_status st;
  if ((st = load_all(m, &u, err)) != NPULM_OK || (st = unread_fail(&u, err)) != NPULM_OK) return st;
  /* a model whose float copies cannot fit is said now, not found by the OOM killer later */
  const uint64_t available = npu_mem_available();
  if (available > 0 && u.copy_bytes > available) {
    return npu_fail(err, NPULM_ERR_NOMEM,
                    "reading this model's weights in float takes %.1f GiB, more than the %.1f GiB "
                    "of memory available: compile it into a program file first (npulm compile "
                    "reads it a block at a time), and run that",
                    (double)u.copy_bytes / (1u << 30), (double)available / (1u << 30));
  }
  m->n_params = 0;
  u.check_only = false;
  return load_all(m, &u, err);
}

npulm_status npu_model_read(struct npulm_model *m, npulm_error *err) {
  npulm_status st;
  if ((st = npu_config_read(m->gguf, &m->cfg, err)) || (st = npu_tok_load(m->gguf, &m->tok, err))) {
    return st;
  }
  return load_weights(m, err);
}

npulm_status npu_model_read_vocab(struct npulm_model *m, npulm_error *err) {
  npulm_status st = npu_tok_load(m->gguf, &m->tok, err);
  if (st != NPULM_OK) return st;
  m->cfg.vocab_only = true;
  m->cfg.n_vocab = npu_tok_n_vocab(m->tok);
  read_name(m->gguf, &m->cfg);
  return NPULM_OK;
}

void npu_model_release(struct npulm_model *m) {
  for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
  for (int32_t i = 0; i < m->n_omitted; i++) free(m->omitted[i]);
  free(m->omitted);
  free(m->owned);
  free(m->w.layers);
  npu_tok_free(m->tok);
  npu_gguf_close(m->gguf);
}

void npulm_model_get_info(const npulm_model *m, npulm_model_info *info) {
  const struct npu_config *c = &m->cfg;
  memset(info, 0, sizeof(*info));
  info->arch = c->vocab_only ? "" : c->arch == NPU_ARCH_QWEN2 ? "qwen2" : "llama";
  info->name = c->name;
  info->n_vocab = c->n_vocab;
  info->dim = c->dim;
  info->n_layers = c->n_layers;
  info->n_heads = c->n_heads;
  info->n_kv_heads = c->n_kv_heads;
  info->head_dim = c->head_dim;
  info->ffn_dim = c->ffn_dim;
  info->n_ctx_train = c->n_ctx_train;
  info->rope_base = c->rope_base;
  info->rms_eps = c->rms_eps;
  info->tied_output = c->tied_output;
  info->bos_id = npu_tok_bos(m->tok);
  info->eos_id = npu_tok_eos(m->tok);
  info->add_bos = npu_tok_add_bos(m->tok);
  info->n_params = m->n_params;
}

/* ---- Tokenizer half of the public API ------------------------------------------------------- */

npulm_status npulm_tokenize(const npulm_model *m, const char *text, size_t len, bool add_bos,
                            bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                            npulm_error *err) {
  return npu_tok_encode(m->tok, text, len, add_bos, parse_special, ids, cap, n_out, err);
}

npulm_status npu_tokenize_alloc(const struct npulm_model *m, const char *text, size_t len,
                                bool add_bos, int32_t **ids_out, size_t *n_out, npulm_error *err) {
  /* a first guess that fits most text; a vocabulary without a piece for the space may need up to
   * three byte tokens a byte, so ask again with the exact size when it does not */
  size_t cap = len + 2, n = 0;
  int32_t *ids = malloc(cap * sizeof(int32_t));
  npulm_status st = ids == NULL
                        ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory")
                        : npu_tok_encode(m->tok, text, len, add_bos, false, ids, cap, &n, err);
  if (st == NPULM_ERR_ARG && n > cap) {
    int32_t *bigger = realloc(ids, n * sizeof(int32_t));
    st = bigger == NULL ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory")
                        : npu_tok_encode(m->tok, text, len, add_bos, false, bigger, n, &n, err);
    if (bigger != NULL) ids = bigger;
  }
  if (st != NPULM_OK) {
    free(ids);
    return st;
  }
  *ids_out = ids;
  *n_out = n;
  return NPULM_OK;
}

const char *npulm_token_text(const npulm_model *m, int32_t id) { return npu_tok_text(m->tok, id); }

size_t npulm_token_to_piece(const npulm_model *m, int32_t prev, int32_t id, char *buf, size_t cap) {
  return npu_tok_piece(m->tok, prev, id, buf, cap);
}

bool npulm_token_is_eog(const npulm_model *m, int32_t id) { return npu_tok_is_eog(m->tok, id); }
