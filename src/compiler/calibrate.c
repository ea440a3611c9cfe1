/* Calibration: statistics of every named activation of the FP32 reference over calibration text. */
#include "compiler/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "ref/forward.h"

struct collector {
  struct npu_calib *calib;
  int32_t cap;
  int32_t last; /* index of the last activation seen: the next is usually the one after it */
  npulm_status status;
};

static int32_t bin_of(float v) {
  float a = fabsf(v);
  if (!(a > 0.0f)) return 0;
  int e;
  float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  int64_t bin = ((int64_t)(e - 1) - NPU_CALIB_MIN_EXP) * NPU_CALIB_BINS_PER_OCTAVE +
                (int64_t)((2.0f * m - 1.0f) * NPU_CALIB_BINS_PER_OCTAVE);
  return bin < 0 ? 0 : bin >= NPU_CALIB_BINS ? NPU_CALIB_BINS - 1 : (int32_t)bin;
}

/* Upper edge of histogram bin 'b'. */
static float bin_upper(int32_t b) {
  int octave = b / NPU_CALIB_BINS_PER_OCTAVE, frac = b % NPU_CALIB_BINS_PER_OCTAVE;
  return ldexpf(1.0f + (float)(frac + 1) / NPU_CALIB_BINS_PER_OCTAVE, octave + NPU_CALIB_MIN_EXP);
}

/* The statistics of 'name' ('n' channels, or 0 for a per-head name whose length varies). */
static struct npu_act_stats *find_or_add(struct collector *c, const char *name, int32_t n) {
  struct npu_calib *cal = c->calib;
  /* usually the one after the last, or (scores and probabilities, head after head) next to it */
  for (int32_t d = 1; d >= -1 && cal->n_stats > 0; d--) {
    int32_t at = c->last + d;
    at = at < 0 ? cal->n_stats - 1 : at >= cal->n_stats ? 0 : at;
    if (strcmp(cal->stats[at].name, name) == 0) {
      c->last = at;
      return &cal->stats[at];
    }
  }
  for (int32_t i = 0; i < cal->n_stats; i++) {
    if (strcmp(cal->stats[i].name, name) == 0) {
      c->last = i;
      return &cal->stats[i];
    }
  }
  if (cal->n_stats == c->cap) {
    int32_t cap = c->cap ? 2 * c->cap : 64;
    struct npu_act_stats *bigger = realloc(cal->stats, (size_t)cap * sizeof(*bigger));
    if (bigger == NULL) return NULL;
    cal->stats = bigger;
    c->cap = cap;
  }
  struct npu_act_stats *s = &cal->stats[cal->n_stats];
  memset(s, 0, sizeof(*s));
  snprintf(s->name, sizeof(s->name), "%s", name);
  s->n_channels = n;
  s->min = INFINITY;
  s->max = -INFINITY;
  s->chan_absmax = n > 0 ? calloc((size_t)n, sizeof(float)) : NULL;
  if (n > 0 && s->chan_absmax == NULL) return NULL;
  c->last = cal->n_stats++;
  return s;
}

static void observe(void *user, int layer, const char *what, const float *v, int n) {
  struct collector *c = user;
  if (c->status != NPULM_OK) return;
  char name[NPU_IR_NAME_MAX];
  if (layer >= 0) snprintf(name, sizeof(name), "blk.%d.%s", layer, what);
  else snprintf(name, sizeof(name), "%s", what);
  int32_t channels = npu_ref_per_head(what) ? 0 : n;
  struct npu_act_stats *s = find_or_add(c, name, channels);
  if (s == NULL || s->n_channels != channels) {
    c->status = s == NULL ? NPULM_ERR_NOMEM : NPULM_ERR_ARG;
    return;
  }
  for (int i = 0; i < n; i++) {
    float x = v[i], a = fabsf(x);
    if (x < s->min) s->min = x;
    if (x > s->max) s->max = x;
    if (channels > 0 && a > s->chan_absmax[i]) s->chan_absmax[i] = a;
    s->hist[bin_of(x)]++;
  }
  s->count += (uint64_t)n;
}

void npu_calib_free(struct npu_calib *c) {
  if (c == NULL) return;
  for (int32_t i = 0; i < c->n_stats; i++) free(c->stats[i].chan_absmax);
  free(c->stats);
  free(c);
}

