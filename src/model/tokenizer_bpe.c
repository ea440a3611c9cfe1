/* Byte-level BPE encoding (tokenizer.ggml.model = "gpt2"): a sequence of pre-tokenizer regexes
 * (chosen by tokenizer.ggml.pre, as llama.cpp does; run with PCRE2 as Hugging Face tokenizers runs
 * them) splits the text into words, keeping both the matches and the text between them; each
 * word's bytes go through GPT-2's byte-to-character mapping and are merged pairwise, lowest merge
 * rank first (leftmost on ties), until no ranked pair is left. */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/vocab.h"

/* ---- Pre-tokenizers ------------------------------------------------------------------------- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
  RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"      \
                  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
  RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"           \
                  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_GPT4O                                                                                   \
  "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTRACTIONS                               \
  "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER "*" RE_CONTRACTIONS                             \
  "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

enum pre_kind {
  PRE_DEFAULT,
  PRE_GPT2,
  PRE_LLAMA3,
  PRE_QWEN2,
  PRE_STARCODER,
  PRE_FALCON,
  PRE_DEEPSEEK_CODER,
  PRE_GPT4O,
  PRE_COUNT
};

/* The regexes of each pre-tokenizer, applied in order (llama.cpp's llm_tokenizer_bpe). */
static const char *const pre_regex[PRE_COUNT][NPU_TOK_MAX_REGEX] = {
    [PRE_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
    [PRE_GPT2] = {RE_GPT2},
    [PRE_LLAMA3] = {RE_LLAMA3},
    [PRE_QWEN2] = {RE_QWEN2},
    [PRE_STARCODER] = {"\\p{N}", RE_GPT2},
    [PRE_FALCON] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"},
    [PRE_DEEPSEEK_CODER] = {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
                            "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
                            "\\p{N}"},
    [PRE_GPT4O] = {RE_GPT4O},
};

/* tokenizer.ggml.pre names, as llama.cpp maps them. 'ignore_merges' and 'add_bos' are the
 * defaults llama.cpp sets for the name (add_bos may be overridden by the file). */
static const struct {
  const char *name;
  enum pre_kind kind;
  bool ignore_merges;
  bool add_bos;
} pre_names[] = {
    {"default", PRE_DEFAULT, false, false},
    {"gpt-2", PRE_GPT2, false, false},
    {"phi-2", PRE_GPT2, false, false},
    {"mpt", PRE_GPT2, false, false},
    {"olmo", PRE_GPT2, false, false},
    {"jais", PRE_GPT2, false, false},
    {"gigachat", PRE_GPT2, false, false},
    {"mellum", PRE_GPT2, false, false},
    {"exaone4", PRE_GPT2, false, false},
    {"trillion", PRE_GPT2, false, false},
    {"granite-docling", PRE_GPT2, false, false},
    {"llama3", PRE_LLAMA3, true, true},
    {"llama-v3", PRE_LLAMA3, true, true},
    {"llama-bpe", PRE_LLAMA3, true, true},
    {"falcon3", PRE_LLAMA3, true, true},
    {"falcon-h1", PRE_LLAMA3, true, true},
    {"pixtral", PRE_LLAMA3, true, true},
    {"midm-2.0", PRE_LLAMA3, true, true},
    {"lfm2", PRE_LLAMA3, true, true},
    {"dbrx", PRE_LLAMA3, false, false},
    {"smaug-bpe", PRE_LLAMA3, false, false},
    {"qwen2", PRE_QWEN2, false, false},
    {"deepseek-r1-qwen", PRE_QWEN2, false, false},
    {"kormo", PRE_QWEN2, false, false},
    {"megrez", PRE_QWEN2, false, false},
    {"stablelm2", PRE_QWEN2, false, false},
    {"hunyuan", PRE_QWEN2, false, false},
    {"solar-open", PRE_QWEN2, false, false},
    {"starcoder", PRE_STARCODER, false, false},
    {"refact", PRE_STARCODER, false, false},
    {"command-r", PRE_STARCODER, false, false},
    {"smollm", PRE_STARCODER, false, false},
    {"codeshell", PRE_STARCODER, false, false},
    {"exaone", PRE_STARCODER, false, false},
    {"minerva-7b", PRE_STARCODER, false, false},
    {"mellum2", PRE_STARCODER, false, false},
    {"falcon", PRE_FALCON, false, false},
    {"deepseek-coder", PRE_DEEPSEEK_CODER, false, false},
    {"gpt-4o", PRE_GPT4O, false, false},
    {"llama4", PRE_GPT4O, false, false},
};

npulm_status npu_tok_bpe_init(struct npu_tok *tok, const char *pre, size_t pre_len,
                              bool *add_bos_default, npulm_error *err) {
  size_t k = 0;
  if (pre != NULL) {
    size_t n_names = sizeof(pre_names) / sizeof(pre_names[0]);
    for (k = 0; k < n_names; k++) {
      if (strlen(pre_names[k].name) == pre_len && memcmp(pre_names[k].name, pre, pre_len) == 0) {
        break;
      }
    }
    if (k == n_names) {
      return npu_fail(err, NPULM_ERR_UNSUPPORTED,
                      "unknown pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
                      pre_len < 100 ? (int)pre_len : 100, pre);
    }
  }
  enum pre_kind kind = pre_names[k].kind;
  tok->ignore_merges = pre_names[k].ignore_merges;
  *add_bos_default = pre_names[k].add_bos;
  for (size_t i = 0; i < NPU_TOK_MAX_REGEX && pre_regex[kind][i] != NULL; i++) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pre_regex[kind][i], PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (re == NULL) {
      PCRE2_UCHAR msg[120];
      pcre2_get_error_message(code, msg, sizeof(msg));
      return npu_fail(err, NPULM_ERR_UNSUPPORTED, "pre-tokenizer '%s': regex %zu: %s at %zu",
                      pre_names[k].name, i, (const char *)msg, (size_t)at);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter serves if JIT fails */
    tok->regex[tok->n_regex++] = re;
  }
  return NPULM_OK;
}

/* ---- Splitting ------------------------------------------------------------------------------ */

struct span {
  size_t off, len;
};

static bool span_push(struct span **v, size_t *n, size_t *cap, size_t off, size_t len) {
  if (len == 0) return true;
  if (!npu_tok_reserve((void **)v, cap, *n + 1, sizeof(**v))) return false;
  (*v)[(*n)++] = (struct span){off, len};
  return true;
}

/* Split each span of 'in' into the matches of 're' and the text between them, appending the
 * pieces to 'out'. Each span is matched on its own, as Hugging Face's Split does. */
static npulm_status split_regex(const pcre2_code *re, const char *text, const struct span *in,
                                size_t n_in, struct span **out, size_t *n_out, size_t *cap_out,
                                pcre2_match_data *md, npulm_error *err) {
  *n_out = 0;
  for (size_t i = 0; i < n_in; i++) {
    PCRE2_SPTR subj = (PCRE2_SPTR)(text + in[i].off);
    size_t len = in[i].len, start = 0, gap = 0;
    while (start < len) {
      int rc = pcre2_match(re, subj, len, start, 0, md, NULL);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) { /* the interpreter keeps its frames on the heap */
        rc = pcre2_match(re, subj, len, start, PCRE2_NO_JIT, md, NULL);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return npu_fail(err, NPULM_ERR_ARG, "tokenize: pre-tokenizer regex failed: %s",
                        (const char *)msg);
      }
      const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      size_t ms = (size_t)ov[0], me = (size_t)ov[1];
      if (me <= ms) { /* an empty match: step over one character and search on */
        if (ms >= len) break;
        size_t step = npu_tok_utf8_len(subj[ms]);
        start = ms + (step < len - ms ? step : len - ms);
        continue;
      }
      if (!span_push(out, n_out, cap_out, in[i].off + gap, ms - gap) ||
          !span_push(out, n_out, cap_out, in[i].off + ms, me - ms)) {
        return npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
      }
      gap = start = me;
    }
    if (!span_push(out, n_out, cap_out, in[i].off + gap, len - gap)) {
      return npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
    }
  }
  return NPULM_OK;
}

