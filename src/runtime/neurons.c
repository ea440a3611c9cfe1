/* Weights under a memory budget and the neuron cache (neurons.h). */
/* preadv: not in POSIX 2008, but in every Unix this targets */
#define _DEFAULT_SOURCE
#include "runtime/neurons.h"

#include <assert.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pages.h"
#include "io/gguf.h"
#include "model/model.h"
#include "program/program.h"
#include "program/sparse_data.h"

enum {
  MAX_IOV = 64,
  LOOK_AHEAD = 8,   /* window slots a miss may take, from the layer's clock hand */
  SCRATCH_MIN = 64, /* slots for a round's misses (4 clusters) */
};

/* The share of a layer's resident slots that hold its most frequent neurons for good, in 256ths;
 * the rest is its window (bench/RESULTS.md measures the choice). */
enum { HOT_SHARE_Q8 = 192 };

/* A read of the I/O thread: adjacent neurons of one cluster into their slots, parts
 * first_part .. first_part + n_parts - 1 (0 gate rows, 1 up rows, 2 down columns): one run of
 * the file per part. */
struct read_run {
  uint64_t offset; /* of the first neuron's gate row in the file */
  int32_t first_miss, count;
  int8_t first_part, n_parts;
};

struct npu_residency {
  const struct npu_sparse *sp;
  const struct npu_gguf *file;
  const uint8_t *streamed; /* (n_qsites) the program's */
  size_t kp;               /* bytes of each of a neuron's three vectors */
  size_t bundle;           /* bytes of a slot: gate row, up row, down column, 3 kp */
  size_t part; /* in the file, from a neuron's gate row to its up row (and on to its down) */
  int32_t n_layers, n_ff;
  /* slots: each layer's resident ones (per_layer: n_hot pinned, then its window), then the
   * scratch shared by all layers */
  int8_t *slots;
  size_t slots_bytes;
  int32_t per_layer, n_hot, n_scratch, n_slots;
  int32_t scratch_used; /* by the round under way */
  int32_t *slot_of;     /* (n_layers * n_ff) the slot holding each neuron, or -1 */
  int32_t *owner;       /* (n_slots) the neuron (layer * n_ff + j) a slot holds, or -1 */
  uint8_t *full;        /* (n_slots) holds its neuron's up row and down column, not only gate */
  uint64_t *used;       /* (n_slots) the round that last used it: not to be taken in it */
  uint8_t *history;     /* (n_layers * n_ff) kept in each of its layer's last 8 steps (bit 0) */
  int32_t *hand;        /* (n_layers) the window's clock hand */
  uint64_t n_rounds;    /* gate gets: a layer step's rounds */
  /* the reads the last get posted, for the I/O thread */
  int32_t *miss_slot; /* (n_ff) */
  int32_t *miss_id;   /* (n_ff) */
  int32_t n_miss;
  int32_t *pending;      /* (n_ff) a get's neurons not in memory */
  struct read_run *runs; /* (n_ff) */
  int32_t n_runs;
  pthread_t io;
  bool io_started;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool quit;
  uint64_t posted, done; /* gets posted to the I/O thread and completed (guarded by lock) */
  npulm_memory_stats stats;
};

/* A read of a file that was checksummed when opened failed: the file changed under the session
 * or its storage failed. A decode step cannot fail (backends/exec.h) and must not compute with
 * missing weights: say so in one line and stop. */
static _Noreturn void io_failed(const char *what) {
  fprintf(stderr, "npulm: %s: the program file changed while in use, or its storage failed\n",
          what);
  abort();
}

/* Where neuron j of layer l's gate row is in the file. */
static uint64_t gate_offset(const struct npu_residency *r, int32_t l, int32_t j) {
  const uint8_t *b = (const uint8_t *)r->sp->layers[l].bundles + npu_sparse_gate_at(r->kp, j);
  return (uint64_t)(b - r->file->base);
}

/* Read 'len' bytes at 'offset' into the iovecs, all of them; then drop them from the page
 * cache, so that reading them again comes from storage (the budget holds the cache too). */
static bool read_fully(const struct npu_residency *r, struct iovec *iov, int n_iov, uint64_t offset,
                       size_t len) {
  size_t got = 0;
  while (got < len) {
    const ssize_t k = preadv(r->file->fd, iov, n_iov, (off_t)(offset + got));
    if (k <= 0) return false;
    got += (size_t)k;
    size_t skip = (size_t)k; /* advance the iovecs past what was read */
    while (n_iov > 0 && skip >= iov->iov_len) {
      skip -= iov->iov_len;
      iov++;
      n_iov--;
    }
    if (n_iov > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + skip;
      iov->iov_len -= skip;
    }
  }
  (void)posix_fadvise(r->file->fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED);
  return true;
}

