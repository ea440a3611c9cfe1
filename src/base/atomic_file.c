/* Files written whole or not at all (see atomic_file.h). On Linux the temporary is opened with
 * O_TMPFILE and has no name until it is complete, so a process killed while writing (SIGKILL, a
 * full disk's SIGXFSZ) leaves no file behind. Once complete it must be named to be renamed over
 * the target (linkat cannot replace a file): a process killed between that link and the rename
 * leaves a complete "<target>.tmp.<pid>.<n>". Elsewhere, or on filesystems without O_TMPFILE, the
 * temporary has that name from the start, removed on every failure the process lives through.
 * Either way, the next write of the same target removes the temporaries of processes that no
 * longer exist (stale_temporaries). */
#define _GNU_SOURCE /* O_TMPFILE */
#include "base/atomic_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/common.h"

#define AFILE_BUFFER_BYTES (1u << 20)
#define AFILE_NAME_TRIES 100

/* The directory part of 'path' ("." if it has none), in a new string; NULL if out of memory. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* A new name beside the target for a temporary: "<path>.tmp.<pid>.<try>". */
static char *tmp_name(const char *path, int attempt) {
  size_t n = strlen(path) + 48;
  char *s = malloc(n);
  if (s != NULL) snprintf(s, n, "%s.tmp.%ld.%d", path, (long)getpid(), attempt);
  return s;
}

/* Remove the temporaries of 'path' ("<path>.tmp.<pid>.<n>", tmp_name) that processes which no
 * longer exist left behind (killed between naming and renaming one). A live process's are its
 * own; a pid of another PID namespace looks dead from here, so such a writer must not share the
 * target's directory. */
static void stale_temporaries(const char *path) {
  char *dir = dir_of(path);
  const char *slash = strrchr(path, '/');
  const char *base = slash != NULL ? slash + 1 : path;
  const size_t base_len = strlen(base);
  DIR *d = dir != NULL ? opendir(dir) : NULL;
  free(dir);
  if (d == NULL) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    const char *name = e->d_name;
    if (strncmp(name, base, base_len) != 0 || strncmp(name + base_len, ".tmp.", 5) != 0) continue;
    /* the pid as tmp_name writes it: decimal digits, no sign, space or leading zero */
    const char *digits = name + base_len + 5;
    if (*digits < '1' || *digits > '9') continue;
    char *end;
    errno = 0;
    const long pid = strtol(digits, &end, 10);
    if (errno != 0 || pid > INT_MAX || *end != '.' || pid == getpid()) continue;
    const char *n = end + 1;
    while (*n >= '0' && *n <= '9') n++;
    if (n == end + 1 || *n != '\0') continue;
    struct stat sb;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to know */
    if (fstatat(dirfd(d), name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode)) {
      (void)unlinkat(dirfd(d), name, 0);
    }
  }
  closedir(d);
}

