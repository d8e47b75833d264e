/* index/vindex_fx.c: the FAISS engine's index of a vector index (see vindex.h, the engine
 * interface): when one is due, and its build over the live slots of a frozen view, in the
 * background, without blocking searches or writers.
 */
#include "vindex.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vindex_int.h"

/* vi_fx_due: the FAISS engine's index is missing, or its tail outgrew an eighth. */
bool vi_fx_due(const vindex *vi)
{
    if (vi->o.engine != VINDEX_ENGINE_FAISS || vi->s.kind != VINDEX_KIND_ANN)
        return false;
    size_t tail = vi->s.nslots - (vi->fx ? vi->fx_upto : 0);
    return !vi->fx_error && (!vi->fx || tail > 1024 + vi->s.live / 8);
}

/* what fx_error holds when even the message could not be allocated */
static char fx_oom[] = "out of memory";

/* vi_fx_clear_error frees the last build's failure. */
void vi_fx_clear_error(vindex *vi)
{
    if (vi->fx_error != fx_oom)
        free(vi->fx_error);
    vi->fx_error = NULL;
}

/* vi_fx_set_error records why the last build failed (under the exclusive lock: fx_due reads
 * it under the shared one). wmu held. */
void vi_fx_set_error(vindex *vi, const char *msg)
{
    char *e = strdup(msg && msg[0] ? msg : fx_oom);
    wrlock(vi);
    vi_fx_clear_error(vi);
    vi->fx_error = e ? e : fx_oom;
    unlock(vi);
}

/* add_live feeds the live slots below n of the view to the engine's index in batches, their
 * slots into slots. Returns 0, -errno or VINDEX_E_FAISS (err says why). */
static int add_live(vindex *vi, const view *v, size_t n, vindex_eix *fx, uint32_t *slots,
                    size_t *nl, char *err, size_t errlen)
{
    enum { BATCH = 1024 };
    const vindex_engine_ops *eng = vi->o.faiss_engine;
    float *buf = malloc((size_t)BATCH * vi->dim * sizeof(float));
    if (!buf)
        return -ENOMEM;
    size_t in = 0;
    int rc = 0;
    for (size_t s = 0; s <= n && rc == 0; s++) {
        bool end = s == n;
        if (!end && !view_tomb(v, s)) {
            memcpy(buf + in * vi->dim, row_in(vi, &v->ch[s >> vi->ch_shift], s & vi->ch_mask),
                   vi->dim * sizeof(float));
            slots[*nl + in++] = (uint32_t)s;
        }
        if (in == BATCH || (end && in)) {
            int frc = eng->add(fx, in, buf);
            if (frc) {
                snprintf(err, errlen, "add: %s%s", frc < 0 ? strerror(-frc) : eng->name,
                         frc < 0 ? "" : " error");
                rc = frc < 0 ? frc : VINDEX_E_FAISS;
            }
            *nl += in;
            in = 0;
        }
    }
    free(buf);
    return rc;
}

/* vi_fx_build builds the FAISS engine's index over the live slots of a view, without locks
 * (rows never change once published; maint_mu keeps slots from being renumbered), and
 * publishes it. maint_mu held. Returns 1, -ENOMEM, or VINDEX_E_FAISS (fx_error says why;
 * searches go on with the native codes). */
int vi_fx_build(vindex *vi)
{
    pthread_mutex_lock(&vi->wmu);
    size_t n = vi->s.nslots;
    view v;
    int rc = vi_view_take(vi, &v);
    if (rc == 0)
        vi->pinned = true;
    pthread_mutex_unlock(&vi->wmu);
    if (rc)
        return rc;
    const vindex_engine_ops *eng = vi->o.faiss_engine;
    vindex_eix *fx = NULL;
    uint32_t *slots = malloc((v.live + 1) * sizeof(uint32_t));
    char err[160] = "";
    size_t nl = 0;
    if (!slots) {
        rc = -ENOMEM;
    } else if (!eng) {
        snprintf(err, sizeof(err), "no FAISS engine: this program does not link one");
        rc = VINDEX_E_FAISS;
    } else {
        int frc =
            eng->create(vi->dim, vi->o.faiss_factory ? vi->o.faiss_factory : "HNSW32,Flat",
                        vi->o.faiss_ef_search ? vi->o.faiss_ef_search : 64, &fx, err, sizeof(err));
        rc = frc < 0 ? frc : frc ? VINDEX_E_FAISS : 0;
        if (rc == 0)
            rc = add_live(vi, &v, n, fx, slots, &nl, err, sizeof(err));
    }
    pthread_mutex_lock(&vi->wmu);
    vindex_eix *ofx = NULL;
    uint32_t *oslot = NULL;
    if (rc == 0) {
        wrlock(vi);
        ofx = vi->fx;
        oslot = vi->fx_slot;
        vi->fx = fx;
        vi->fx_slot = slots;
        vi->fx_n = nl;
        vi->fx_upto = n;
        vi->code_gen++; /* the candidates change: measured anew */
        vi_fx_clear_error(vi);
        unlock(vi);
        fx = NULL;
        slots = NULL;
    } else {
        vi_fx_set_error(vi, err);
    }
    vi_unpin(vi);
    pthread_mutex_unlock(&vi->wmu);
    fx_destroy(vi, ofx);
    free(oslot);
    fx_destroy(vi, fx);
    free(slots);
    vi_view_free(&v);
    return rc ? rc : 1;
}