/* Read run 'run''s neurons from the file into their slots (miss_slot), MAX_IOV at a time: each
 * part a contiguous range of the file. */
static bool read_run(const struct npu_residency *r, const struct read_run *run) {
  for (int32_t i = 0; i < run->count; i += MAX_IOV) {
    const int32_t n = run->count - i < MAX_IOV ? run->count - i : MAX_IOV;
    const int32_t *slots = r->miss_slot + run->first_miss + i;
    for (int p = run->first_part; p < run->first_part + run->n_parts; p++) {
      struct iovec iov[MAX_IOV];
      for (int32_t m = 0; m < n; m++) {
        iov[m].iov_base = r->slots + (size_t)slots[m] * r->bundle + (size_t)p * r->kp;
        iov[m].iov_len = r->kp;
      }
      const uint64_t at = run->offset + (uint64_t)i * r->kp + (uint64_t)p * r->part;
      if (!read_fully(r, iov, n, at, (size_t)n * r->kp)) return false;
    }
  }
  return true;
}

/* The reads posted. A file that fails to read now was checksummed when opened: it changed under
 * us, which is fatal. */
static void do_reads(struct npu_residency *r) {
  const double t0 = npu_now();
  uint64_t bytes = 0;
  for (int32_t k = 0; k < r->n_runs; k++) {
    if (!read_run(r, &r->runs[k])) io_failed("cannot read neuron bundles");
    bytes += (uint64_t)r->runs[k].count * (uint64_t)r->runs[k].n_parts * r->kp;
  }
  r->stats.bytes_read += bytes;
  r->stats.read_s += npu_now() - t0;
}

