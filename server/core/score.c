/* server/core/score.c: composite importance (see score.h). */
#include "score.h"

#include <math.h>

double score_usefulness(uint32_t cited, uint32_t injected)
{
    return ((double)cited + 1.0) / ((double)injected + 2.0);
}

double score_composite(const score_params *p, int64_t created_ms, uint32_t access_count,
                       uint32_t cited, uint32_t injected, double importance, int64_t now_ms)
{
    double age_days = now_ms > created_ms ? (double)(now_ms - created_ms) / 86400000.0 : 0.0;
    double recency = exp(-age_days / p->recency_days);
    double access = (double)access_count / p->access_saturation;
    if (access > 1.0)
        access = 1.0;
    double base = p->w_recency * recency + p->w_access * access + p->w_explicit * importance;
    if (p->w_usefulness == 0.0)
        return base; /* the seed's formula, bit for bit */
    return (1.0 - p->w_usefulness) * base + p->w_usefulness * score_usefulness(cited, injected);
}

double score_blend(double w, double similarity, double composite)
{
    return w * similarity + (1.0 - w) * composite;
}
