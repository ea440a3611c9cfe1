/* Tokenizer front end: loading the vocabulary from tokenizer.ggml.* keys, special-token matching,
 * decoding of pieces. The two algorithms live in tokenizer_spm.c and tokenizer_bpe.c, and what
 * they share with this file (the hash tables, output and scratch helpers, the merge queue) in
 * vocab.c. Behaviour follows llama.cpp's llama-vocab.cpp. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/utf8.h"
#include "io/gguf.h"
#include "model/vocab.h"

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_PRE "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_TYPES "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_ADD_BOS "tokenizer.ggml.add_bos_token"
#define KEY_ADD_PREFIX "tokenizer.ggml.add_space_prefix"

/* Decode one well-formed UTF-8 sequence at s[0..n); return its length (0 if malformed). */
static size_t utf8_get(const unsigned char *s, size_t n, uint32_t *cp) {
  size_t len = npu_tok_utf8_len(s[0]);
  if (len == 1) {
    if (s[0] >= 0x80) return 0;
    *cp = s[0];
    return 1;
  }
  if (len > n) return 0;
  uint32_t c = s[0] & (0x7F >> len);
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    c = c << 6 | (s[i] & 0x3F);
  }
  *cp = c;
  return len;
}

/* ---- Loading -------------------------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static void init_byte_map(struct npu_tok *tok) {
  uint32_t next = 256;
  for (size_t i = 0; i < 324; i++) tok->cp_byte[i] = -1;
  for (uint32_t b = 0; b < 256; b++) {
    bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    uint32_t cp = keep ? b : next++;
    tok->byte_cp[b] = (uint16_t)cp;
    tok->cp_byte[cp] = (int16_t)b;
  }
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* The byte of a "<0xXX>" token text, or -1. */
static int parse_byte_token(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
  int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void init_byte_tokens(struct npu_tok *tok) {
  static const char hex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; b++) {
    int32_t id = -1;
    if (tok->kind == NPU_TOK_SPM) {
      char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      id = npu_tok_lookup(tok, buf, 6);
      if (id < 0) {
        char c = (char)b;
        id = npu_tok_lookup(tok, &c, 1);
      }
    } else {
      char buf[4];
      size_t n = npu_utf8_put(buf, tok->byte_cp[b]);
      id = npu_tok_lookup(tok, buf, n);
    }
    tok->byte_tok[b] = id;
  }
}

/* Read the optional numeric array 'key' of exactly n_vocab elements; '*present' says whether it
 * is there. */
static npulm_status get_vocab_array(const struct npu_gguf *g, const char *key, int32_t n_vocab,
                                    bool want_int, struct npu_gguf_arr *arr, bool *present,
                                    npulm_error *err) {
  *present = false;
  if (npu_gguf_find(g, key) == NULL) return NPULM_OK;
  npulm_status st = npu_gguf_get_arr(g, key, -1, arr, err);
  if (st != NPULM_OK) return st;
  uint32_t t = arr->type;
  bool is_int = t == NPU_GGUF_U8 || t == NPU_GGUF_I8 || t == NPU_GGUF_U16 || t == NPU_GGUF_I16 ||
                t == NPU_GGUF_U32 || t == NPU_GGUF_I32 || t == NPU_GGUF_U64 || t == NPU_GGUF_I64;
  bool is_float = t == NPU_GGUF_F32 || t == NPU_GGUF_F64;
  if (!(is_int || (!want_int && is_float))) {
    return npu_fail(err, NPULM_ERR_FORMAT, "metadata key '%s' must be an array of %s", key,
                    want_int ? "integers" : "numbers");
  }
  if (arr->n != (uint64_t)n_vocab) {
    return npu_fail(err, NPULM_ERR_FORMAT, "%s has %llu entries but %s has %d", key,
                    (unsigned long long)arr->n, KEY_TOKENS, n_vocab);
  }
  *present = true;
  return NPULM_OK;
}

