/* server/core/score.h: the composite importance of a memory and the search ranking.
 *
 * base      = w_recency * exp(-age_days / recency_days)
 *           + w_access  * min(access_count / access_saturation, 1)
 *           + w_explicit * importance
 * with the seed's defaults 0.3 / 0.3 / 0.4, 30 days and 10 accesses (settings score_*); the
 * weights sum to 1 (checked at start), so base lies in [0, 1].
 *
 * usefulness = (cited + 1) / (injected + 2), from the provenance feedback (memory.feedback):
 * the share of injections the model cited, smoothed by one cited and one uncited
 * injection, so a memory without feedback sits at 0.5 and a few reports move it
 * gradually. composite = (1 - w_usefulness) * base + w_usefulness * usefulness, in [0, 1];
 * with w_usefulness 0 (setting score_w_usefulness, the default) the composite is exactly
 * the seed's base. PostgreSQL computes the same (engram_composite, engram_composite_u).
 *
 * A search scores each candidate as score = similarity_weight * similarity +
 * (1 - similarity_weight) * composite.
 */
#ifndef ENGRAM_SERVER_SCORE_H
#define ENGRAM_SERVER_SCORE_H

#include <stdint.h>

typedef struct score_params {
    double w_recency;
    double w_access;
    double w_explicit;
    double recency_days;
    double access_saturation;
    double w_usefulness; /* 0: the seed's formula */
} score_params;

/* score_composite returns the composite importance of a memory created at created_ms with
 * access_count reads, cited / injected feedback counts and explicit importance, as of
 * now_ms. A creation time in the future counts as age 0. */
double score_composite(const score_params *p, int64_t created_ms, uint32_t access_count,
                       uint32_t cited, uint32_t injected, double importance, int64_t now_ms);

/* score_usefulness returns (cited + 1) / (injected + 2). */
double score_usefulness(uint32_t cited, uint32_t injected);

/* score_blend returns the search score of a candidate: w * similarity + (1 - w) *
 * composite, w being the search's similarity_weight in [0, 1]. */
double score_blend(double w, double similarity, double composite);

#endif
