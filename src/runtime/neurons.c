/* Weights under a memory budget and the neuron cache (neurons.h). */
/* O_DIRECT (Linux), posix_fadvise */
#define _GNU_SOURCE
#include "runtime/neurons.h"

#include <assert.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "base/pages.h"
#include "io/gguf.h"
#include "model/model.h"
#include "program/program.h"
#include "program/sparse_data.h"

enum {
  IO_THREADS = 4,   /* reads in flight */
  MAX_ALIGN = 4096, /* of a read's offset and length: the largest block size tried for O_DIRECT */
  /* a run takes in the next neuron if the bytes between are at most READ_GAP and the run stays
   * within READ_SPAN: on this machine's storage with IO_THREADS reads in flight (bench/RESULTS.md)
   * a request costs about 22 us and a byte 0.94 ns, so up to 24 KiB between two reads cost less
   * than a second request */
  READ_GAP = 24 << 10,
  READ_SPAN = 128 << 10,
  LOOK_AHEAD = 8,   /* window slots a miss may take, from the clock hand */
  SCRATCH_MIN = 64, /* slots for a round's misses (4 clusters) */
};

/* The share of the resident up/down pairs held for good, in 256ths; the rest is the window
 * (bench/RESULTS.md measures the choice). */
enum { HOT_SHARE_Q8 = 192 };

/* A read of an I/O thread: some neurons of a layer into their slots (miss_id, miss_slot from
 * first_miss on, in file order), either their gate rows (into the gate pool) or their pairs (into
 * the pair pool): the file's bytes [start, end), through the parts between them. */
struct read_run {
  uint64_t start, end;
  int32_t layer, first_miss, count;
  bool gate;
};

/* Slots of one size: 'n_resident' held (for pairs: n_hot pinned, then the window), then a
 * scratch of 'n_scratch' for a round's other misses. */
struct slot_pool {
  int8_t *mem;
  size_t mem_bytes, stride;
  int32_t n_resident, n_scratch, n_slots;
  int32_t scratch_used; /* by the round under way */
  int32_t *slot_of;     /* (n_layers * n_ff) the slot holding each neuron's part, or -1 */
  int32_t *owner;       /* (n_slots) the neuron (layer * n_ff + j) a slot holds, or -1 */
};

struct npu_residency;

struct io_arg { /* an I/O thread's */
  struct npu_residency *r;
  uint8_t *bounce;
};