npulm_status npu_calibrate(const struct npulm_model *m, const int32_t *tokens, size_t n_tokens,
                           int32_t window, int32_t bos, npulm_progress_fn progress, void *user,
                           struct npu_calib **out, npulm_error *err) {
  *out = NULL;
  if (n_tokens == 0 || window < 2) {
    return npu_fail(err, NPULM_ERR_ARG, "calibration needs text and a window of at least 2 tokens");
  }
  struct collector c = {.last = -1, .status = NPULM_OK};
  struct npu_ref_state state;
  c.calib = calloc(1, sizeof(*c.calib));
  float *logits = malloc((size_t)m->cfg.n_vocab * sizeof(float));
  npulm_status st = c.calib == NULL || logits == NULL
                        ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory")
                        : npu_ref_state_init(&state, &m->cfg, window, err);
  if (st != NPULM_OK) {
    free(logits);
    npu_calib_free(c.calib);
    return st;
  }
  struct npu_ref_observer obs = {.fn = observe, .user = &c};
  size_t done = 0;
  while (done < n_tokens && c.status == NPULM_OK) {
    /* one window from an empty cache; BOS first, as the model saw it in training */
    int pos = 0;
    if (bos >= 0) npu_ref_forward(m, &state, bos, pos++, logits, &obs);
    for (; pos < window && done < n_tokens; pos++, done++) {
      npu_ref_forward(m, &state, tokens[done], pos, logits, &obs);
    }
    if (progress != NULL) progress(user, done, n_tokens);
  }
  npu_ref_state_free(&state);
  free(logits);
  if (c.status != NPULM_OK) {
    npu_calib_free(c.calib);
    return npu_fail(err, c.status, "calibration failed: %s",
                    c.status == NPULM_ERR_NOMEM ? "out of memory"
                                                : "inconsistent activation sizes");
  }
  c.calib->n_tokens = done;
  *out = c.calib;
  return NPULM_OK;
}

const struct npu_act_stats *npu_calib_find(const struct npu_calib *c, const char *name) {
  for (int32_t i = 0; i < c->n_stats; i++) {
    if (strcmp(c->stats[i].name, name) == 0) return &c->stats[i];
  }
  return NULL;
}

float npu_calib_percentile(const struct npu_act_stats *s, double p) {
  float absmax = fmaxf(fabsf(s->min), fabsf(s->max));
  if (p >= 1.0 || s->count == 0) return absmax;
  uint64_t want = (uint64_t)ceil(p * (double)s->count), seen = 0;
  for (int32_t b = 0; b < NPU_CALIB_BINS; b++) {
    seen += s->hist[b];
    if (seen >= want) return fminf(bin_upper(b), absmax);
  }
  return absmax;
}

/* Original prose written for npulm: everyday English, simple and varied, as small llama models
 * see in training. Used when the user passes no --calib file. */
const char npu_calib_default_text[] =
    "Once upon a time, in a small town near the sea, there lived a boy named Tom. Tom liked to "
    "walk along the beach every morning and look for shells. One day he found a big blue shell "
    "with a tiny crab inside. \"Hello, little crab,\" said Tom. \"Do you want to be my friend?\" "
    "The crab waved its claw, and Tom laughed. He carried the shell home very carefully and showed "
    "it to his mother. His mother smiled and said, \"That is a very special friend. We must take "
    "good care of him.\" So Tom made a small home for the crab with sand, water and a few smooth "
    "stones.\n"
    "The next day it was raining. Tom could not go outside, so he sat by the window and drew a "
    "picture of the sea. He drew the sun, the waves, a red boat and a happy fish. When his sister "
    "Mia came in, she asked if she could help. Together they painted the sky yellow and orange. "
    "\"It looks like a sunset,\" said Mia. They hung the picture on the wall, and everyone who saw "
    "it felt warm and happy.\n"
    "Lily had a little dog called Max. Max was brown and white and loved to run in the park. "
    "Every afternoon, Lily threw a ball and Max ran fast to bring it back. One afternoon the ball "
    "rolled under a big bush. Max barked and barked, but he could not reach it. Lily got down on "
    "her knees and looked under the bush. She saw the ball, and next to it a small bird with a "
    "hurt wing. Lily was gentle. She picked up the bird and took it to her dad, who knew how to "
    "help animals. After a few days, the bird could fly again. Lily and Max watched it fly high "
    "into the blue sky, and they were very proud.\n"
    "Ben and Sara wanted to build the tallest tower in the world. They used blocks, boxes, books "
    "and even a pillow. The tower grew and grew until it was taller than Ben. Then Sara put one "
    "more block on top, and the tower began to shake. \"Oh no!\" they shouted, as everything fell "
    "down with a loud crash. For a moment they were sad. Then Ben started to laugh, and Sara "
    "laughed too. \"Let's build it again,\" said Sara, \"but this time we will make the bottom "
    "wider.\" They worked slowly and carefully, and the new tower stood strong.\n"
    "An old owl lived in a tall tree at the edge of the forest. At night she watched over the "
    "animals while they slept. The rabbits, the mice and the deer all trusted her. One cold night "
    "the wind was very strong, and a young fox lost his way home. He was scared and began to cry. "
    "The owl flew down and said, \"Do not be afraid. Follow the light of the moon, and you will "
    "find the river. Your home is on the other side.\" The fox thanked the owl and walked along "
    "the bright path until he saw his mother waiting for him. From that day on, the fox always "
    "said goodnight to the wise old owl.\n"
    "In the kitchen, Grandma was making cookies. She let Anna mix the flour, the sugar and the "
    "butter in a big bowl. Anna added chocolate chips and a little bit of love, as Grandma always "
    "said. When the cookies came out of the oven, the whole house smelled sweet. They put some "
    "cookies on a plate and took them to the neighbors. The neighbors were surprised and very "
    "thankful. Anna learned that sharing makes a good day even better.\n";
