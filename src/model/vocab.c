/* The vocabulary's tables and what the tokenizer's files share: the text -> id and merge hash
 * tables, the output and scratch helpers, the merge queue of both algorithms. Below the front end
 * (tokenizer.c) and the algorithms (tokenizer_spm.c, tokenizer_bpe.c), which all call into it. */
#include <stdlib.h>
#include <string.h>

#include "model/vocab.h"

/* ---- Hash tables ---------------------------------------------------------------------------- */

/* FNV-1a, 64-bit. */
static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

/* splitmix64 finalizer. */
static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* Smallest power of two >= 2 * n (at least 16), or 0 on overflow. */
size_t npu_tok_table_size(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) {
    if (cap > SIZE_MAX / 2) return 0;
    cap *= 2;
  }
  return cap;
}

int32_t npu_tok_lookup(const struct npu_tok *tok, const char *s, size_t n) {
  if (n == 0 || n > tok->max_len) return -1;
  for (size_t i = (size_t)hash_bytes(s, n) & tok->slot_mask;; i = (i + 1) & tok->slot_mask) {
    int32_t id = tok->slots[i];
    if (id < 0) return -1;
    if (tok->len[id] == n && memcmp(tok->pool + tok->off[id], s, n) == 0) return id;
  }
}

/* Insert token 'id' unless a token with the same text is there already (the first one wins, as
 * in llama.cpp's map). The table has room: it holds at most half its size. */
void npu_tok_insert_token(struct npu_tok *tok, int32_t id) {
  const char *s = tok->pool + tok->off[id];
  size_t n = tok->len[id];
  for (size_t i = (size_t)hash_bytes(s, n) & tok->slot_mask;; i = (i + 1) & tok->slot_mask) {
    int32_t other = tok->slots[i];
    if (other < 0) {
      tok->slots[i] = id;
      return;
    }
    if (tok->len[other] == n && memcmp(tok->pool + tok->off[other], s, n) == 0) return;
  }
}

const struct npu_tok_merge *npu_tok_find_merge(const struct npu_tok *tok, int32_t left,
                                               int32_t right) {
  if (tok->merges == NULL) return NULL;
  uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  for (size_t i = (size_t)hash_u64(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
    const struct npu_tok_merge *m = &tok->merges[i];
    if (m->rank < 0) return NULL;
    if (m->key == key) return m;
  }
}

/* Insert a merge unless the pair is there already (the lowest rank wins, as in llama.cpp). */
void npu_tok_insert_merge(struct npu_tok *tok, int32_t left, int32_t right, int32_t rank,
                          int32_t id) {
  uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
  for (size_t i = (size_t)hash_u64(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
    struct npu_tok_merge *m = &tok->merges[i];
    if (m->rank < 0) {
      *m = (struct npu_tok_merge){.key = key, .rank = rank, .id = id};
      return;
    }
    if (m->key == key) return;
  }
}

/* ---- Shared helpers ------------------------------------------------------------------------- */

bool npu_tok_reserve(void **buf, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t n = *cap < 64 ? 64 : *cap;
  while (n < need) {
    if (n > SIZE_MAX / 2) return false;
    n *= 2;
  }
  if (n > SIZE_MAX / elem) return false;
  void *p = realloc(*buf, n * elem);
  if (p == NULL) return false;
  *buf = p;
  *cap = n;
  return true;
}

void npu_tok_scratch_free(struct npu_tok_scratch *s) {
  free(s->text);
  free(s->sym);
  free(s->heap);
  free(s->spans);
  free(s->spans2);
  pcre2_match_data_free(s->md); /* accepts NULL */
  memset(s, 0, sizeof(*s));
}

void npu_tok_push_bytes(const struct npu_tok *tok, const char *s, size_t n, struct npu_tok_out *o) {
  for (size_t i = 0; i < n; i++) {
    if (tok->byte_tok[(unsigned char)s[i]] < 0) {
      if (tok->unk >= 0) npu_tok_push(o, tok->unk);
      return;
    }
  }
  for (size_t i = 0; i < n; i++) npu_tok_push(o, tok->byte_tok[(unsigned char)s[i]]);
}

/* ---- Merge queue ---------------------------------------------------------------------------- */

static bool bigram_before(const struct npu_tok_bigram *a, const struct npu_tok_bigram *b) {
  return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

bool npu_tok_heap_push(struct npu_tok_scratch *s, size_t *n, struct npu_tok_bigram b) {
  if (!npu_tok_reserve(&s->heap, &s->heap_cap, *n + 1, sizeof(b))) return false;
  struct npu_tok_bigram *h = s->heap;
  size_t i = (*n)++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!bigram_before(&b, &h[parent])) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = b;
  return true;
}

struct npu_tok_bigram npu_tok_heap_pop(struct npu_tok_scratch *s, size_t *n) {
  struct npu_tok_bigram *h = s->heap;
  struct npu_tok_bigram top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && bigram_before(&h[c + 1], &h[c])) c++;
    if (!bigram_before(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n > 0) h[i] = last;
  return top;
}