static void *io_thread(void *arg) {
  struct npu_residency *r = arg;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    while (!r->quit && r->done == r->posted) pthread_cond_wait(&r->cond, &r->lock);
    if (r->quit) break;
    pthread_mutex_unlock(&r->lock);
    do_reads(r);
    pthread_mutex_lock(&r->lock);
    r->done = r->posted;
    pthread_cond_broadcast(&r->cond);
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* Queue the read of neuron j of 'layer' into slot s, parts first_part .. + n_parts - 1: with
 * the run before it if it is the next neuron of the same cluster. */
static void queue_read(struct npu_residency *r, int32_t layer, int32_t j, int32_t s, int first_part,
                       int n_parts) {
  const int32_t m = r->n_miss++;
  r->miss_id[m] = j;
  r->miss_slot[m] = s;
  struct read_run *last = r->n_runs > 0 ? &r->runs[r->n_runs - 1] : NULL;
  if (last != NULL && r->miss_id[m - 1] + 1 == j && j % NPU_SPARSE_CLUSTER != 0 &&
      last->first_part == first_part) {
    last->count++;
  } else {
    r->runs[r->n_runs++] =
        (struct read_run){gate_offset(r, layer, j), m, 1, (int8_t)first_part, (int8_t)n_parts};
  }
}

static void post_reads(struct npu_residency *r) {
  pthread_mutex_lock(&r->lock);
  r->posted++;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

static int popcount8(uint8_t v) {
  int c = 0;
  for (; v != 0; v &= (uint8_t)(v - 1)) c++;
  return c;
}

/* A slot for neuron g (= layer * n_ff + j), missed in this round: in the layer's window if g was
 * kept in more of the last 8 steps than the least kept of the LOOK_AHEAD window neurons after the
 * clock hand that this round does not use (an empty slot counts -1), which it then evicts; else
 * a scratch slot, let go at the next round; -1 if the scratch is used up (the neuron waits for
 * the next round). */
static int32_t take_slot(struct npu_residency *r, int32_t layer, int32_t g) {
  const int32_t first = layer * r->per_layer + r->n_hot, n_win = r->per_layer - r->n_hot;
  const int32_t look = n_win < LOOK_AHEAD ? n_win : LOOK_AHEAD;
  int32_t victim = -1, victim_score = 9;
  for (int32_t k = 0; k < look; k++) {
    const int32_t s = first + (r->hand[layer] + k) % n_win;
    if (r->used[s] == r->n_rounds) continue;
    const int score = r->owner[s] < 0 ? -1 : popcount8(r->history[r->owner[s]]);
    if (score < victim_score) {
      victim = s;
      victim_score = score;
    }
  }
  if (victim >= 0 && popcount8(r->history[g]) > victim_score) {
    r->hand[layer] = (victim - first + 1) % n_win;
    if (r->owner[victim] >= 0) r->slot_of[r->owner[victim]] = -1;
    return victim;
  }
  if (r->scratch_used == r->n_scratch) return -1;
  return r->n_layers * r->per_layer + r->scratch_used++;
}

/* The scratch slots of the round before: let go. */
static void release_scratch(struct npu_residency *r) {
  const int32_t first = r->n_layers * r->per_layer;
  for (int32_t s = first; s < first + r->scratch_used; s++) {
    r->slot_of[r->owner[s]] = -1;
    r->owner[s] = -1;
  }
  r->scratch_used = 0;
}

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* A round of a layer step's candidates: those whose gate row is in memory first; then those given
 * a slot (take_slot) and a read of their gate rows; then those left for the next round. */
static size_t get_gates(struct npu_residency *r, int32_t layer, bool first_round, int32_t *ids,
                        size_t n, const int8_t **out, size_t *n_given) {
  r->n_rounds++;
  release_scratch(r);
  r->n_miss = r->n_runs = 0;
  const int32_t base = layer * r->n_ff;
  if (first_round) { /* the histories move on by one step */
    uint8_t *h = r->history + base;
    for (int32_t j = 0; j < r->n_ff; j++) h[j] = (uint8_t)(h[j] << 1);
  }
  size_t n_hit = 0, n_pending = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t j = ids[i], s = r->slot_of[base + j];
    if (s >= 0) {
      r->used[s] = r->n_rounds;
      ids[n_hit++] = j;
    } else {
      r->pending[n_pending++] = j;
    }
  }
  size_t m = 0;
  for (; m < n_pending; m++) {
    const int32_t j = r->pending[m], s = take_slot(r, layer, base + j);
    if (s < 0) break;
    r->owner[s] = base + j;
    r->slot_of[base + j] = s;
    r->full[s] = 0;
    r->used[s] = r->n_rounds;
    queue_read(r, layer, j, s, 0, 1);
    ids[n_hit + m] = j;
  }
  for (size_t k = m; k < n_pending; k++) ids[n_hit + k] = r->pending[k];
  *n_given = n_hit + m;
  for (size_t i = 0; i < *n_given; i++)
    out[i] = r->slots + (size_t)r->slot_of[base + ids[i]] * r->bundle;
  r->stats.hits += n_hit;
  r->stats.misses += m;
  r->stats.bytes_used += (uint64_t)*n_given * r->kp;
  if (m > 0) post_reads(r);
  return n_hit;
}

/* Of a round's candidates, the kept: those whose up row and down column are in memory first, a
 * read of the others' (in file order); their histories take this step. */
static size_t get_rest(struct npu_residency *r, int32_t layer, int32_t *ids, size_t n,
                       const int8_t **out) {
  r->n_miss = r->n_runs = 0;
  const int32_t base = layer * r->n_ff;
  size_t n_ready = 0, n_pending = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t j = ids[i], s = r->slot_of[base + j];
    assert(s >= 0); /* a candidate of the step's gate get */
    if (r->full[s]) {
      ids[n_ready++] = j;
    } else {
      r->pending[n_pending++] = j;
    }
  }
  qsort(r->pending, n_pending, sizeof(int32_t), cmp_i32);
  for (size_t m = 0; m < n_pending; m++) {
    const int32_t j = r->pending[m], s = r->slot_of[base + j];
    r->full[s] = 1;
    queue_read(r, layer, j, s, 1, 2);
    ids[n_ready + m] = j;
  }
  uint8_t *h = r->history + base;
  for (size_t i = 0; i < n; i++) {
    out[i] = r->slots + (size_t)r->slot_of[base + ids[i]] * r->bundle;
    h[ids[i]] |= 1;
  }
  r->stats.bytes_used += (uint64_t)n * 2 * r->kp;
  if (n_pending > 0) post_reads(r);
  return n_ready;
}

static size_t cache_get(void *user, int32_t layer, enum npu_bundle_parts parts, int32_t *ids,
                        size_t n, const int8_t **out, size_t *n_given) {
  struct npu_residency *r = user;
  if (parts == NPU_BUNDLE_REST) {
    *n_given = n;
    return get_rest(r, layer, ids, n, out);
  }
  return get_gates(r, layer, parts == NPU_BUNDLE_GATE, ids, n, out, n_given);
}