/* ---- Merging -------------------------------------------------------------------------------- */

/* One byte of the word at first, a token after merges. */
struct bpe_sym {
  int32_t id;   /* token, or -1 for a byte without one */
  int32_t prev; /* neighbours in the chain, -1 at the ends */
  int32_t next;
  bool alive; /* false once merged into its left neighbour */
};

/* A candidate merge of symbol 'left' (token 'lid') with its right neighbour 'right' ('rid'). */

struct bpe_state {
  const struct npu_tok *tok;
  struct bpe_sym *sym;
  struct npu_tok_scratch *s; /* owns the heap */
  size_t n_heap;
};

/* Queue the merge of symbols 'left' and 'right' if the pair is ranked. False when out of memory. */
static bool try_add(struct bpe_state *st, int32_t left, int32_t right) {
  if (left < 0 || right < 0) return true;
  int32_t lid = st->sym[left].id, rid = st->sym[right].id;
  if (lid < 0 || rid < 0) return true;
  const struct npu_tok_merge *m = npu_tok_find_merge(st->tok, lid, rid);
  if (m == NULL) return true;
  struct npu_tok_bigram b = {.priority = -(float)m->rank,
                             .left = left,
                             .right = right,
                             .lid = lid,
                             .rid = rid,
                             .id = m->id};
  return npu_tok_heap_push(st->s, &st->n_heap, b);
}