struct npu_residency {
  const struct npu_sparse *sp;
  const struct npu_gguf *file;
  const uint8_t *streamed; /* (n_qsites) the program's */
  size_t kp;               /* bytes of each of a neuron's three vectors */
  int32_t n_layers, n_ff;
  struct slot_pool gates; /* gate rows, kp each */
  struct slot_pool pairs; /* up row and down column, 2 kp each */
  int32_t n_hot;          /* pairs pinned; pairs n_hot .. n_resident - 1 are the window */
  uint64_t *used;         /* (pairs.n_slots) the round that last used it: not to be taken in it */
  uint8_t *history;       /* (n_layers * n_ff) kept in each of its layer's last 8 steps (bit 0) */
  int32_t hand;           /* the window's clock hand */
  uint64_t n_rounds;      /* gate gets: a layer step's rounds */
  /* the reads the last get posted, for the I/O thread */
  int32_t *miss_slot; /* (n_ff) */
  int32_t *miss_id;   /* (n_ff) */
  int32_t n_miss;
  int32_t *pending;      /* (n_ff) a get's neurons not in memory */
  int32_t *by_place;     /* (n_ff) neurons in file order (sort_by_place) */
  int32_t *at_place;     /* (n_ff) sort_by_place's: the neuron at each place, or -1 */
  int32_t *left;         /* (n_ff) a round's candidates left for the next one */
  struct read_run *runs; /* (n_ff) */
  int32_t n_runs;
  /* the I/O threads: each takes the next run of the reads posted (guarded by lock) */
  int fd;       /* the file, opened again with O_DIRECT where it allows, else its mapping's */
  bool direct;  /* fd bypasses the page cache */
  size_t align; /* of a direct read's offset and length: O_DIRECT's block size (else 1) */
  size_t span;  /* the longest run */
  size_t bounce_bytes;
  uint8_t *bounce[IO_THREADS]; /* each thread's aligned buffer (the first: fill_resident's too) */
  pthread_t io[IO_THREADS];
  struct io_arg io_args[IO_THREADS];
  int n_io; /* started */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool quit;
  uint64_t posted, done;              /* gets posted and completed */
  int32_t batch, next_run, runs_done; /* the get posted: its runs, taken, read */
  double posted_at;
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

/* The longest run: READ_SPAN, or a layer's bundles if smaller, or one pair if longer. */
static size_t read_span_max(const struct npu_sparse *sp) {
  const size_t pair = 2 * (size_t)sp->kp;
  size_t span = (size_t)npu_sparse_bundle_bytes(sp, 0);
  if (span > READ_SPAN) span = READ_SPAN;
  return span > pair ? span : pair;
}

uint64_t npu_residency_io_bytes(const struct npu_sparse *sp) {
  return (uint64_t)IO_THREADS * (read_span_max(sp) + 2 * MAX_ALIGN);
}

/* With 'direct', the file again, for reads that bypass the page cache: O_DIRECT through
 * /proc/self/fd (Linux), at the smallest block size from 512 bytes to MAX_ALIGN that a read
 * takes; else (or a file system without it, another system) the mapping's descriptor, buffered. */
static void open_reads(struct npu_residency *r, bool direct) {
  r->fd = r->file->fd;
  r->align = 1;
  if (!direct) return;
#ifdef O_DIRECT
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", r->file->fd);
  const int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return;
  uint8_t *probe = npu_pages_alloc(2 * MAX_ALIGN);
  for (size_t a = 512; probe != NULL && a <= MAX_ALIGN && !r->direct; a *= 2) {
    if (pread(fd, probe, a, (off_t)a) == (ssize_t)a) {
      r->fd = fd;
      r->direct = true;
      r->align = a;
    }
  }
  npu_pages_free(probe, 2 * MAX_ALIGN);
  if (!r->direct) close(fd);
#endif
}

/* Where neuron j of layer l's gate row (gate) or pair is in the file. */
static uint64_t part_offset(const struct npu_residency *r, int32_t l, int32_t j, bool gate) {
  const struct npu_sparse_layer *ly = &r->sp->layers[l];
  const int32_t at = ly->place[j];
  const size_t off = gate ? npu_sparse_gate_at(r->kp, at) : npu_sparse_pair_at(r->kp, r->n_ff, at);
  return (uint64_t)((const uint8_t *)ly->bundles + off - r->file->base);
}

/* Bytes of a gate row, or of a pair (as in the file: the up row, then the down column). */
static size_t part_bytes(const struct npu_residency *r, bool gate) {
  return gate ? r->kp : 2 * r->kp;
}

/* Read the file's bytes [lo, hi) into 'buf' (lo aligned for a direct read; a read past the
 * file's end stops there, short of hi but not of 'need'). */
static bool read_span(const struct npu_residency *r, uint8_t *buf, uint64_t lo, uint64_t hi,
                      uint64_t need) {
  uint64_t got = 0;
  while (lo + got < need) {
    const ssize_t k = pread(r->fd, buf + got, (size_t)(hi - lo - got), (off_t)(lo + got));
    if (k <= 0) return false;
    got += (uint64_t)k;
  }
  return true;
}

/* Read run 'run''s neurons into their slots through 'bounce'; the bytes moved go to *moved: the
 * file's span from the run's first part to its last in one request (on storage bound by
 * requests, not bytes, the parts between cost less than a second request), each neuron's part
 * copied from it. Direct: the span widened to r->align. Buffered (a run of adjacent parts only),
 * its pages dropped from the page cache after, so that reading them again comes from storage
 * (the budget holds the cache too). */
static bool read_run(const struct npu_residency *r, const struct read_run *run, uint8_t *bounce,
                     uint64_t *moved) {
  const struct slot_pool *pool = run->gate ? &r->gates : &r->pairs;
  const int32_t *slots = r->miss_slot + run->first_miss, *ids = r->miss_id + run->first_miss;
  const uint64_t lo = run->start / r->align * r->align;
  const uint64_t hi = (run->end + r->align - 1) / r->align * r->align;
  assert(hi - lo <= r->bounce_bytes);
  if (!read_span(r, bounce, lo, hi, run->end)) return false;
  if (!r->direct) (void)posix_fadvise(r->fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
  *moved += hi - lo;
  const size_t size = part_bytes(r, run->gate);
  for (int32_t m = 0; m < run->count; m++) {
    const uint64_t at = part_offset(r, run->layer, ids[m], run->gate);
    memcpy(pool->mem + (size_t)slots[m] * pool->stride, bounce + (at - lo), size);
  }
  return true;
}

/* An I/O thread: the runs of each get posted, one at a time, while the other threads take the
 * others; the last to finish completes the get. A file that fails to read now was checksummed
 * when opened: it changed under us, which is fatal. */
static void *io_thread(void *arg) {
  struct npu_residency *r = ((struct io_arg *)arg)->r;
  uint8_t *bounce = ((struct io_arg *)arg)->bounce;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    while (!r->quit && r->next_run == r->batch) pthread_cond_wait(&r->cond, &r->lock);
    if (r->quit) break;
    const struct read_run *run = &r->runs[r->next_run++];
    pthread_mutex_unlock(&r->lock);
    uint64_t moved = 0;
    if (!read_run(r, run, bounce, &moved)) io_failed("cannot read neuron bundles");
    pthread_mutex_lock(&r->lock);
    r->stats.bytes_read += (uint64_t)run->count * part_bytes(r, run->gate);
    r->stats.storage_bytes += moved;
    if (++r->runs_done == r->batch) {
      r->stats.read_s += npu_now() - r->posted_at;
      r->done = r->posted;
      pthread_cond_broadcast(&r->cond);
    }
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Queue the read of neuron j of 'layer' into slot s: its gate row (gate) or its pair; with the
 * run before it if that is of the same layer and part and, direct, close enough (READ_GAP,
 * r->span), buffered, adjacent (reads are queued in file order). */
static void queue_read(struct npu_residency *r, int32_t layer, int32_t j, int32_t s, bool gate) {
  const int32_t m = r->n_miss++;
  r->miss_id[m] = j;
  r->miss_slot[m] = s;
  const uint64_t start = part_offset(r, layer, j, gate), end = start + part_bytes(r, gate);
  struct read_run *last = r->n_runs > 0 ? &r->runs[r->n_runs - 1] : NULL;
  const bool joins = last != NULL && last->layer == layer && last->gate == gate &&
                     start >= last->end && end - last->start <= r->span &&
                     start - last->end <= (r->direct ? READ_GAP : 0);
  if (joins) {
    last->count++;
    last->end = end;
  } else {
    r->runs[r->n_runs++] = (struct read_run){start, end, layer, m, 1, gate};
  }
}

/* The first n of 'ids', neurons of 'layer', into r->by_place in file order: places are a
 * permutation, so a pass over them (n_ff steps, where a sort of a step's candidates cost a
 * sixth of a decode step's time in memory). */
static void sort_by_place(struct npu_residency *r, int32_t layer, const int32_t *ids, size_t n) {
  const int32_t *place = r->sp->layers[layer].place;
  for (size_t i = 0; i < n; i++) r->at_place[place[ids[i]]] = ids[i];
  size_t k = 0;
  for (int32_t p = 0; p < r->n_ff && k < n; p++) {
    if (r->at_place[p] < 0) continue;
    r->by_place[k++] = r->at_place[p];
    r->at_place[p] = -1;
  }
}

/* Queue the reads of the first n of 'ids' (slots taken) in file order. */
static void queue_reads(struct npu_residency *r, int32_t layer, const int32_t *ids, size_t n,
                        bool gate) {
  const struct slot_pool *pool = gate ? &r->gates : &r->pairs;
  sort_by_place(r, layer, ids, n);
  for (size_t i = 0; i < n; i++) {
    const int32_t j = r->by_place[i];
    queue_read(r, layer, j, pool->slot_of[layer * r->n_ff + j], gate);
  }
}

static void post_reads(struct npu_residency *r) {
  pthread_mutex_lock(&r->lock);
  r->posted_at = npu_now();
  r->batch = r->n_runs;
  r->next_run = r->runs_done = 0;
  r->posted++;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

static int popcount8(uint8_t v) {
  int c = 0;
  for (; v != 0; v &= (uint8_t)(v - 1)) c++;
  return c;
}

/* A pair slot for neuron g (= layer * n_ff + j), kept in this round and not in memory: in the
 * window if g was kept in more of its layer's last 8 steps than the least kept of the LOOK_AHEAD
 * window neurons after the clock hand that this round does not use (an empty slot counts -1),
 * which it then evicts; else a scratch slot, let go at the next round (get_gates left room). */
static int32_t take_pair_slot(struct npu_residency *r, int32_t g) {
  struct slot_pool *pp = &r->pairs;
  const int32_t first = r->n_hot, n_win = pp->n_resident - r->n_hot;
  const int32_t look = n_win < LOOK_AHEAD ? n_win : LOOK_AHEAD;
  int32_t victim = -1, victim_score = 9;
  for (int32_t k = 0; k < look; k++) {
    const int32_t s = first + (r->hand + k) % n_win;
    if (r->used[s] == r->n_rounds) continue;
    const int score = pp->owner[s] < 0 ? -1 : popcount8(r->history[pp->owner[s]]);
    if (score < victim_score) {
      victim = s;
      victim_score = score;
    }
  }
  if (victim >= 0 && popcount8(r->history[g]) > victim_score) {
    r->hand = (victim - first + 1) % n_win;
    if (pp->owner[victim] >= 0) pp->slot_of[pp->owner[victim]] = -1;
    return victim;
  }
  assert(pp->scratch_used < pp->n_scratch);
  return pp->n_resident + pp->scratch_used++;
}

/* The scratch slots of the round before: let go. */
static void release_scratch(struct slot_pool *pool) {
  for (int32_t s = pool->n_resident; s < pool->n_resident + pool->scratch_used; s++) {
    pool->slot_of[pool->owner[s]] = -1;
    pool->owner[s] = -1;
  }
  pool->scratch_used = 0;
}

/* A round of a layer step's candidates (the first: all of them, put in file order, so that a
 * round's misses lie together), as many as the scratches take: a candidate is taken if
 * its gate row is in memory or a gate scratch slot is free, and its pair is in memory or fewer
 * of the round's taken lack theirs than the pair scratch holds (so that get_rest has a slot for
 * every kept one). Those whose gate rows are in memory come first, then those whose gate rows
 * are being read, then those left for the next round. */
static size_t get_gates(struct npu_residency *r, int32_t layer, bool first_round, int32_t *ids,
                        size_t n, const int8_t **out, size_t *n_given) {
  struct slot_pool *gp = &r->gates, *pp = &r->pairs;
  r->n_rounds++;
  release_scratch(gp);
  release_scratch(pp);
  r->n_miss = r->n_runs = 0;
  const int32_t base = layer * r->n_ff;
  if (first_round) { /* the histories move on by one step; the rounds take the file's order */
    uint8_t *h = r->history + base;
    for (int32_t j = 0; j < r->n_ff; j++) h[j] = (uint8_t)(h[j] << 1);
    sort_by_place(r, layer, ids, n);
    memcpy(ids, r->by_place, n * sizeof(int32_t));
  }
  size_t n_hit = 0, n_read = 0, n_left = 0;
  int32_t pairs_room = pp->n_scratch;
  for (size_t i = 0; i < n; i++) {
    const int32_t j = ids[i], g = base + j, gs = gp->slot_of[g], ps = pp->slot_of[g];
    if ((gs < 0 && gp->scratch_used == gp->n_scratch) || (ps < 0 && pairs_room == 0)) {
      r->left[n_left++] = j;
      continue;
    }
    if (ps >= 0) {
      r->used[ps] = r->n_rounds; /* not to be evicted by this round's misses */
    } else {
      pairs_room--;
    }
    if (gs >= 0) {
      ids[n_hit++] = j;
      continue;
    }
    const int32_t s = gp->n_resident + gp->scratch_used++;
    gp->owner[s] = g;
    gp->slot_of[g] = s;
    r->pending[n_read++] = j;
  }
  queue_reads(r, layer, r->pending, n_read, true);
  memcpy(ids + n_hit, r->pending, n_read * sizeof(int32_t));
  memcpy(ids + n_hit + n_read, r->left, n_left * sizeof(int32_t));
  *n_given = n_hit + n_read;
  for (size_t i = 0; i < *n_given; i++)
    out[i] = gp->mem + (size_t)gp->slot_of[base + ids[i]] * gp->stride;
  r->stats.hits += n_hit;
  r->stats.misses += n_read;
  r->stats.bytes_used += (uint64_t)*n_given * r->kp;
  if (n_read > 0) post_reads(r);
  return n_hit;
}

/* Of a round's candidates, the kept: those whose pairs are in memory first, then a read of the
 * others' (in file order); their histories take this step. */
static size_t get_rest(struct npu_residency *r, int32_t layer, int32_t *ids, size_t n,
                       const int8_t **out) {
  struct slot_pool *pp = &r->pairs;
  r->n_miss = r->n_runs = 0;
  const int32_t base = layer * r->n_ff;
  size_t n_ready = 0, n_pending = 0;
  for (size_t i = 0; i < n; i++) {
    const int32_t j = ids[i];
    if (pp->slot_of[base + j] >= 0) {
      ids[n_ready++] = j;
    } else {
      r->pending[n_pending++] = j;
    }
  }
  for (size_t m = 0; m < n_pending; m++) {
    const int32_t j = r->pending[m], s = take_pair_slot(r, base + j);
    pp->owner[s] = base + j;
    pp->slot_of[base + j] = s;
    r->used[s] = r->n_rounds;
    ids[n_ready + m] = j;
  }
  queue_reads(r, layer, r->pending, n_pending, false);
  uint8_t *h = r->history + base;
  for (size_t i = 0; i < n; i++) {
    out[i] = pp->mem + (size_t)pp->slot_of[base + ids[i]] * pp->stride;
    h[ids[i]] |= 1;
  }
  r->stats.kept_hits += n_ready;
  r->stats.kept_misses += n_pending;
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
  return (struct npu_bundle_source){r, cache_get, cache_wait};
}

const uint8_t *npu_residency_streamed(const struct npu_residency *r) { return r->streamed; }

void npu_residency_stats(const struct npu_residency *r, npulm_memory_stats *out) {
  *out = r->stats;
}

void npu_residency_reset_stats(struct npu_residency *r) {
  r->stats.bytes_read = r->stats.bytes_used = r->stats.hits = r->stats.misses = 0;
  r->stats.storage_bytes = 0;
  r->stats.kept_hits = r->stats.kept_misses = 0;
  r->stats.read_s = r->stats.io_wait_s = 0.0;
}

static void pool_free(struct slot_pool *pool) {
  npu_pages_free(pool->mem, pool->mem_bytes);
  free(pool->slot_of);
  free(pool->owner);
}

void npu_residency_free(struct npu_residency *r) {
  if (r == NULL) return;
  pthread_mutex_lock(&r->lock);
  r->quit = true;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  for (int i = 0; i < r->n_io; i++) pthread_join(r->io[i], NULL);
  for (int i = 0; i < IO_THREADS; i++) npu_pages_free(r->bounce[i], r->bounce_bytes);
  if (r->fd >= 0 && r->fd != r->file->fd) close(r->fd);
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  pool_free(&r->gates);
  pool_free(&r->pairs);
  free(r->used);
  free(r->history);
  free(r->miss_slot);
  free(r->miss_id);
  free(r->pending);
  free(r->by_place);
  free(r->at_place);
  free(r->left);
  free(r->runs);
  free(r);
}

/* What the neuron cache holds, from 'bytes': the parts that calibration says decode uses most
 * per byte. A neuron's gate row (kp bytes) is read whenever it is a candidate, at least as often
 * as calibration kept it (npu_sparse_layer.freq); its pair (2 kp) when it is kept: per byte, a
 * gate row is worth at least twice its own pair. So over all layers' neurons, most kept first,
 * the gate rows at value 2 freq and the pairs at freq are merged, the higher first (ties: the
 * gate row), while they fit. resident_gate / resident_pair (n_layers * n_ff) get the rank of
 * each part held, or -1; the counts held go to *n_gates and *n_pairs. */
static npulm_status choose_resident(struct npu_residency *r, uint64_t bytes, int32_t *resident_gate,
                                    int32_t *resident_pair, int32_t *n_gates, int32_t *n_pairs,
                                    npulm_error *err) {
  const int32_t all = r->n_layers * r->n_ff;
  uint64_t *order = malloc((size_t)all * sizeof(uint64_t));
  if (order == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  for (int32_t l = 0; l < r->n_layers; l++) {
    const uint32_t *freq = r->sp->layers[l].freq;
    for (int32_t j = 0; j < r->n_ff; j++) { /* most kept first, then by layer and index */
      const int32_t g = l * r->n_ff + j;
      order[g] = (uint64_t)(UINT32_MAX - freq[j]) << 32 | (uint32_t)g;
    }
  }
  qsort(order, (size_t)all, sizeof(uint64_t), cmp_u64);
  for (int32_t g = 0; g < all; g++) resident_gate[g] = resident_pair[g] = -1;
  int32_t a = 0, b = 0; /* the next gate row, the next pair, in 'order' */
  const uint64_t gate_bytes = r->kp, pair_bytes = 2 * r->kp;
  while (b < all) {
    const uint64_t fa = a < all ? UINT32_MAX - (order[a] >> 32) : 0;
    const uint64_t fb = UINT32_MAX - (order[b] >> 32);
    const bool gate = a < all && 2 * fa >= fb;
    const uint64_t need = gate ? gate_bytes : pair_bytes;
    if (need > bytes) break;
    bytes -= need;
    const int32_t g = (int32_t)(uint32_t)(gate ? order[a] : order[b]);
    if (gate) {
      resident_gate[g] = a++;
    } else {
      resident_pair[g] = b++;
    }
  }
  *n_gates = a;
  *n_pairs = b;
  free(order);
  return NPULM_OK;
}

/* The pool's slots and maps, every slot empty. */
static bool pool_alloc(struct slot_pool *pool, size_t stride, int32_t n_resident, int32_t n_scratch,
                       int32_t all) {
  pool->stride = stride;
  pool->n_resident = n_resident;
  pool->n_scratch = n_scratch;
  pool->n_slots = n_resident + n_scratch;
  pool->mem_bytes = (size_t)pool->n_slots * stride;
  pool->mem = npu_pages_alloc(pool->mem_bytes);
  pool->slot_of = malloc((size_t)all * sizeof(int32_t));
  pool->owner = malloc((size_t)(pool->n_slots > 0 ? pool->n_slots : 1) * sizeof(int32_t));
  if ((pool->mem == NULL && pool->mem_bytes > 0) || pool->slot_of == NULL || pool->owner == NULL)
    return false;
  for (int32_t g = 0; g < all; g++) pool->slot_of[g] = -1;
  for (int32_t s = 0; s < pool->n_slots; s++) pool->owner[s] = -1;
  return true;
}

/* The resident parts into their slots (slot = rank: the pinned pairs are the most kept, the
 * window the rest) and read, a layer at a time in file order. */
static npulm_status fill_resident(struct npu_residency *r, const int32_t *resident_gate,
                                  const int32_t *resident_pair, npulm_error *err) {
  for (int32_t l = 0; l < r->n_layers; l++) {
    for (int part = 0; part < 2; part++) {
      const int32_t *rank = part == 0 ? resident_gate : resident_pair;
      struct slot_pool *pool = part == 0 ? &r->gates : &r->pairs;
      r->n_miss = r->n_runs = 0;
      size_t n_held = 0;
      for (int32_t j = 0; j < r->n_ff; j++) {
        const int32_t g = l * r->n_ff + j, s = rank[g];
        if (s < 0) continue;
        pool->slot_of[g] = s;
        pool->owner[s] = g;
        r->pending[n_held++] = j;
      }
      queue_reads(r, l, r->pending, n_held, part == 0);
      for (int32_t k = 0; k < r->n_runs; k++) {
        uint64_t moved = 0;
        if (!read_run(r, &r->runs[k], r->bounce[0], &moved))
          return npu_fail(err, NPULM_ERR_IO, "cannot read the program file's neuron bundles");
      }
    }
  }
  return NPULM_OK;
}

/* The cache's slots for 'bytes' (all parts resident if they fit, else a scratch of at least
 * SCRATCH_MIN neurons, or a sixteenth of a layer's, and the parts choose_resident picks), read. */
static npulm_status fill_cache(struct npu_residency *r, uint64_t bytes, npulm_error *err) {
  const int32_t all = r->n_layers * r->n_ff;
  const uint64_t bundle = 3 * r->kp, n_ff = (uint64_t)r->n_ff;
  uint64_t scratch = n_ff / 16 > SCRATCH_MIN ? n_ff / 16 : SCRATCH_MIN;
  if (scratch > n_ff) scratch = n_ff;
  if (bytes / bundle >= (uint64_t)all) scratch = 0;
  if (bytes / bundle < scratch) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "a memory budget of %llu bytes leaves %llu for the neuron cache; it needs at "
                    "least %llu (a scratch of %llu neurons)",
                    (unsigned long long)r->stats.budget, (unsigned long long)bytes,
                    (unsigned long long)(scratch * bundle), (unsigned long long)scratch);
  }
  int32_t *resident_gate = malloc((size_t)all * sizeof(int32_t));
  int32_t *resident_pair = malloc((size_t)all * sizeof(int32_t));
  int32_t n_gates = 0, n_pairs = 0;
  npulm_status st = resident_gate == NULL || resident_pair == NULL
                        ? npu_fail(err, NPULM_ERR_NOMEM, "out of memory")
                        : choose_resident(r, bytes - scratch * bundle, resident_gate, resident_pair,
                                          &n_gates, &n_pairs, err);
  if (st == NPULM_OK) {
    /* a scratch larger than a layer's parts not held is not needed */
    int32_t gates_out = 0, pairs_out = 0;
    for (int32_t l = 0; l < r->n_layers; l++) {
      int32_t g_out = 0, p_out = 0;
      for (int32_t g = l * r->n_ff; g < (l + 1) * r->n_ff; g++) {
        g_out += resident_gate[g] < 0;
        p_out += resident_pair[g] < 0;
      }
      if (g_out > gates_out) gates_out = g_out;
      if (p_out > pairs_out) pairs_out = p_out;
    }
    const int32_t sc = (int32_t)scratch;
    r->n_hot = (int32_t)((int64_t)n_pairs * HOT_SHARE_Q8 / 256);
    r->used = calloc((size_t)n_pairs + scratch, sizeof(uint64_t));
    if (!pool_alloc(&r->gates, r->kp, n_gates, gates_out < sc ? gates_out : sc, all) ||
        !pool_alloc(&r->pairs, 2 * r->kp, n_pairs, pairs_out < sc ? pairs_out : sc, all) ||
        r->used == NULL) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory for the neuron cache");
    }
  }
  if (st == NPULM_OK) st = fill_resident(r, resident_gate, resident_pair, err);
  if (st == NPULM_OK) {
    r->stats.hot_bytes = (uint64_t)n_gates * r->kp + (uint64_t)r->n_hot * 2 * r->kp;
    r->stats.cache_bytes = (uint64_t)(n_pairs - r->n_hot) * 2 * r->kp;
    r->stats.scratch_bytes =
        (uint64_t)r->gates.n_scratch * r->kp + (uint64_t)r->pairs.n_scratch * 2 * r->kp;
  }
  free(resident_gate);
  free(resident_pair);
  return st;
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
  r->fd = -1;
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  r->sp = p->sparse;
  r->file = m->gguf;
  r->kp = (size_t)r->sp->kp;
  r->n_layers = r->sp->n_layers;
  r->n_ff = r->sp->layers[0].n_ff;
  open_reads(r, !m->buffered_io);
  r->span = read_span_max(r->sp);
  r->bounce_bytes = r->span + 2 * MAX_ALIGN;
  const uint64_t budget = m->mem_budget;
  r->stats.budget = budget;
  r->stats.direct_io = r->direct;
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
  const uint64_t all = (uint64_t)r->n_layers * (uint64_t)r->n_ff;
  if (all > (uint64_t)INT32_MAX) {
    st = npu_fail(err, NPULM_ERR_UNSUPPORTED, "the neuron cache cannot index %llu neurons",
                  (unsigned long long)all);
  }
  r->history = calloc((size_t)all, 1);
  r->miss_slot = malloc((size_t)r->n_ff * sizeof(int32_t));
  r->miss_id = malloc((size_t)r->n_ff * sizeof(int32_t));
  r->pending = malloc((size_t)r->n_ff * sizeof(int32_t));
  r->by_place = malloc((size_t)r->n_ff * sizeof(int32_t));
  r->at_place = malloc((size_t)r->n_ff * sizeof(int32_t));
  for (int32_t p = 0; r->at_place != NULL && p < r->n_ff; p++) r->at_place[p] = -1;
  r->left = malloc((size_t)r->n_ff * sizeof(int32_t));
  r->runs = malloc((size_t)r->n_ff * sizeof(*r->runs));
  bool bounced = true;
  for (int i = 0; i < IO_THREADS; i++) {
    r->bounce[i] = npu_pages_alloc(r->bounce_bytes);
    bounced = bounced && r->bounce[i] != NULL;
  }
  if (st == NPULM_OK && (r->history == NULL || r->miss_slot == NULL || r->miss_id == NULL ||
                         r->pending == NULL || r->by_place == NULL || r->at_place == NULL ||
                         r->left == NULL || r->runs == NULL || !bounced)) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory for the neuron cache");
  }
  /* the neuron cache: what is left beside the streamed weights in use (one used, the next one
   * read ahead: both in memory, in the process or the page cache) */
  const uint64_t taken = pinned + 2 * largest_streamed + npu_residency_io_bytes(r->sp);
  if (st == NPULM_OK) st = fill_cache(r, budget > taken ? budget - taken : 0, err);
  while (st == NPULM_OK && r->n_io < IO_THREADS) {
    r->io_args[r->n_io] = (struct io_arg){r, r->bounce[r->n_io]};
    if (pthread_create(&r->io[r->n_io], NULL, io_thread, &r->io_args[r->n_io]) != 0) {
      st = npu_fail(err, NPULM_ERR_NOMEM, "cannot start the neuron cache's I/O threads");
    } else {
      r->n_io++;
    }
  }
  if (st != NPULM_OK) {
    npu_residency_free(r);
    return st;
  }
  *out = r;
  return NPULM_OK;
}
