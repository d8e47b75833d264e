/* index/vfaiss.h: a thin wrapper over one FAISS inner-product index, for vindex's FAISS
 * engine (the ANN candidate stage).
 *
 * The index is built by faiss_index_factory(dim, factory, METRIC_INNER_PRODUCT), for
 * example "HNSW32,Flat". Vectors get consecutive labels in the order they are added (0,
 * 1, ...): the caller maps labels to its own slots. Only factories whose index needs no
 * training are accepted (HNSW over Flat, Flat), and none that demand ids of their own
 * (IDMap): FAISS cannot remove vectors from HNSW, so the caller keeps tombstones and
 * rebuilds, and labels stay dense.
 *
 * efSearch: where the index has it (HNSW), it is set through FAISS's ParameterSpace at
 * creation, at deserialization and by vfaiss_set_ef; other indexes ignore it.
 *
 * Threads: FAISS 1.7.3 opens an OpenMP parallel region even for one query, and a second
 * thread adds 0.1-0.2 ms to the median and doubles the tail. vfaiss_search therefore runs
 * with one OpenMP thread on the caller's thread (it sets the calling thread's OpenMP
 * thread count to 1 for the call and restores it), and queries parallelize across callers.
 * vfaiss_add uses the calling thread's OpenMP setting: engramd runs with OMP_NUM_THREADS=1
 * (deploy/lib.sh), so an add runs on its caller's thread too.
 *
 * Thread-safety: vfaiss_search, vfaiss_count, vfaiss_dim, vfaiss_ef, vfaiss_bytes and
 * vfaiss_serialize only read, and may run concurrently with each other; vfaiss_add and
 * vfaiss_set_ef change the index and must not run concurrently with any other call on it
 * (the caller's lock). Creation and deserialization need no lock.
 *
 * Library: engram_vfaiss (vfaiss_dep), which links FAISS, OpenBLAS, OpenMP and libstdc++;
 * the vector index (engram_index) does not, and reaches this file only through
 * vfaiss_engine.
 *
 * Results: 0 success; negative errno for failures passed up (-ENOMEM, -EINVAL for invalid
 * arguments); positive VFAISS_E_* codes the caller handles. Where FAISS itself refused, the
 * text is in the err out-parameter (create, deserialize) or, for the other calls, from
 * vfaiss_last_error (faiss_get_last_error) on the same thread.
 */
#ifndef ENGRAM_INDEX_VFAISS_H
#define ENGRAM_INDEX_VFAISS_H

#include <stddef.h>
#include <stdint.h>

typedef struct vfaiss vfaiss;

enum {
    VFAISS_E_FAISS = 1, /* FAISS raised an error (bad factory string, I/O inside FAISS...) */
    VFAISS_E_TRAIN,     /* the factory builds an index that needs training: not supported */
    VFAISS_E_CORRUPT,   /* deserialize: not a FAISS index, or not an inner-product one */
};

/* vfaiss_create builds an empty index of dimension dim (1..65536) from factory with
 * faiss_index_factory and METRIC_INNER_PRODUCT, and sets its efSearch to ef_search when it
 * has one (ef_search 0: 16, FAISS's default). The factory string is copied. On success
 * *out owns the index (free with vfaiss_destroy). Returns 0; -EINVAL (dim out of range,
 * factory NULL or empty, ef_search negative); -ENOMEM; VFAISS_E_FAISS (FAISS refused the
 * factory: its text in err); VFAISS_E_TRAIN (the index needs training, or it is an IDMap).
 * err (errlen bytes, may be NULL when errlen is 0) gets a message on every failure. */
int vfaiss_create(size_t dim, const char *factory, int ef_search, vfaiss **out, char *err,
                  size_t errlen);

/* vfaiss_destroy frees the index; NULL is a no-op. No other call on f may be in progress. */
void vfaiss_destroy(vfaiss *f);

/* vfaiss_add adds n vectors (n x dim row-major floats; the caller normalizes them when it
 * wants cosine similarity) with labels vfaiss_count(f) .. vfaiss_count(f) + n - 1. n 0 is a
 * no-op. Returns 0, -EINVAL (n x dim overflows), -ENOMEM or VFAISS_E_FAISS (after a
 * failure, which of the n vectors the index kept is FAISS's business: check vfaiss_count).
 * Exclusive: no other call on f meanwhile. HNSW inserts are slow (about 0.4 ms per vector
 * at 768 dimensions on one AVX2 core). */