/* Read the optional token id 'key' into '*id' (left as is when absent); it must name a token. */
static npulm_status get_token_id(const struct npu_gguf *g, const char *key, int32_t n_vocab,
                                 int32_t *id, npulm_error *err) {
  if (npu_gguf_find(g, key) == NULL) {
    if (*id >= n_vocab) *id = -1; /* a default that does not fit this vocab */
    return NPULM_OK;
  }
  uint32_t v;
  npulm_status st = npu_gguf_get_u32(g, key, &v, err);
  if (st != NPULM_OK) return st;
  if (v >= (uint32_t)n_vocab) {
    return npu_fail(err, NPULM_ERR_FORMAT, "%s = %u is out of range (the vocabulary has %d tokens)",
                    key, v, n_vocab);
  }
  *id = (int32_t)v;
  return NPULM_OK;
}

/* Read the optional bool 'key' into '*v' (left as is when absent). */
static npulm_status get_opt_bool(const struct npu_gguf *g, const char *key, bool *v,
                                 npulm_error *err) {
  if (npu_gguf_find(g, key) == NULL) return NPULM_OK;
  return npu_gguf_get_bool(g, key, v, err);
}

/* Copy the token strings into one pool and fill the hash table. */
static npulm_status load_texts(struct npu_tok *tok, const struct npu_gguf_arr *arr,
                               npulm_error *err) {
  size_t n = (size_t)tok->n_vocab;
  npulm_status st = NPULM_ERR_NOMEM;
  struct npu_gguf_value *vals = calloc(n, sizeof(*vals));
  tok->off = calloc(n, sizeof(*tok->off));
  tok->len = calloc(n, sizeof(*tok->len));
  if (vals == NULL || tok->off == NULL || tok->len == NULL) goto nomem;
  npu_gguf_arr_values(arr, vals);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (vals[i].v.s.len >= INT32_MAX) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "%s[%zu] is %llu bytes long", KEY_TOKENS, i,
                    (unsigned long long)vals[i].v.s.len);
      goto done;
    }
    total += vals[i].v.s.len + 1; /* cannot overflow: each string lies inside the file */
  }
  if (total > SIZE_MAX) goto nomem;
  tok->pool = malloc((size_t)total);
  if (tok->pool == NULL) goto nomem;
  size_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = (size_t)vals[i].v.s.len;
    if (len > 0) memcpy(tok->pool + pos, vals[i].v.s.ptr, len);
    tok->pool[pos + len] = '\0';
    tok->off[i] = pos;
    tok->len[i] = (uint32_t)len;
    if (len > tok->max_len) tok->max_len = (uint32_t)len;
    pos += len + 1;
  }
  size_t cap = npu_tok_table_size(n);
  if (cap == 0) goto nomem;
  tok->slots = calloc(cap, sizeof(*tok->slots));
  if (tok->slots == NULL) goto nomem;
  memset(tok->slots, 0xFF, cap * sizeof(*tok->slots)); /* all -1 */
  tok->slot_mask = cap - 1;
  for (size_t i = 0; i < n; i++) {
    if (tok->len[i] > 0) npu_tok_insert_token(tok, (int32_t)i);
  }
  st = NPULM_OK;
  goto done;
nomem:
  st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading %s", KEY_TOKENS);
done:
  free(vals);
  return st;
}

/* Read tokenizer.ggml.merges: every entry is "left right", both tokens, and so is their
 * concatenation. */