static void cache_wait(void *user) {
  struct npu_residency *r = user;
  const double t0 = npu_now();
  pthread_mutex_lock(&r->lock);
  while (r->done != r->posted) pthread_cond_wait(&r->cond, &r->lock);
  pthread_mutex_unlock(&r->lock);
  r->stats.io_wait_s += npu_now() - t0;
}

struct npu_bundle_source npu_residency_source(struct npu_residency *r) {
  return (struct npu_bundle_source){r, cache_get, cache_wait, r->kp};
}

const uint8_t *npu_residency_streamed(const struct npu_residency *r) { return r->streamed; }

void npu_residency_stats(const struct npu_residency *r, npulm_memory_stats *out) {
  *out = r->stats;
}

void npu_residency_reset_stats(struct npu_residency *r) {
  r->stats.bytes_read = r->stats.bytes_used = r->stats.hits = r->stats.misses = 0;
  r->stats.read_s = r->stats.io_wait_s = 0.0;
}

void npu_residency_free(struct npu_residency *r) {
  if (r == NULL) return;
  if (r->io_started) {
    pthread_mutex_lock(&r->lock);
    r->quit = true;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->io, NULL);
  }
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  npu_pages_free(r->slots, r->slots_bytes);
  free(r->slot_of);
  free(r->owner);
  free(r->full);
  free(r->used);
  free(r->history);
  free(r->hand);
  free(r->miss_slot);
  free(r->miss_id);
  free(r->pending);
  free(r->runs);
  free(r);
}

/* Each layer's resident slots filled: its per_layer neurons that the most calibration inputs
 * kept (ties: the first), the n_hot most frequent of them pinned; read whole, in file order. */
static npulm_status fill_resident(struct npu_residency *r, npulm_error *err) {
  uint64_t *order = malloc((size_t)r->n_ff * sizeof(uint64_t));
  if (order == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t l = 0; l < r->n_layers; l++) {
    const uint32_t *freq = r->sp->layers[l].freq;
    for (int32_t j = 0; j < r->n_ff; j++) /* most frequent first, then by index */
      order[j] = (uint64_t)(UINT32_MAX - freq[j]) << 32 | (uint32_t)j;
    qsort(order, (size_t)r->n_ff, sizeof(uint64_t), cmp_u64);
    const int32_t base = l * r->n_ff;
    for (int32_t i = 0; i < r->per_layer; i++) {
      const int32_t j = (int32_t)(uint32_t)order[i], s = l * r->per_layer + i;
      r->slot_of[base + j] = s;
      r->owner[s] = base + j;
      r->full[s] = 1;
    }
    r->n_miss = r->n_runs = 0;
    for (int32_t j = 0; j < r->n_ff; j++) {
      if (r->slot_of[base + j] >= 0) queue_read(r, l, j, r->slot_of[base + j], 0, 3);
    }
    for (int32_t k = 0; k < r->n_runs; k++) {
      if (!read_run(r, &r->runs[k])) {
        free(order);
        return npu_fail(err, NPULM_ERR_IO, "cannot read the program file's neuron bundles");
      }
    }
  }
  free(order);
  return NPULM_OK;
}

