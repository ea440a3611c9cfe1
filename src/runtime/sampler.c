/* Token sampling: greedy, or temperature with optional top-k and top-p (nucleus) truncation,
 * from a seeded generator so that a seed reproduces a generation. */
#include <math.h>
#include <stdlib.h>

#include "base/common.h"

struct candidate {
  float logit;
  int32_t id;
};

struct npulm_sampler {
  npulm_sampler_params params;
  int n_vocab;
  uint64_t rng;
  struct candidate *cand; /* (n_vocab) scratch, allocated once */
};

npulm_sampler_params npulm_sampler_default_params(void) {
  npulm_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 0};
  return p;
}

npulm_status npulm_sampler_create(const npulm_sampler_params *params, int n_vocab,
                                  npulm_sampler **sampler_out, npulm_error *err) {
  *sampler_out = NULL;
  if (!(params->temp >= 0.0f) || !isfinite(params->temp) || params->top_k < 0 ||
      !(params->top_p > 0.0f) || params->top_p > 1.0f || n_vocab <= 0) {
    return npu_fail(
        err, NPULM_ERR_ARG,
        "bad sampling parameters: temp %g (finite, >= 0), top-k %d (>= 0), top-p %g (0..1]",
        (double)params->temp, params->top_k, (double)params->top_p);
  }
  struct npulm_sampler *s = calloc(1, sizeof(*s));
  if (s != NULL) s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
  if (s == NULL || s->cand == NULL) {
    free(s);
    return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  }
  s->params = *params;
  s->n_vocab = n_vocab;
  /* splitmix64 of the seed, so that nearby seeds give unrelated streams (and 0 is valid) */
  uint64_t z = params->seed + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  s->rng = (z ^ (z >> 31)) | 1u;
  *sampler_out = s;
  return NPULM_OK;
}

void npulm_sampler_free(npulm_sampler *s) {
  if (s == NULL) return;
  free(s->cand);
  free(s);
}

/* Uniform in [0, 1) from xorshift64*. */
static float next_uniform(npulm_sampler *s) {
  s->rng ^= s->rng >> 12;
  s->rng ^= s->rng << 25;
  s->rng ^= s->rng >> 27;
  return (float)((s->rng * 0x2545F4914F6CDD1DULL) >> 40) * (1.0f / 16777216.0f);
}

static int32_t argmax(const float *logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

static int cmp_desc(const void *a, const void *b) {
  float x = ((const struct candidate *)a)->logit, y = ((const struct candidate *)b)->logit;
  return (x < y) - (x > y);
}

/* Move the k largest candidates to the front (in no order) with a quickselect partition. */
static void select_top_k(struct candidate *c, int n, int k) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    float pivot = c[lo + (hi - lo) / 2].logit;
    int i = lo, j = hi;
    while (i <= j) {
      while (c[i].logit > pivot) i++;
      while (c[j].logit < pivot) j--;
      if (i <= j) {
        struct candidate t = c[i];
        c[i++] = c[j];
        c[j--] = t;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
}

int32_t npulm_sampler_sample(npulm_sampler *s, const float *logits) {
  const npulm_sampler_params *p = &s->params;
  if (p->temp <= 0.0f) return argmax(logits, s->n_vocab);
  int n = s->n_vocab;
  for (int i = 0; i < n; i++) s->cand[i] = (struct candidate){logits[i], i};
  /* top-k: keep the k most likely */
  if (p->top_k > 0 && p->top_k < n) {
    select_top_k(s->cand, n, p->top_k);
    n = p->top_k;
  }
  qsort(s->cand, (size_t)n, sizeof(*s->cand), cmp_desc);
  /* temperature softmax over the survivors (reusing 'logit' to hold the probability) */
  float max = s->cand[0].logit, sum = 0.0f;
  for (int i = 0; i < n; i++) {
    s->cand[i].logit = expf((s->cand[i].logit - max) / p->temp);
    sum += s->cand[i].logit;
  }
  /* top-p: the smallest prefix whose probability reaches p */
  if (p->top_p < 1.0f) {
    float cum = 0.0f;
    for (int i = 0; i < n; i++) {
      cum += s->cand[i].logit / sum;
      if (cum >= p->top_p) {
        n = i + 1;
        break;
      }
    }
    sum = 0.0f;
    for (int i = 0; i < n; i++) sum += s->cand[i].logit;
  }
  float r = next_uniform(s) * sum;
  for (int i = 0; i < n; i++) {
    r -= s->cand[i].logit;
    if (r < 0.0f) return s->cand[i].id;
  }
  return s->cand[n - 1].id;
}