static npulm_status open_tmp(struct npu_afile *f, npulm_error *err) {
#ifdef O_TMPFILE
  char *dir = dir_of(f->path);
  if (dir == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  f->fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  int open_errno = errno;
  free(dir);
  if (f->fd >= 0) return NPULM_OK;
  /* a filesystem or kernel without unnamed files says so with one of these: use a named one */
  if (open_errno != EOPNOTSUPP && open_errno != EISDIR && open_errno != EINVAL) {
    return npu_fail(err, NPULM_ERR_IO, "cannot create '%s': %s", f->path, strerror(open_errno));
  }
#endif
  for (int attempt = 0; attempt < AFILE_NAME_TRIES; attempt++) {
    f->tmp_path = tmp_name(f->path, attempt);
    if (f->tmp_path == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd >= 0) return NPULM_OK;
    int open_errno = errno;
    free(f->tmp_path);
    f->tmp_path = NULL;
    if (open_errno != EEXIST) {
      return npu_fail(err, NPULM_ERR_IO, "cannot create '%s': %s", f->path, strerror(open_errno));
    }
  }
  return npu_fail(err, NPULM_ERR_IO, "cannot create '%s': no free temporary name beside it",
                  f->path);
}

npulm_status npu_afile_open(const char *path, struct npu_afile *f, npulm_error *err) {
  *f = (struct npu_afile){.fd = -1};
  npulm_status st;
  struct stat sb;
  bool is_link = lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
  /* replace the file a link points to, not the link */
  f->path = is_link ? realpath(path, NULL) : NULL;
  if (f->path == NULL) f->path = strdup(path);
  f->buf = malloc(AFILE_BUFFER_BYTES);
  if (f->path == NULL || f->buf == NULL) {
    st = npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
    goto fail;
  }
  f->cap = AFILE_BUFFER_BYTES;
  f->direct = stat(f->path, &sb) == 0 && !S_ISREG(sb.st_mode);
  if (f->direct) {
    f->fd = open(f->path, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (f->fd < 0) {
      st = npu_fail(err, NPULM_ERR_IO, "cannot create '%s': %s", path, strerror(errno));
      goto fail;
    }
  } else if ((st = open_tmp(f, err)) != NPULM_OK) {
    goto fail;
  } else {
    stale_temporaries(f->path);
  }
  f->live = true;
  return NPULM_OK;
fail:
  free(f->path);
  free(f->buf);
  *f = (struct npu_afile){.fd = -1};
  return st;
}

/* Write all 'n' bytes at the file's current position, through short writes and EINTR. */
static bool write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

static npulm_status io_fail(const struct npu_afile *f, npulm_error *err) {
  return npu_fail(err, NPULM_ERR_IO, "cannot write '%s': %s", f->path, strerror(errno));
}

static npulm_status flush(struct npu_afile *f, npulm_error *err) {
  if (f->used > 0 && !write_all(f->fd, f->buf, f->used)) return io_fail(f, err);
  f->used = 0;
  return NPULM_OK;
}

npulm_status npu_afile_write(struct npu_afile *f, const void *data, size_t n, npulm_error *err) {
  const uint8_t *p = data;
  f->size += n;
  if (n >= f->cap) {
    npulm_status st = flush(f, err);
    if (st != NPULM_OK) return st;
    return write_all(f->fd, p, n) ? NPULM_OK : io_fail(f, err);
  }
  if (f->used + n > f->cap) {
    npulm_status st = flush(f, err);
    if (st != NPULM_OK) return st;
  }
  memcpy(f->buf + f->used, p, n);
  f->used += n;
  return NPULM_OK;
}

npulm_status npu_afile_pwrite(struct npu_afile *f, const void *data, size_t n, uint64_t offset,
                              npulm_error *err) {
  npulm_status st = flush(f, err);
  if (st != NPULM_OK) return st;
  const uint8_t *p = data;
  while (n > 0) {
    ssize_t k = pwrite(f->fd, p, n, (off_t)offset);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return io_fail(f, err);
    p += k;
    n -= (size_t)k;
    offset += (uint64_t)k;
  }
  return NPULM_OK;
}

/* Give the complete, synced temporary its final name. */
static npulm_status publish(struct npu_afile *f, npulm_error *err) {
  if (f->tmp_path == NULL) {
    /* an unnamed file gets a temporary name first: linkat cannot replace an existing target */
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", f->fd);
    for (int attempt = 0; f->tmp_path == NULL; attempt++) {
      char *name = tmp_name(f->path, attempt);
      if (name == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
      if (linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0) {
        f->tmp_path = name;
      } else {
        int link_errno = errno;
        free(name);
        if (link_errno != EEXIST || attempt + 1 == AFILE_NAME_TRIES) {
          return npu_fail(err, NPULM_ERR_IO, "cannot create '%s': %s", f->path,
                          strerror(link_errno));
        }
      }
    }
  }
  if (rename(f->tmp_path, f->path) != 0) {
    return npu_fail(err, NPULM_ERR_IO, "cannot replace '%s': %s", f->path, strerror(errno));
  }
  free(f->tmp_path);
  f->tmp_path = NULL;
  /* the rename itself must reach the disk, or a crash may bring back the old file */
  char *dir = dir_of(f->path);
  if (dir == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (dfd >= 0) {
    (void)fsync(dfd); /* some filesystems refuse to sync a directory; the data is synced anyway */
    close(dfd);
  }
  return NPULM_OK;
}

npulm_status npu_afile_commit(struct npu_afile *f, npulm_error *err) {
  npulm_status st = flush(f, err);
  if (st == NPULM_OK && !f->direct && fsync(f->fd) != 0) st = io_fail(f, err);
  if (st == NPULM_OK && !f->direct) st = publish(f, err);
  if (st == NPULM_OK) {
    /* in place now: a late close error matters only where the data was not synced first */
    if (close(f->fd) != 0 && f->direct) st = io_fail(f, err);
    f->live = false;
  }
  npu_afile_abort(f);
  return st;
}

void npu_afile_abort(struct npu_afile *f) {
  if (f->live) {
    close(f->fd);
    if (f->tmp_path != NULL) unlink(f->tmp_path);
  }
  free(f->tmp_path);
  free(f->path);
  free(f->buf);
  *f = (struct npu_afile){.fd = -1};
}

npulm_status npu_afile_check_target(const char *path, const char *input, npulm_error *err) {
  if (path == NULL || path[0] == '\0') return npu_fail(err, NPULM_ERR_ARG, "no output path given");
  struct stat sb;
  if (input != NULL && stat(input, &sb) == 0 &&
      npu_file_is(path, (uint64_t)sb.st_dev, (uint64_t)sb.st_ino)) {
    return npu_fail(err, NPULM_ERR_ARG,
                    "'%s' is the model's own file: write the output to another path", path);
  }
  const size_t len = strlen(path);
  if (path[len - 1] == '/' || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))) {
    return npu_fail(err, NPULM_ERR_ARG, "cannot write '%s': it names a directory", path);
  }
  char *dir = dir_of(path);
  if (dir == NULL) return npu_fail(err, NPULM_ERR_NOMEM, "out of memory");
  const int ok = access(dir, W_OK | X_OK);
  const int access_errno = errno;
  free(dir);
  if (ok != 0) {
    return npu_fail(err, NPULM_ERR_IO, "cannot create '%s': %s", path, strerror(access_errno));
  }
  return NPULM_OK;
}

bool npu_file_is(const char *path, uint64_t dev, uint64_t ino) {
  struct stat sb;
  return stat(path, &sb) == 0 && (uint64_t)sb.st_dev == dev && (uint64_t)sb.st_ino == ino;
}