int vfaiss_add(vfaiss *f, size_t n, const float *vecs);

/* vfaiss_count returns the number of vectors added (the next label). vfaiss_dim returns the
 * dimension. vfaiss_factory returns the factory string the index was built from (also after
 * vfaiss_deserialize: it travels with the index), valid while f lives. */
size_t vfaiss_count(const vfaiss *f);
size_t vfaiss_dim(const vfaiss *f);
const char *vfaiss_factory(const vfaiss *f);

/* vfaiss_set_ef sets efSearch (>= 1) for later searches. Returns 0 (also when the index has
 * no efSearch: nothing changes), -EINVAL, or VFAISS_E_FAISS. Exclusive, like vfaiss_add.
 * vfaiss_ef returns the efSearch in force, or 0 when the index has none. */
int vfaiss_set_ef(vfaiss *f, int ef_search);
int vfaiss_ef(const vfaiss *f);

/* vfaiss_search writes the labels of up to k best vectors for the query q (dim floats) into
 * labels and their inner products with q into sims, best first; entries beyond what the
 * index finds get label -1 and similarity -INFINITY. Both arrays are the caller's, k
 * entries each. Runs on the caller's thread with one OpenMP thread; may run concurrently
 * with other searches and reads, never with vfaiss_add or vfaiss_set_ef. Allocates nothing
 * of its own (FAISS allocates per-query scratch). Returns 0, -EINVAL (k too large),
 * -ENOMEM or VFAISS_E_FAISS. k 0 returns 0 at once. */
int vfaiss_search(const vfaiss *f, const float *q, size_t k, int64_t *labels, float *sims);

/* vfaiss_bytes returns an estimate of the memory the index holds: per vector, its code
 * (from the factory's storage: Flat 4 x dim bytes, SQ8 dim, SQfp16 2 x dim, PQm m) plus,
 * for HNSW with M links, about 2 M + 1 neighbour ids at level 0 and above, its level and
 * offset; plus the handle. FAISS has no call that measures it; containers growing by
 * doubling may hold up to twice the estimate of graph links transiently. */
size_t vfaiss_bytes(const vfaiss *f);

/* vfaiss_serialize writes the index into a malloc'd buffer stored in *buf (*len bytes; the
 * caller frees it): a small header (magic, the factory string, efSearch, the length of what
 * follows), then FAISS's own format (faiss_write_index into an open_memstream). Returns 0,
 * -ENOMEM, or VFAISS_E_FAISS. A reader: may run concurrently with searches. */
int vfaiss_serialize(const vfaiss *f, void **buf, size_t *len);

/* vfaiss_deserialize reads an index from len bytes at buf written by vfaiss_serialize
 * (borrowed, not kept; faiss_read_index from an fmemopen stream), sets efSearch to
 * ef_search when > 0 (with 0 the efSearch in force when it was serialized stays), and
 * stores the new index in *out (the caller owns it). Bytes that are cut short or too long
 * are refused before FAISS reads them, but FAISS checks the rest only loosely: the caller
 * must know the bytes are intact (a checksum). Returns 0, -ENOMEM, -EINVAL (ef_search
 * negative), or VFAISS_E_CORRUPT (not a serialized index, or FAISS could not read it, or
 * not a trained inner-product index; err says which). err as in vfaiss_create. */
int vfaiss_deserialize(const void *buf, size_t len, int ef_search, vfaiss **out, char *err,
                       size_t errlen);

/* vfaiss_engine returns these functions as vindex's engine interface (vindex.h), for
 * vindex_opts.faiss_engine: a program that links engram_vfaiss passes it to give its
 * indexes the FAISS engine. The table is static (never freed); any thread. */
const struct vindex_engine_ops *vfaiss_engine(void);

/* vfaiss_last_error returns the message of the last FAISS error on this thread (FAISS keeps
 * it thread-local), or "" when there is none. Valid until the next FAISS call on this
 * thread. */
const char *vfaiss_last_error(void);

#endif
