/* Weights under a memory budget and the neuron cache (neurons.h). */
/* preadv: not in POSIX 2008, but in every Unix this targets */
#define _DEFAULT_SOURCE
#include "runtime/neurons.h"

#include <assert.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
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

enum { MAX_IOV = 64 };

/* A read of the I/O thread: adjacent neurons of one cluster, into their slots (gate row, up row,
 * down column one after another in a slot): three runs of the file, one per part. */
struct read_run {
  uint64_t offset; /* of the first neuron's gate row in the file */
  int32_t first_miss, count;
};

struct npu_residency {
  const struct npu_sparse *sp;
  const struct npu_gguf *file;
  const uint8_t *streamed; /* (n_qsites) the program's */
  size_t kp;               /* bytes of each of a neuron's three vectors */
  size_t bundle;           /* bytes of a slot: 3 kp */
  size_t part; /* in the file, from a neuron's gate row to its up row (and on to its down) */
  int32_t n_layers, n_ff;
  /* slots: hot ones first (pinned), then the cache's */
  int8_t *slots;
  size_t slots_bytes;
  int32_t n_hot, n_slots;
  int32_t *slot_of; /* (n_layers * n_ff) the slot holding each neuron, or -1 */
  int32_t *owner;   /* (n_slots) the neuron (layer * n_ff + j) a slot holds, or -1 */
  uint64_t *used;   /* (n_slots) the get that last used it: not to be taken in that get */
  uint8_t *ref;     /* (n_slots) used since the clock last passed: a second chance */
  int32_t hand;     /* the clock's, over the cache's slots */
  uint64_t n_gets;
  /* the misses of the last get, for the I/O thread */
  int32_t *miss_slot; /* (n_ff) */
  int32_t *miss_id;   /* (n_ff) */
  int32_t miss_layer, n_miss;
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

/* Read 'count' adjacent neurons of one cluster from gate offset 'offset' into 'slots' (up to
 * MAX_IOV): each part (gate rows, up rows, down columns) one contiguous run of the file. */
static bool read_neurons(const struct npu_residency *r, uint64_t offset, const int32_t *slots,
                         int32_t count) {
  for (int p = 0; p < 3; p++) {
    struct iovec iov[MAX_IOV];
    for (int32_t m = 0; m < count; m++) {
      iov[m].iov_base = r->slots + (size_t)slots[m] * r->bundle + (size_t)p * r->kp;
      iov[m].iov_len = r->kp;
    }
    if (!read_fully(r, iov, count, offset + (uint64_t)p * r->part, (size_t)count * r->kp)) {
      return false;
    }
  }
  return true;
}

/* The reads of the last get, each run MAX_IOV neurons at a time. A file that fails to read now
 * was checksummed when opened: it changed under us, which is fatal. */
static void do_reads(struct npu_residency *r) {
  const double t0 = npu_now();
  uint64_t bytes = 0;
  for (int32_t k = 0; k < r->n_runs; k++) {
    const struct read_run *run = &r->runs[k];
    for (int32_t i = 0; i < run->count; i += MAX_IOV) {
      const int32_t n = run->count - i < MAX_IOV ? run->count - i : MAX_IOV;
      if (!read_neurons(r, run->offset + (uint64_t)i * r->kp, r->miss_slot + run->first_miss + i,
                        n)) {
        io_failed("cannot read neuron bundles");
      }
      bytes += (uint64_t)n * r->bundle;
    }
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

/* A cache slot for a miss, by the clock (second chance: an approximation of least recently
 * used): the next slot that is not this get's and was not used since the hand last passed it;
 * its neuron is evicted. */
static int32_t take_slot(struct npu_residency *r) {
  const int32_t n_cache = r->n_slots - r->n_hot;
  for (int32_t tries = 0; tries < 2 * n_cache + 1; tries++) {
    const int32_t s = r->n_hot + r->hand;
    r->hand = (r->hand + 1) % n_cache;
    if (r->used[s] == r->n_gets) continue;
    if (r->ref[s]) {
      r->ref[s] = 0;
      continue;
    }
    if (r->owner[s] >= 0) r->slot_of[r->owner[s]] = -1;
    return s;
  }
  return -1;
}

static size_t cache_get(void *user, int32_t layer, int32_t *ids, size_t n, const int8_t **out) {
  struct npu_residency *r = user;
  r->n_gets++;
  r->n_miss = 0;
  r->miss_layer = layer;
  const size_t base = (size_t)layer * (size_t)r->n_ff;
  /* hits to the front, in order; misses to the back */
  size_t n_hit = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t j = ids[i], s = r->slot_of[base + (size_t)j];
    if (s >= 0) {
      r->used[s] = r->n_gets;
      r->ref[s] = 1;
      ids[n_hit++] = j;
    } else {
      r->miss_id[r->n_miss++] = j;
    }
  }
  r->stats.hits += n_hit;
  r->stats.misses += (uint64_t)r->n_miss;
  for (size_t i = 0; i < n_hit; i++)
    out[i] = r->slots + (size_t)r->slot_of[base + ids[i]] * r->bundle;
  if (r->n_miss == 0) return n;
  /* the misses in file order (ids ascending: the candidates come so), each given a slot */
  r->n_runs = 0;
  for (int32_t m = 0; m < r->n_miss; m++) {
    const int32_t j = r->miss_id[m], s = take_slot(r);
    assert(s >= 0); /* the cache has two layers' slots, a get takes at most one layer's */
    r->owner[s] = (int32_t)(base + (size_t)j);
    r->slot_of[base + (size_t)j] = s;
    r->used[s] = r->n_gets;
    r->miss_slot[m] = s;
    ids[n_hit + (size_t)m] = j;
    out[n_hit + (size_t)m] = r->slots + (size_t)s * r->bundle;
    if (m > 0 && r->miss_id[m - 1] + 1 == j && j % NPU_SPARSE_CLUSTER != 0) {
      r->runs[r->n_runs - 1].count++; /* the next neuron of the same cluster */
    } else {
      r->runs[r->n_runs++] = (struct read_run){gate_offset(r, layer, j), m, 1};
    }
  }
  pthread_mutex_lock(&r->lock);
  r->posted++;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  return n_hit;
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
  r->stats.bytes_read = r->stats.hits = r->stats.misses = 0;
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
  free(r->used);
  free(r->ref);
  free(r->miss_slot);
  free(r->miss_id);
  free(r->runs);
  free(r);
}

/* The hot neurons: for each layer its share of the hot slots, the most often kept first. */
static npulm_status read_hot(struct npu_residency *r, npulm_error *err) {
  const int32_t per_layer = r->n_hot / r->n_layers;
  int32_t *order = malloc((size_t)r->n_ff * sizeof(int32_t));
  if (order == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  int32_t s = 0;
  for (int32_t l = 0; l < r->n_layers; l++) {
    const uint32_t *freq = r->sp->layers[l].freq;
    for (int32_t j = 0; j < r->n_ff; j++) order[j] = j;
    /* the per_layer most frequent: a partial selection */
    for (int32_t i = 0; i < per_layer; i++) {
      int32_t best = i;
      for (int32_t k = i + 1; k < r->n_ff; k++) {
        if (freq[order[k]] > freq[order[best]]) best = k;
      }
      const int32_t t = order[i];
      order[i] = order[best];
      order[best] = t;
    }
    for (int32_t i = 0; i < per_layer; i++, s++) {
      const int32_t j = order[i];
      if (!read_neurons(r, gate_offset(r, l, j), &s, 1)) {
        free(order);
        return npu_fail(err, NPULM_ERR_IO, "cannot read the program file's neuron bundles");
      }
      r->slot_of[(size_t)l * (size_t)r->n_ff + (size_t)j] = s;
      r->owner[s] = l * r->n_ff + j;
    }
  }
  free(order);
  r->n_hot = s;
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
  for (int32_t i = 0; i < p->n_qsites; i++) {
    if (r->streamed[i]) r->stats.streamed_bytes += p->qsites[i].packed_size;
  }
  r->stats.pinned_bytes = pinned;
  npulm_status st = NPULM_OK;
  /* the neuron cache: what is left, half hot; at least two layers' worth of slots */
  const uint64_t left = budget > pinned ? budget - pinned : 0;
  const uint64_t slots = left / r->bundle;
  const uint64_t min_slots = 2 * (uint64_t)r->n_ff;
  if (st == NPULM_OK && slots < min_slots) {
    st = npu_fail(err, NPULM_ERR_ARG,
                  "a memory budget of %llu bytes leaves %llu for the neuron cache; it needs at "
                  "least %llu (two layers' neurons)",
                  (unsigned long long)budget, (unsigned long long)left,
                  (unsigned long long)(min_slots * r->bundle));
  }
  if (st == NPULM_OK) {
    r->n_slots = slots > (uint64_t)INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)slots;
    const uint64_t all = (uint64_t)r->n_layers * (uint64_t)r->n_ff;
    if ((uint64_t)r->n_slots > all) r->n_slots = (int32_t)all;
    r->n_hot = r->n_slots / 2;
    if (r->n_slots - r->n_hot < (int32_t)min_slots) r->n_hot = r->n_slots - (int32_t)min_slots;
    if (r->n_hot < 0) r->n_hot = 0;
    r->slots_bytes = (size_t)r->n_slots * r->bundle;
    r->slots = npu_pages_alloc(r->slots_bytes);
    r->slot_of = malloc((size_t)all * sizeof(int32_t));
    r->owner = malloc((size_t)r->n_slots * sizeof(int32_t));
    r->used = calloc((size_t)r->n_slots, sizeof(uint64_t));
    r->ref = calloc((size_t)r->n_slots, 1);
    r->miss_slot = malloc((size_t)r->n_ff * sizeof(int32_t));
    r->miss_id = malloc((size_t)r->n_ff * sizeof(int32_t));
    r->runs = malloc((size_t)r->n_ff * sizeof(*r->runs));
    if (r->slots == NULL || r->slot_of == NULL || r->owner == NULL || r->used == NULL ||
        r->ref == NULL || r->miss_slot == NULL || r->miss_id == NULL || r->runs == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory for the neuron cache");
    }
  }
  if (st == NPULM_OK) {
    for (uint64_t i = 0; i < (uint64_t)r->n_layers * (uint64_t)r->n_ff; i++) r->slot_of[i] = -1;
    for (int32_t s = 0; s < r->n_slots; s++) r->owner[s] = -1;
    st = read_hot(r, err);
  }
  if (st == NPULM_OK) {
    r->stats.hot_bytes = (uint64_t)r->n_hot * r->bundle;
    r->stats.cache_bytes = (uint64_t)(r->n_slots - r->n_hot) * r->bundle;
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