static npulm_status load_merges(struct npu_tok *tok, const struct npu_gguf *g, npulm_error *err) {
  struct npu_gguf_arr arr;
  npulm_status st = npu_gguf_get_arr(g, KEY_MERGES, NPU_GGUF_STR, &arr, err);
  if (st != NPULM_OK) return st;
  if (arr.n > INT32_MAX) {
    return npu_fail(err, NPULM_ERR_FORMAT, "%s has %llu entries", KEY_MERGES,
                    (unsigned long long)arr.n);
  }
  size_t n = (size_t)arr.n;
  char *buf = malloc((size_t)tok->max_len + 1);
  struct npu_gguf_value *vals = calloc(n > 0 ? n : 1, sizeof(*vals));
  size_t cap = npu_tok_table_size(n);
  tok->merges = cap > 0 ? calloc(cap, sizeof(*tok->merges)) : NULL;
  if (buf == NULL || vals == NULL || tok->merges == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory loading %s", KEY_MERGES);
    goto done;
  }
  for (size_t i = 0; i < cap; i++) tok->merges[i].rank = -1;
  tok->merge_mask = cap - 1;
  npu_gguf_arr_values(&arr, vals);
  for (size_t i = 0; i < n; i++) {
    const char *s = vals[i].v.s.ptr;
    size_t len = (size_t)vals[i].v.s.len;
    int shown = len < 100 ? (int)len : 100;
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (sp == NULL) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "%s[%zu] '%.*s' is not two tokens separated by a space",
                    KEY_MERGES, i, shown, s);
      goto done;
    }
    size_t ln = (size_t)(sp - s), rn = len - ln - 1;
    int32_t left = npu_tok_lookup(tok, s, ln);
    int32_t right = npu_tok_lookup(tok, sp + 1, rn);
    if (left < 0 || right < 0) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "%s[%zu] '%.*s' names a token not in %s", KEY_MERGES, i,
                    shown, s, KEY_TOKENS);
      goto done;
    }
    int32_t id = -1;
    if (ln + rn <= tok->max_len) {
      memcpy(buf, s, ln);
      memcpy(buf + ln, sp + 1, rn);
      id = npu_tok_lookup(tok, buf, ln + rn);
    }
    if (id < 0) {
      st = npu_fail(err, NPULM_ERR_FORMAT, "%s[%zu] '%.*s' makes a token not in %s", KEY_MERGES, i,
                    shown, s, KEY_TOKENS);
      goto done;
    }
    npu_tok_insert_merge(tok, left, right, (int32_t)i, id);
  }
  st = NPULM_OK;
done:
  free(buf);
  free(vals);
  return st;
}

/* Token texts that end generation whatever their id (llama.cpp's list, abridged). */
static const char *const eog_texts[] = {
    "<|eot_id|>",      "<|im_end|>",    "<|end|>",
    "<end_of_turn>",   "<|endoftext|>", "<|eom_id|>",
    "<|end_of_text|>", "<EOT>",         "<\uFF5Cend\u2581of\u2581sentence\uFF5C>",
};

struct special_key {
  uint32_t len;
  int32_t id;
};

static int cmp_special(const void *a, const void *b) {
  const struct special_key *x = a, *y = b;
  if (x->len != y->len) return x->len > y->len ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* EOG flags and the list of tokens matched in text (control, user-defined, unknown). */
static npulm_status init_specials(struct npu_tok *tok, npulm_error *err) {
  size_t n = (size_t)tok->n_vocab;
  tok->flags = calloc(n, 1);
  if (tok->flags == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  const int32_t ids[] = {tok->eos, tok->eot, tok->eom};
  for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
    if (ids[i] >= 0) tok->flags[ids[i]] |= NPU_TOK_FLAG_EOG;
  }
  for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++) {
    int32_t id = npu_tok_lookup(tok, eog_texts[i], strlen(eog_texts[i]));
    if (id >= 0) tok->flags[id] |= NPU_TOK_FLAG_EOG;
  }

  size_t count = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t t = tok->type[i];
    if ((t == NPU_TOK_CONTROL || t == NPU_TOK_USER_DEFINED || t == NPU_TOK_UNKNOWN) &&
        tok->len[i] > 0) {
      count++;
    }
  }
  if (count == 0) return NPULM_OK;
  struct special_key *keys = calloc(count, sizeof(*keys));
  tok->special = calloc(count, sizeof(*tok->special));
  if (keys == NULL || tok->special == NULL) {
    free(keys);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t t = tok->type[i];
    if ((t == NPU_TOK_CONTROL || t == NPU_TOK_USER_DEFINED || t == NPU_TOK_UNKNOWN) &&
        tok->len[i] > 0) {
      keys[k++] = (struct special_key){.len = tok->len[i], .id = (int32_t)i};
    }
  }
  qsort(keys, count, sizeof(*keys), cmp_special);
  for (size_t i = 0; i < count; i++) tok->special[i] = keys[i].id;
  tok->n_special = count;
  free(keys);
  return NPULM_OK;
}