/* Encode one pre-tokenized word. */
static npulm_status encode_word(const struct npu_tok *tok, const unsigned char *w, size_t len,
                                struct npu_tok_scratch *s, struct npu_tok_out *out,
                                npulm_error *err) {
  if (len > INT32_MAX) return npu_fail(err, NPULM_ERR_ARG, "tokenize: word too long");
  if (tok->ignore_merges && len <= tok->max_len) { /* mapped text is at least as long */
    if (!npu_tok_reserve((void **)&s->text, &s->text_cap, 2 * len, 1)) goto nomem;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
      uint16_t cp = tok->byte_cp[w[i]];
      if (cp < 0x80) {
        s->text[n++] = (char)cp;
      } else {
        s->text[n++] = (char)(0xC0 | (cp >> 6));
        s->text[n++] = (char)(0x80 | (cp & 0x3F));
      }
    }
    int32_t id = npu_tok_lookup(tok, s->text, n);
    if (id >= 0) {
      npu_tok_push(out, id);
      return NPULM_OK;
    }
  }
  if (!npu_tok_reserve(&s->sym, &s->sym_cap, len, sizeof(struct bpe_sym))) goto nomem;
  struct bpe_state st = {.tok = tok, .sym = s->sym, .s = s, .n_heap = 0};
  int32_t n = (int32_t)len;
  for (int32_t i = 0; i < n; i++) {
    st.sym[i] = (struct bpe_sym){
        .id = tok->byte_tok[w[i]], .prev = i - 1, .next = i + 1 < n ? i + 1 : -1, .alive = true};
  }
  for (int32_t i = 1; i < n; i++) {
    if (!try_add(&st, i - 1, i)) goto nomem;
  }
  while (st.n_heap > 0) {
    struct npu_tok_bigram b = npu_tok_heap_pop(st.s, &st.n_heap);
    struct bpe_sym *l = &st.sym[b.left], *r = &st.sym[b.right];
    if (!l->alive || !r->alive || l->next != b.right || l->id != b.lid || r->id != b.rid) continue;
    l->id = b.id;
    r->alive = false;
    l->next = r->next;
    if (r->next >= 0) st.sym[r->next].prev = b.left;
    if (!try_add(&st, l->prev, b.left) || !try_add(&st, b.left, l->next)) goto nomem;
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = st.sym[i].next) {
    int32_t id = st.sym[i].id >= 0 ? st.sym[i].id : tok->unk;
    if (id >= 0) npu_tok_push(out, id);
  }
  return NPULM_OK;
nomem:
  return npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
}

npulm_status npu_tok_bpe_encode(const struct npu_tok *tok, const char *text, size_t len,
                                struct npu_tok_scratch *s, struct npu_tok_out *out,
                                npulm_error *err) {
  if (s->md == NULL) {
    s->md = pcre2_match_data_create(1, NULL);
    if (s->md == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
  }
  struct span *cur = s->spans, *next = s->spans2;
  size_t n_cur = 0, n_next = 0;
  npulm_status st = NPULM_OK;
  if (!span_push(&cur, &n_cur, &s->spans_cap, 0, len)) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
    goto done;
  }
  for (size_t r = 0; r < tok->n_regex; r++) {
    st = split_regex(tok->regex[r], text, cur, n_cur, &next, &n_next, &s->spans2_cap, s->md, err);
    if (st != NPULM_OK) goto done;
    struct span *tv = cur;
    cur = next;
    next = tv;
    size_t tc = s->spans_cap;
    s->spans_cap = s->spans2_cap;
    s->spans2_cap = tc;
    n_cur = n_next;
  }
  for (size_t i = 0; i < n_cur && st == NPULM_OK; i++) {
    st = encode_word(tok, (const unsigned char *)text + cur[i].off, cur[i].len, s, out, err);
  }
done:
  s->spans = cur;
  s->spans2 = next;
  return st;
}