npulm_status npu_residency_create(const struct npulm_model *m, struct npu_residency **out,
                                  npulm_error *err) {
  *out = NULL;
  const struct npu_program *p = m->program;
  if (p == NULL || p->sparse == NULL || p->streamed == NULL || m->gguf->fd < 0) {
    return npu_fail(
        err, NPULM_ERR_ARG,
        "a memory budget needs a program file compiled with --sparsity (npulm compile)");
  }
  struct npu_residency *r = calloc(1, sizeof(*r));
  if (r == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  r->sp = p->sparse;
  r->file = m->gguf;
  r->kp = (size_t)r->sp->kp;
  r->bundle = 3 * r->kp;
  r->part = npu_sparse_part(r->kp);
  r->n_layers = r->sp->n_layers;
  r->n_ff = r->sp->layers[0].n_ff;
  const uint64_t budget = m->mem_budget;
  r->stats.budget = budget;
  /* the weights held and streamed, as the program was loaded (npu_sparse_streamed) */
  r->streamed = p->streamed;
  const uint64_t pinned = p->held_bytes;
  uint64_t largest_streamed = 0;
  for (int32_t i = 0; i < p->n_qsites; i++) {
    if (!r->streamed[i]) continue;
    r->stats.streamed_bytes += p->qsites[i].packed_size;
    if (p->qsites[i].packed_size > largest_streamed) largest_streamed = p->qsites[i].packed_size;
  }
  r->stats.pinned_bytes = pinned;
  npulm_status st = NPULM_OK;
  /* the neuron cache: what is left beside the streamed weights in use (one used, the next one
   * read ahead: both in memory, in the process or the page cache); a scratch of at least
   * SCRATCH_MIN neurons (or a sixteenth of a layer's), the rest shared equally by the layers */
  const uint64_t taken = pinned + 2 * largest_streamed;
  const uint64_t left = budget > taken ? budget - taken : 0;
  const uint64_t slots = left / r->bundle, n_ff = (uint64_t)r->n_ff;
  const uint64_t all = (uint64_t)r->n_layers * n_ff;
  uint64_t scratch = n_ff / 16 > SCRATCH_MIN ? n_ff / 16 : SCRATCH_MIN;
  if (scratch > n_ff) scratch = n_ff;
  if (all > (uint64_t)INT32_MAX) {
    st = npu_fail(err, NPULM_ERR_UNSUPPORTED, "the neuron cache cannot index %llu neurons",
                  (unsigned long long)all);
  } else if (slots < scratch) {
    st = npu_fail(err, NPULM_ERR_ARG,
                  "a memory budget of %llu bytes leaves %llu for the neuron cache; it needs at "
                  "least %llu (a scratch of %llu neurons)",
                  (unsigned long long)budget, (unsigned long long)left,
                  (unsigned long long)(scratch * r->bundle), (unsigned long long)scratch);
  } else if (slots >= all) {
    r->per_layer = r->n_ff;
  } else {
    uint64_t per = (slots - scratch) / (uint64_t)r->n_layers;
    /* a scratch beyond a layer's non-resident neurons is not needed: the layers share it */
    if (per + scratch > n_ff) per = (slots - n_ff) / (uint64_t)(r->n_layers - 1);
    r->per_layer = (int32_t)(per < n_ff ? per : n_ff);
    r->n_scratch = (int32_t)(n_ff - (uint64_t)r->per_layer < scratch ? n_ff - (uint64_t)r->per_layer
                                                                     : scratch);
  }
  if (st == NPULM_OK) {
    r->n_hot = (int32_t)((int64_t)r->per_layer * HOT_SHARE_Q8 / 256);
    r->n_slots = r->n_layers * r->per_layer + r->n_scratch;
    r->slots_bytes = (size_t)r->n_slots * r->bundle;
    r->slots = npu_pages_alloc(r->slots_bytes);
    r->slot_of = malloc((size_t)all * sizeof(int32_t));
    r->owner = malloc((size_t)r->n_slots * sizeof(int32_t));
    r->full = calloc((size_t)r->n_slots, 1);
    r->used = calloc((size_t)r->n_slots, sizeof(uint64_t));
    r->history = calloc((size_t)all, 1);
    r->hand = calloc((size_t)r->n_layers, sizeof(int32_t));
    r->miss_slot = malloc((size_t)r->n_ff * sizeof(int32_t));
    r->miss_id = malloc((size_t)r->n_ff * sizeof(int32_t));
    r->pending = malloc((size_t)r->n_ff * sizeof(int32_t));
    r->runs = malloc((size_t)r->n_ff * sizeof(*r->runs));
    if (r->slots == NULL || r->slot_of == NULL || r->owner == NULL || r->full == NULL ||
        r->used == NULL || r->history == NULL || r->hand == NULL || r->miss_slot == NULL ||
        r->miss_id == NULL || r->pending == NULL || r->runs == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory for the neuron cache");
    }
  }
  if (st == NPULM_OK) {
    for (uint64_t i = 0; i < all; i++) r->slot_of[i] = -1;
    for (int32_t s = 0; s < r->n_slots; s++) r->owner[s] = -1;
    st = fill_resident(r, err);
  }
  if (st == NPULM_OK) {
    r->stats.hot_bytes = (uint64_t)r->n_layers * (uint64_t)r->n_hot * r->bundle;
    r->stats.cache_bytes = (uint64_t)r->n_layers * (uint64_t)(r->per_layer - r->n_hot) * r->bundle;
    r->stats.scratch_bytes = (uint64_t)r->n_scratch * r->bundle;
    if (pthread_create(&r->io, NULL, io_thread, r) != 0) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "cannot start the neuron cache's I/O thread");
    } else {
      r->io_started = true;
    }
  }
  if (st != NPULM_OK) {
    npu_residency_free(r);
    return st;
  }
  *out = r;
  return NPULM_OK;
}
