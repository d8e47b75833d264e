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
 *
 * Rows kept in RAM. A search marks the pages of every mapped row it reads (vi_rows_touch, one
 * bit a page); vi_rows_keep, called about once a second, holds the file pages in RAM to a
 * cap: past it, the pages no search read since the last call go first (the recall monitor's
 * probes and queries that came once), then, if that was not enough, those read past the
 * cap's worth of them (in file order), so a working set larger than the cap keeps the cap's
 * worth in RAM instead of reading all of it back. A clock with one bit, at the cost of one
 * bit per 4 KiB mapped (0.03 % of the rows).
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
    r->pages = (r->len + PAGE - 1) / PAGE;
    r->cow_page = from / PAGE; /* until the mapper says which slots the file holds */
    r->touched = calloc((r->pages + 63) / 64, sizeof(uint64_t));
    if (!r->touched) {
        munmap(r->base, r->len);
        free(r->path);
        free(r);
        errno = ENOMEM;
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
    free(r->touched);
    free(r->path);
    free(r);
}

void vi_rows_cow_from(const vindex *vi, vrows *r, size_t s)
{
    size_t p = s * vi->dim * sizeof(float) / PAGE;
    r->cow_page = p < r->pages ? p : r->pages;
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
    vi_rows_cow_from(vi, r, saved);
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

/* in_core returns which of r's pages are in RAM (mincore: bit 0 of each byte), a vector the
 * caller frees, or NULL. */
static unsigned char *in_core(const vrows *r)
{
    unsigned char *vec = malloc(r->pages);
    if (vec && mincore(r->base, r->len, vec)) {
        free(vec);
        return NULL;
    }
    return vec;
}

/* set_resident keeps and returns the bytes of n pages of r in RAM (its last page may be
 * short). */
static size_t set_resident(vrows *r, size_t n)
{
    size_t bytes = n * PAGE < r->len ? n * PAGE : r->len;
    atomic_store_explicit(&r->resident, bytes, memory_order_relaxed);
    return bytes;
}

/* vi_rows_measure returns the bytes of r in RAM now, and keeps them in r->resident. */
size_t vi_rows_measure(vrows *r)
{
    if (!r)
        return 0;
    unsigned char *vec = in_core(r);
    if (!vec)
        return atomic_load_explicit(&r->resident, memory_order_relaxed); /* the last stands */
    size_t in = 0;
    for (size_t p = 0; p < r->pages; p++)
        in += vec[p] & 1;
    free(vec);
    return set_resident(r, in);
}

/* open_same opens r's file again by its path, when the path still names the file r maps:
 * an fd the caller closes, or -1. */
static int open_same(const vrows *r)
{
    int fd = open(r->path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) || (uint64_t)sb.st_dev != r->dev || (uint64_t)sb.st_ino != r->ino) {
        close(fd);
        return -1;
    }
    return fd;
}

/* drop asks the kernel to reclaim pages [from, to) of r; fd is r's file or -1. */
static void drop(vrows *r, int fd, size_t from, size_t to)
{
    size_t len = (to - from) * PAGE;
    if (from * PAGE + len > r->len)
        len = r->len - from * PAGE;
#ifdef MADV_PAGEOUT
    madvise((char *)r->base + from * PAGE, len, MADV_PAGEOUT);
#else
    madvise((char *)r->base + from * PAGE, len, MADV_COLD);
#endif
    if (fd >= 0)
        posix_fadvise(fd, (off_t)(r->off + from * PAGE), (off_t)len, POSIX_FADV_DONTNEED);
}

/* vi_rows_trim asks the kernel to reclaim r's pages. MADV_PAGEOUT unmaps them and frees
 * those it can; a large folio of the page cache that spans the mapping's edges (the rows
 * start at any page of the file) cannot be split and stays cached, unmapped: the file's own
 * POSIX_FADV_DONTNEED drops those, opened again by its path when that is still this file. */
void vi_rows_trim(vrows *r)
{
    if (!r)
        return;
    int fd = open_same(r);
    drop(r, fd, 0, r->pages);
    if (fd >= 0)
        close(fd);
}

void vi_rows_touch(const vindex *vi, vrows *r, const float *row)
{
    const char *base = r->base;
    if ((const char *)row < base || (const char *)(row + vi->dim) > base + r->len)
        return; /* a row of another mapping (a storage under construction) */
    size_t a = (size_t)((const char *)row - base) / PAGE;
    size_t b = (size_t)((const char *)(row + vi->dim) - 1 - base) / PAGE;
    for (size_t p = a; p <= b; p++) {
        uint64_t bit = 1ull << (p & 63);
        /* a load first: the bit is usually set already, and a read shares the cache line */
        if (!(atomic_load_explicit(&r->touched[p >> 6], memory_order_relaxed) & bit))
            atomic_fetch_or_explicit(&r->touched[p >> 6], bit, memory_order_relaxed);
    }
}

/* cold tells whether page p is in RAM (vec) and no search read it since the last call (used). */
static bool cold(const unsigned char *vec, const uint64_t *used, size_t p)
{
    return (vec[p] & 1) && !(used[p >> 6] >> (p & 63) & 1);
}

/* vi_rows_keep: see vindex_int.h and "Rows kept in RAM" above. */
size_t vi_rows_keep(vrows *r, double percent, size_t *dropped_bytes)
{
    if (!r)
        return 0;
    size_t words = (r->pages + 63) / 64;
    uint64_t *used = malloc(words * sizeof(uint64_t));
    unsigned char *vec = used ? in_core(r) : NULL;
    if (!vec) {
        free(used);
        return vi_rows_measure(r);
    }
    /* which pages searches read since the last call, cleared for the next */
    for (size_t w = 0; w < words; w++)
        used[w] = atomic_exchange_explicit(&r->touched[w], 0, memory_order_relaxed);
    size_t nhot = 0, ncold = 0, ncow = 0;
    for (size_t p = 0; p < r->pages; p++) {
        if (p >= r->cow_page)
            ncow += vec[p] & 1;
        else if (cold(vec, used, p))
            ncold++;
        else
            nhot += vec[p] & 1;
    }
    size_t cap = (size_t)((double)r->len * percent / 100.0), dropped = 0;
    if ((nhot + ncold) * PAGE > cap) {
        /* the cold pages go; if the pages searches use are more than the cap too, those
         * past the cap's worth of them (in file order: one bit tells no more) go as well */
        size_t keep_hot = nhot * PAGE > cap ? cap / PAGE : nhot, seen_hot = 0;
        int fd = open_same(r);
        /* runs of pages to drop, one call each; pages not in RAM do not break a run */
        size_t run = 0, end = 0; /* [run, end): the run so far, empty when end == run */
        for (size_t p = 0; p < r->cow_page; p++) {
            if (!(vec[p] & 1))
                continue;
            if (cold(vec, used, p) || seen_hot++ >= keep_hot) {
                if (end == run)
                    run = p;
                end = p + 1;
                dropped++;
            } else if (end != run) {
                drop(r, fd, run, end);
                run = end = 0;
            }
        }
        if (end != run)
            drop(r, fd, run, end);
        if (fd >= 0)
            close(fd);
    }
    free(vec);
    free(used);
    if (!dropped)
        return set_resident(r, nhot + ncold + ncow);
    *dropped_bytes += dropped * PAGE;
    return vi_rows_measure(r); /* what the kernel could not drop stays counted */
}

/* vi_faults returns the calling thread's major page faults so far. */
uint64_t vi_faults(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru))
        return 0;
    return (uint64_t)ru.ru_majflt;
}
