/* index/vindex_rows.c: float rows read from a snapshot, mapped (see vindex_int.h, "Float rows
 * off the heap").
 *
 * A snapshot stores the rows of every slot in slot order, page-aligned and padded to whole
 * chunks, so chunk i's rows are at row i * ch_rows of the mapping. The mapping is private:
 * read-only but for its last chunk, whose slots past the snapshot take the rows of later adds
 * copy-on-write (anonymous pages; the file is never written). The kernel reads rows in on
 * demand (MADV_RANDOM: one page per fault, no readahead, since a search reads a dozen
 * scattered rows) and may drop them again; vi_rows_measure counts the pages in RAM (mincore)
 * and vi_rows_trim asks for them to be dropped (MADV_PAGEOUT: clean file pages are freed,
 * copy-on-write pages stay). A snapshot file is replaced by rename, never written in place,
 * so a mapping stays valid after its file is replaced or removed.
 */
#define _GNU_SOURCE /* MADV_PAGEOUT, RUSAGE_THREAD */

#include "vindex.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vindex_int.h"

/* vi_rows_map maps the rows of slots slots stored in fd from off; see vindex_int.h. */
vrows *vi_rows_map(const vindex *vi, int fd, uint64_t off, size_t slots, const char *path)
{
    size_t chunk_bytes = vi->ch_rows * vi->dim * sizeof(float);
    struct stat sb;
    if (slots == 0 || slots % vi->ch_rows || off % PAGE) {
        errno = EINVAL;
        return NULL;
    }
    if (fstat(fd, &sb))
        return NULL;
    vrows *r = calloc(1, sizeof(*r));
    if (!r || !(r->path = strdup(path))) {
        free(r);
        errno = ENOMEM;
        return NULL;
    }
    r->dev = (uint64_t)sb.st_dev;
    r->ino = (uint64_t)sb.st_ino;
    r->off = off;
    r->len = slots * vi->dim * sizeof(float);
    r->slots = slots;
    r->base = mmap(NULL, r->len, PROT_READ, MAP_PRIVATE, fd, (off_t)off);
    if (r->base == MAP_FAILED) {
        int e = errno;
        free(r->path);
        free(r);
        errno = e;
        return NULL;
    }
    /* the last chunk takes the rows of later adds; rounded down to a page, the writable
     * range may begin in the chunk before, whose rows are never written */
    size_t from = (r->len - chunk_bytes) & ~(size_t)(PAGE - 1);
    if (mprotect((char *)r->base + from, r->len - from, PROT_READ | PROT_WRITE)) {
        int e = errno;
        munmap(r->base, r->len);
        free(r->path);
        free(r);
        errno = e;
        return NULL;
    }
    madvise(r->base, r->len, MADV_RANDOM);
    return r;
}

/* vi_rows_unmap unmaps r; NULL is a no-op. */
void vi_rows_unmap(vrows *r)
{
    if (!r)
        return;
    munmap(r->base, r->len);
    free(r->path);
    free(r);
}

/* vi_rows_at returns the row of slot s in r. */
float *vi_rows_at(const vindex *vi, const vrows *r, size_t s)
{
    return (float *)r->base + s * vi->dim;
}

/* vi_rows_attach switches st's chunks below r->slots to r; see vindex_int.h. */
bool vi_rows_attach(vindex *vi, vstore *st, vrows *r, size_t saved, bool published, vrows **old)
{
    size_t nmap = r->slots >> vi->ch_shift;
    *old = NULL;
    if (nmap > st->nchunks || saved > st->nslots || saved > r->slots)
        return false;
    for (size_t i = 0; i < nmap; i++) {
        if (st->chunks[i]->cap != vi->ch_rows)
            return false; /* a chunk 0 still growing: its rows stay on the heap */
    }
    /* rows of slots the snapshot did not have, in its last chunk: into the copy-on-write
     * part of the mapping, before any search can read them there */
    size_t end = nmap << vi->ch_shift;
    for (size_t s = saved; s < end && s < st->nslots; s++) {
        const chunk *c = st_chunk(vi, st, s);
        memcpy(vi_rows_at(vi, r, s), row_in(vi, c, off_of(vi, s)), vi->dim * sizeof(float));
    }
    float **heap = malloc((nmap ? nmap : 1) * sizeof(float *));
    if (!heap)
        return false;
    size_t nheap = 0;
    if (published)
        wrlock(vi);
    for (size_t i = 0; i < nmap; i++) {
        chunk *c = st->chunks[i];
        if (!c->rows_mapped)
            heap[nheap++] = c->rows;
        c->rows = vi_rows_at(vi, r, i << vi->ch_shift);
        c->rows_mapped = true;
    }
    *old = st->rows;
    st->rows = r;
    if (published)
        unlock(vi);
    for (size_t i = 0; i < nheap; i++)
        free(heap[i]); /* no search reads them any more; the caller is not pinned */
    free(heap);
    return true;
}

/* vi_rows_measure returns the bytes of r in RAM now, and keeps them in r->resident. */
size_t vi_rows_measure(vrows *r)
{
    if (!r)
        return 0;
    size_t pages = (r->len + PAGE - 1) / PAGE;
    unsigned char *vec = malloc(pages);
    if (!vec)
        return atomic_load_explicit(&r->resident, memory_order_relaxed); /* the last stands */
    size_t in = 0;
    if (mincore(r->base, r->len, vec) == 0) {
        for (size_t i = 0; i < pages; i++)
            in += vec[i] & 1;
    }
    free(vec);
    size_t bytes = in * PAGE;
    bytes = bytes < r->len ? bytes : r->len;
    atomic_store_explicit(&r->resident, bytes, memory_order_relaxed);
    return bytes;
}

/* vi_rows_trim asks the kernel to reclaim r's pages. MADV_PAGEOUT unmaps them and frees
 * those it can; a large folio of the page cache that spans the mapping's edges (the rows
 * start at any page of the file) cannot be split and stays cached, unmapped: the file's own
 * POSIX_FADV_DONTNEED drops those, opened again by its path when that is still this file. */
void vi_rows_trim(vrows *r)
{
    if (!r)
        return;
#ifdef MADV_PAGEOUT
    madvise(r->base, r->len, MADV_PAGEOUT);
#else
    madvise(r->base, r->len, MADV_COLD);
#endif
    int fd = open(r->path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_dev == r->dev && (uint64_t)sb.st_ino == r->ino)
        posix_fadvise(fd, (off_t)r->off, (off_t)r->len, POSIX_FADV_DONTNEED);
    close(fd);
}

/* vi_faults returns the calling thread's major page faults so far. */
uint64_t vi_faults(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru))
        return 0;
    return (uint64_t)ru.ru_majflt;
}
