/* Files written whole or not at all: the bytes go to a temporary file in the target's directory
 * (unnamed where the system allows it, so that a process killed while writing leaves nothing
 * behind), which is synced and then renamed over the target; until then the target keeps its old
 * contents. A process killed in the moment between naming the complete temporary and renaming it
 * leaves "<target>.tmp.<pid>.<n>", which the next write of the target removes. */
#ifndef NPU_BASE_ATOMIC_FILE_H
#define NPU_BASE_ATOMIC_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "npulm.h"

struct npu_afile {
  bool live; /* opened, and neither committed nor aborted yet */
  int fd;
  char *path;     /* the target (a symbolic link's target where 'path' named a link) */
  char *tmp_path; /* the named temporary file, or NULL while the file has no name */
  bool direct;    /* the target exists and is not a regular file (a device, a FIFO): written in
                     place, as there is nothing to rename over */
  uint8_t *buf;   /* write buffer */
  size_t used;
  size_t cap;
  uint64_t size; /* bytes written so far, buffered ones included */
};

/* Start writing a file that will replace 'path'. On error '*err' names the path and the reason,
 * and 'f' needs no abort. */
npulm_status npu_afile_open(const char *path, struct npu_afile *f, npulm_error *err);
/* Append 'n' bytes (buffered). */
npulm_status npu_afile_write(struct npu_afile *f, const void *data, size_t n, npulm_error *err);
/* Overwrite 'n' bytes already written at 'offset' (offset + n <= f->size). */
npulm_status npu_afile_pwrite(struct npu_afile *f, const void *data, size_t n, uint64_t offset,
                              npulm_error *err);
/* Flush, sync and put the file in place of the target (then sync its directory); the file is
 * closed whatever the outcome, and on failure the target is untouched and no temporary remains. */
npulm_status npu_afile_commit(struct npu_afile *f, npulm_error *err);
/* Give up: close and remove the temporary, leaving the target as it was. Accepts a file that was
 * committed, aborted or never opened (zero-initialized). */
void npu_afile_abort(struct npu_afile *f);

/* Whether a file can be written at 'path', said before the work that makes it: NPULM_ERR_ARG for
 * an empty path, a directory, or the file 'input' names (if not NULL: the file the work reads,
 * which the write would replace, by device and inode); NPULM_ERR_IO for a directory that does
 * not exist or cannot be written in. */
npulm_status npu_afile_check_target(const char *path, const char *input, npulm_error *err);

/* Whether 'path' names an existing file of device 'dev' and inode 'ino' (a file being read, which
 * a write to 'path' would replace). */
bool npu_file_is(const char *path, uint64_t dev, uint64_t ino);

#endif /* NPU_BASE_ATOMIC_FILE_H */
