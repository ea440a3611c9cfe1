/* SentencePiece-style encoding (tokenizer.ggml.model = "llama"), as llama.cpp does it: the text is
 * split into UTF-8 characters, then the adjacent pair whose concatenation is the token with the
 * highest score is merged (leftmost first on ties) until no pair forms a token; characters left
 * over that are not tokens fall back to their bytes' "<0xXX>" tokens. */
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "model/vocab.h"

/* A run of the escaped text: one character at first, a token after merges. */
struct spm_sym {
  size_t start; /* offset in the escaped text */
  uint32_t n;   /* bytes; 0 once merged into the symbol on its left */
  int32_t prev; /* neighbours in the chain, -1 at the ends */
  int32_t next;
  int32_t id; /* token of the run, or -1 */
};

/* A candidate merge of 'left' and its right neighbour 'right' into token 'id'. It is stale, and
 * skipped, unless both symbols still have the sizes they had when it was made ('size'). */

struct spm_state {
  const struct npu_tok *tok;
  const char *text;
  struct spm_sym *sym;
  struct npu_tok_scratch *s; /* owns the heap */
  size_t n_heap;
};

/* Queue the merge of symbols 'left' and 'right' if their concatenation is a token. Return false
 * only when out of memory. */
static bool try_add(struct spm_state *st, int32_t left, int32_t right) {
  if (left < 0 || right < 0) return true;
  const struct spm_sym *l = &st->sym[left], *r = &st->sym[right];
  size_t size = (size_t)l->n + r->n;
  int32_t id = npu_tok_lookup(st->tok, st->text + l->start, size);
  if (id < 0) return true;
  struct npu_tok_bigram b = {.priority = st->tok->score[id],
                             .left = left,
                             .right = right,
                             .size = (uint32_t)size,
                             .id = id};
  return npu_tok_heap_push(st->s, &st->n_heap, b);
}

npulm_status npu_tok_spm_encode(const struct npu_tok *tok, const char *text, size_t len,
                                bool space_prefix, struct npu_tok_scratch *s,
                                struct npu_tok_out *out, npulm_error *err) {
  /* escape: every space becomes U+2581, one more in front when asked */
  size_t n_spaces = 0;
  for (size_t i = 0; i < len; i++) n_spaces += text[i] == ' ';
  if (len > (size_t)INT32_MAX / 3 - 1) {
    return npu_fail(err, NPULM_ERR_ARG, "tokenize: text of %zu bytes is too long", len);
  }
  size_t n_esc = len + 2 * n_spaces + (space_prefix ? 3 : 0);
  if (!npu_tok_reserve((void **)&s->text, &s->text_cap, n_esc, 1) ||
      !npu_tok_reserve(&s->sym, &s->sym_cap, n_esc, sizeof(struct spm_sym))) {
    return npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
  }
  char *esc = s->text;
  size_t pos = 0;
  if (space_prefix) {
    memcpy(esc, "\xe2\x96\x81", 3);
    pos = 3;
  }
  for (size_t i = 0; i < len; i++) {
    if (text[i] == ' ') {
      memcpy(esc + pos, "\xe2\x96\x81", 3);
      pos += 3;
    } else {
      esc[pos++] = text[i];
    }
  }

  /* one symbol per UTF-8 character; a byte that does not start a whole sequence is a symbol of
   * its own (llama.cpp trusts the lead byte, so "\xe3\x82 " swallows part of the escaped space
   * and no longer decodes to the input) */
  struct spm_state st = {.tok = tok, .text = esc, .sym = s->sym, .s = s, .n_heap = 0};
  int32_t n_sym = 0;
  for (size_t off = 0; off < n_esc;) {
    size_t clen = npu_tok_utf8_len((unsigned char)esc[off]);
    if (clen > n_esc - off) clen = 1;
    for (size_t k = 1; k < clen; k++) {
      if (((unsigned char)esc[off + k] & 0xC0) != 0x80) clen = 1;
    }
    st.sym[n_sym] = (struct spm_sym){.start = off,
                                     .n = (uint32_t)clen,
                                     .prev = n_sym - 1,
                                     .next = off + clen == n_esc ? -1 : n_sym + 1,
                                     .id = npu_tok_lookup(tok, esc + off, clen)};
    n_sym++;
    off += clen;
  }

  /* merge the best pair until none is left */
  for (int32_t i = 1; i < n_sym; i++) {
    if (!try_add(&st, i - 1, i)) goto nomem;
  }
  while (st.n_heap > 0) {
    struct npu_tok_bigram b = npu_tok_heap_pop(st.s, &st.n_heap);
    struct spm_sym *l = &st.sym[b.left], *r = &st.sym[b.right];
    if (l->n == 0 || r->n == 0 || (size_t)l->n + r->n != b.size) continue;
    l->n += r->n;
    l->id = b.id;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) st.sym[r->next].prev = b.left;
    if (!try_add(&st, l->prev, b.left) || !try_add(&st, b.left, l->next)) goto nomem;
  }

  for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0; i = st.sym[i].next) {
    const struct spm_sym *y = &st.sym[i];
    if (y->id >= 0) {
      npu_tok_push(out, y->id);
    } else {
      npu_tok_push_bytes(tok, esc + y->start, y->n, out);
    }
  }
  return NPULM_OK;
nomem:
  return npu_fail(err, NPULM_ERR_NOMEM, "tokenize: out of memory");
}