npulm_status npu_tok_load(const struct npu_gguf *g, struct npu_tok **out, npulm_error *err) {
  *out = NULL;
  npulm_status st;
  struct npu_tok *tok = calloc(1, sizeof(*tok));
  if (tok == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");

  struct npu_gguf_str model;
  if ((st = npu_gguf_get_str(g, KEY_MODEL, &model, err)) != NPULM_OK) goto fail;
  if (npu_gguf_str_eq(model, "llama")) {
    tok->kind = NPU_TOK_SPM;
  } else if (npu_gguf_str_eq(model, "gpt2")) {
    tok->kind = NPU_TOK_BPE;
  } else {
    st = npu_fail(err, NPULM_ERR_UNSUPPORTED, "unsupported tokenizer '%.*s' (%s)",
                  model.len < 100 ? (int)model.len : 100, model.ptr, KEY_MODEL);
    goto fail;
  }

  /* vocabulary */
  struct npu_gguf_arr toks;
  if ((st = npu_gguf_get_arr(g, KEY_TOKENS, NPU_GGUF_STR, &toks, err)) != NPULM_OK) goto fail;
  if (toks.n == 0 || toks.n > INT32_MAX) {
    st = npu_fail(err, NPULM_ERR_FORMAT, "%s has %llu tokens", KEY_TOKENS,
                  (unsigned long long)toks.n);
    goto fail;
  }
  tok->n_vocab = (int32_t)toks.n;
  size_t n = (size_t)toks.n;
  if ((st = load_texts(tok, &toks, err)) != NPULM_OK) goto fail;

  struct npu_gguf_arr scores, types;
  bool has_scores, has_types;
  if ((st = get_vocab_array(g, KEY_SCORES, tok->n_vocab, false, &scores, &has_scores, err)) ||
      (st = get_vocab_array(g, KEY_TYPES, tok->n_vocab, true, &types, &has_types, err))) {
    goto fail;
  }
  tok->score = calloc(n, sizeof(*tok->score));
  tok->type = calloc(n, 1);
  tok->byte_val = calloc(n, sizeof(*tok->byte_val));
  if (tok->score == NULL || tok->type == NULL || tok->byte_val == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  for (size_t i = 0; i < n; i++) {
    if (has_scores) { /* NaN ranks last; out-of-range values saturate */
      double v = npu_gguf_arr_num(&scores, i);
      tok->score[i] = isnan(v) || v < -FLT_MAX ? -INFINITY : v > FLT_MAX ? INFINITY : (float)v;
    }
    double t = has_types ? npu_gguf_arr_num(&types, i) : NPU_TOK_NORMAL;
    if (!(t >= NPU_TOK_UNDEFINED && t <= NPU_TOK_BYTE)) { /* (an integer array: t is whole) */
      st = npu_fail(err, NPULM_ERR_FORMAT,
                    "%s[%zu] = %.0f is not a token type (0 undefined .. 6 byte)", KEY_TYPES, i, t);
      goto fail;
    }
    tok->type[i] = (uint8_t)t;
    tok->byte_val[i] = (int16_t)(tok->type[i] == NPU_TOK_BYTE
                                     ? parse_byte_token(tok->pool + tok->off[i], tok->len[i])
                                     : -1);
  }
  init_byte_map(tok);
  init_byte_tokens(tok);

  /* algorithm-specific parts and defaults */
  bool add_bos_default = true;
  tok->bos = tok->eos = tok->unk = tok->eot = tok->eom = -1;
  if (tok->kind == NPU_TOK_SPM) {
    tok->bos = 1;
    tok->eos = 2;
    tok->unk = 0;
    tok->add_space_prefix = true;
  } else {
    if ((st = load_merges(tok, g, err)) != NPULM_OK) goto fail;
    const char *pre = NULL;
    size_t pre_len = 0;
    if (npu_gguf_find(g, KEY_PRE) != NULL) {
      struct npu_gguf_str s;
      if ((st = npu_gguf_get_str(g, KEY_PRE, &s, err)) != NPULM_OK) goto fail;
      pre = s.ptr;
      pre_len = (size_t)s.len;
    }
    if ((st = npu_tok_bpe_init(tok, pre, pre_len, &add_bos_default, err)) != NPULM_OK) goto fail;
  }
  tok->add_bos = add_bos_default;
  if ((st = get_token_id(g, "tokenizer.ggml.bos_token_id", tok->n_vocab, &tok->bos, err)) ||
      (st = get_token_id(g, "tokenizer.ggml.eos_token_id", tok->n_vocab, &tok->eos, err)) ||
      (st = get_token_id(g, "tokenizer.ggml.unknown_token_id", tok->n_vocab, &tok->unk, err)) ||
      (st = get_token_id(g, "tokenizer.ggml.eot_token_id", tok->n_vocab, &tok->eot, err)) ||
      (st = get_token_id(g, "tokenizer.ggml.eom_token_id", tok->n_vocab, &tok->eom, err)) ||
      (st = get_opt_bool(g, KEY_ADD_BOS, &tok->add_bos, err)) ||
      (st = get_opt_bool(g, KEY_ADD_PREFIX, &tok->add_space_prefix, err))) {
    goto fail;
  }
  if (tok->add_bos && tok->bos < 0) {
    st = npu_fail(err, NPULM_ERR_FORMAT,
                  "BOS is wanted (%s) but tokenizer.ggml.bos_token_id is missing", KEY_ADD_BOS);
    goto fail;
  }
  if ((st = init_specials(tok, err)) != NPULM_OK) goto fail;
  *out = tok;
  return NPULM_OK;
fail:
  npu_tok_free(tok);
  return st;
}

void npu_tok_free(struct npu_tok *tok) {
  if (tok == NULL) return;
  for (size_t i = 0; i < tok->n_regex; i++) pcre2_code_free(tok->regex[i]);
  free(tok->pool);
  free(tok->off);
  free(tok->len);
  free(tok->score);
  free(tok->type);
  free(tok->flags);
  free(tok->byte_val);
  free(tok->slots);
  free(tok->merges);
  free(tok->special);
  free(tok);
}

/* ---- Accessors ------------------------------------------------------------------------------ */

int npu_tok_n_vocab(const struct npu_tok *tok) { return tok->n_vocab; }
int32_t npu_tok_bos(const struct npu_tok *tok) { return tok->bos; }
int32_t npu_tok_eos(const struct npu_tok *tok) { return tok->eos; }
bool npu_tok_add_bos(const struct npu_tok *tok) { return tok->add_bos; }

bool npu_tok_is_eog(const struct npu_tok *tok, int32_t id) {
  return id >= 0 && id < tok->n_vocab && (tok->flags[id] & NPU_TOK_FLAG_EOG) != 0;
}

const char *npu_tok_text(const struct npu_tok *tok, int32_t id) {
  if (id < 0 || id >= tok->n_vocab) return NULL;
  return tok->pool + tok->off[id];
}

/* ---- Encoding ------------------------------------------------------------------------------- */

/* A piece of the input: raw text, or a special token matched in it. */
struct frag {
  size_t off, len;
  int32_t id; /* -1 for raw text */
};

/* First occurrence of needle[0..nn) in hay[0..nh), or NULL. */
static const char *find_bytes(const char *hay, size_t nh, const char *needle, size_t nn) {
  if (nn == 0 || nn > nh) return NULL;
  const char *end = hay + (nh - nn) + 1;
  for (const char *p = hay; p < end;) {
    p = memchr(p, needle[0], (size_t)(end - p));
    if (p == NULL) return NULL;
    if (memcmp(p, needle, nn) == 0) return p;
    p++;
  }
  return NULL;
}

static bool frag_push(struct frag **v, size_t *n, size_t *cap, struct frag f) {
  if (!npu_tok_reserve((void **)v, cap, *n + 1, sizeof(**v))) return false;
  (*v)[(*n)++] = f;
  return true;
}

/* Split 'text' at every occurrence of a special token's text, longest tokens first, as
 * llama.cpp's tokenizer_st_partition does. Control and unknown tokens are matched only when
 * 'parse_special'; user-defined tokens always are. Sets '*frags_out' (free it) and '*n_out'. */
static bool partition(const struct npu_tok *tok, const char *text, size_t len, bool parse_special,
                      struct frag **frags_out, size_t *n_out) {
  struct frag *cur = NULL, *next = NULL;
  size_t n_cur = 0, cap_cur = 0, n_next = 0, cap_next = 0;
  if (len > 0 && !frag_push(&cur, &n_cur, &cap_cur, (struct frag){0, len, -1})) goto fail;
  for (size_t k = 0; k < tok->n_special && n_cur > 0; k++) {
    int32_t id = tok->special[k];
    if (!parse_special && tok->type[id] != NPU_TOK_USER_DEFINED) continue;
    const char *t = tok->pool + tok->off[id];
    size_t tl = tok->len[id];
    n_next = 0;
    for (size_t i = 0; i < n_cur; i++) {
      struct frag f = cur[i];
      if (f.id >= 0 || f.len < tl) {
        if (!frag_push(&next, &n_next, &cap_next, f)) goto fail;
        continue;
      }
      size_t pos = f.off, end = f.off + f.len;
      const char *m;
      while ((m = find_bytes(text + pos, end - pos, t, tl)) != NULL) {
        size_t at = (size_t)(m - text);
        if (at > pos && !frag_push(&next, &n_next, &cap_next, (struct frag){pos, at - pos, -1})) {
          goto fail;
        }
        if (!frag_push(&next, &n_next, &cap_next, (struct frag){at, tl, id})) goto fail;
        pos = at + tl;
      }
      if (pos < end && !frag_push(&next, &n_next, &cap_next, (struct frag){pos, end - pos, -1})) {
        goto fail;
      }
    }
    struct frag *tv = cur;
    cur = next;
    next = tv;
    size_t tc = cap_cur;
    cap_cur = cap_next;
    cap_next = tc;
    n_cur = n_next;
  }
  free(next);
  *frags_out = cur;
  *n_out = n_cur;
  return true;
fail:
  free(cur);
  free(next);
  return false;
}

npulm_status npu_tok_encode(const struct npu_tok *tok, const char *text, size_t len, bool add_bos,
                            bool parse_special, int32_t *ids, size_t cap, size_t *n_out,
                            npulm_error *err) {
  *n_out = 0;
  if ((text == NULL && len > 0) || (ids == NULL && cap > 0)) {
    return npu_fail(err, NPULM_ERR_ARG, "tokenize: NULL text or id buffer");
  }
  if (add_bos && tok->bos < 0) {
    return npu_fail(err, NPULM_ERR_ARG, "tokenize: BOS requested but the model has no BOS token");
  }
  struct npu_tok_out out = {.ids = ids, .cap = cap, .n = 0};
  struct npu_tok_scratch scratch = {0};
  struct frag *frags = NULL;
  size_t n_frags = 0;
  npulm_status st = NPULM_OK;
  if (add_bos) npu_tok_push(&out, tok->bos);
  if (!partition(tok, text, len, parse_special, &frags, &n_frags)) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
    goto done;
  }
  bool prev_special = true; /* SPM: a space is prefixed at the start and after special tokens */
  for (size_t i = 0; i < n_frags; i++) {
    const struct frag *f = &frags[i];
    if (f->id >= 0) {
      npu_tok_push(&out, f->id);
      prev_special = true;
      continue;
    }
    if (tok->kind == NPU_TOK_SPM) {
      st = npu_tok_spm_encode(tok, text + f->off, f->len, tok->add_space_prefix && prev_special,
                              &scratch, &out, err);
    } else {
      st = npu_tok_bpe_encode(tok, text + f->off, f->len, &scratch, &out, err);
    }
    if (st != NPULM_OK) goto done;
    prev_special = false;
  }
  *n_out = out.n;
  if (out.n > cap) {
    st = npu_fail(err, NPULM_ERR_ARG, "tokenize: the text needs %zu tokens, room for %zu", out.n,
                  cap);
  }
done:
  free(frags);
  npu_tok_scratch_free(&scratch);
  return st;
}

/* ---- Decoding ------------------------------------------------------------------------------- */

/* Bytes written so far to a piece buffer of 'cap' bytes; 'n' counts them all. */
struct piece {
  char *buf;
  size_t cap;
  size_t n;
};

static void piece_put(struct piece *p, const char *s, size_t n) {
  if (p->n < p->cap) {
    size_t k = p->cap - p->n < n ? p->cap - p->n : n;
    memcpy(p->buf + p->n, s, k);
  }
  p->n += n;
}

size_t npu_tok_piece(const struct npu_tok *tok, int32_t prev, int32_t id, char *buf, size_t cap) {
  if (id < 0 || id >= tok->n_vocab) return 0;
  struct piece p = {.buf = buf, .cap = buf != NULL ? cap : 0, .n = 0};
  const char *s = tok->pool + tok->off[id];
  size_t n = tok->len[id];
  /* SentencePiece prefixed a space at the start of the text: drop it again */
  bool strip = tok->kind == NPU_TOK_SPM && tok->add_space_prefix &&
               (prev < 0 || (prev == tok->bos && tok->bos >= 0));
  char byte;
  uint8_t type = tok->type[id];
  if (type == NPU_TOK_BYTE && tok->byte_val[id] >= 0) {
    byte = (char)tok->byte_val[id];
    if (!(strip && byte == ' ')) piece_put(&p, &byte, 1);
    return p.n;
  }
  if (type == NPU_TOK_USER_DEFINED || type == NPU_TOK_BYTE) { /* verbatim */
    if (strip && n > 0 && s[0] == ' ') {
      s++;
      n--;
    }
    piece_put(&p, s, n);
    return p.n;
  }
  if (type != NPU_TOK_NORMAL) return 0; /* control, unknown, unused, undefined: nothing */

  if (tok->kind == NPU_TOK_SPM) {
    /* U+2581 (e2 96 81) stands for a space */
    size_t i = 0;
    while (i < n) {
      if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
        if (!(strip && p.n == 0)) piece_put(&p, " ", 1);
        strip = false;
        i += 3;
        continue;
      }
      size_t j = i;
      while (j < n && !(j + 3 <= n && memcmp(s + j, "\xe2\x96\x81", 3) == 0)) j++;
      piece_put(&p, s + i, j - i);
      strip = false;
      i = j;
    }
    return p.n;
  }

  /* byte-level BPE: every code point of the text stands for one byte */
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = utf8_get(u + i, n - i, &cp);
    if (k == 0) { /* not UTF-8: pass the byte through */
      piece_put(&p, s + i, 1);
      i++;
    } else if (cp < 324 && tok->cp_byte[cp] >= 0) {
      char b = (char)tok->cp_byte[cp];
      piece_put(&p, &b, 1);
      i += k;
    } else { /* not a mapped byte: keep the character */
      piece_put(&p, s + i, k);
      i += k;
    }
  }
  return p.n;
}
