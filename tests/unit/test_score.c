/* tests/unit/test_score.c: server/score: the composite importance and the search blend.
 *
 * The expected values follow from the formula in score.h with the seed's defaults (weights
 * 0.3 recency, 0.3 access, 0.4 explicit; 30 days; 10 accesses), worked out by hand below,
 * and from the properties the index relies on (vindex_query in search: the blend rises with
 * similarity at slope w, and the composite's share never exceeds 1 - w).
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "score.h"

#define DAY_MS INT64_C(86400000)
#define NOW INT64_C(1700000000000)

static const score_params defaults = {.w_recency = 0.3,
                                      .w_access = 0.3,
                                      .w_explicit = 0.4,
                                      .recency_days = 30,
                                      .access_saturation = 10};

static int near(double a, double b)
{
    return fabs(a - b) < 1e-12;
}

static void test_terms(void)
{
    const score_params *p = &defaults;
    /* created now, never read, no explicit importance: recency alone, exp(0) = 1 */
    CHECK(near(score_composite(p, NOW, 0, 0, 0, 0.0, NOW), 0.3));
    /* each term at its maximum: the weights sum to 1 */
    CHECK(near(score_composite(p, NOW, 10, 0, 0, 1.0, NOW), 1.0));
    /* explicit importance enters linearly with weight 0.4 */
    CHECK(near(score_composite(p, NOW, 0, 0, 0, 0.5, NOW), 0.3 + 0.2));
    /* access frequency: 5 of 10 saturating accesses is half the access weight */
    CHECK(near(score_composite(p, NOW, 5, 0, 0, 0.0, NOW), 0.3 + 0.15));
    /* saturation: 10, 11 and a billion accesses count the same */
    double sat = score_composite(p, NOW, 10, 0, 0, 0.0, NOW);
    CHECK(near(sat, 0.6));
    CHECK(near(score_composite(p, NOW, 11, 0, 0, 0.0, NOW), sat));
    CHECK(near(score_composite(p, NOW, 1000000000u, 0, 0, 0.0, NOW), sat));
    /* recency: one decay constant (30 days) old is exp(-1) of the recency weight; 60 days
     * exp(-2); half a day exp(-1/60) */
    CHECK(near(score_composite(p, NOW - 30 * DAY_MS, 0, 0, 0, 0.0, NOW), 0.3 * exp(-1.0)));
    CHECK(near(score_composite(p, NOW - 60 * DAY_MS, 0, 0, 0, 0.0, NOW), 0.3 * exp(-2.0)));
    CHECK(near(score_composite(p, NOW - DAY_MS / 2, 0, 0, 0, 0.0, NOW), 0.3 * exp(-1.0 / 60.0)));
    /* a creation time in the future counts as age 0, not as extra recency */
    CHECK(near(score_composite(p, NOW + 5 * DAY_MS, 0, 0, 0, 0.0, NOW), 0.3));
    /* all three at once */
    CHECK(near(score_composite(p, NOW - 30 * DAY_MS, 3, 0, 0, 0.25, NOW),
               0.3 * exp(-1.0) + 0.3 * 0.3 + 0.4 * 0.25));
}

static void test_other_weights(void)
{
    /* the weights are settings: explicit importance alone */
    score_params only_explicit = {.w_recency = 0,
                                  .w_access = 0,
                                  .w_explicit = 1,
                                  .recency_days = 30,
                                  .access_saturation = 10};
    CHECK(near(score_composite(&only_explicit, NOW - 400 * DAY_MS, 50, 0, 0, 0.7, NOW), 0.7));
    /* a saturation of 1: the first access saturates */
    score_params quick = defaults;
    quick.access_saturation = 1;
    CHECK(near(score_composite(&quick, NOW, 1, 0, 0, 0.0, NOW), 0.6));
    /* a short decay: 1 day old at recency_days 1 is exp(-1) */
    score_params fast = defaults;
    fast.recency_days = 1;
    CHECK(near(score_composite(&fast, NOW - DAY_MS, 0, 0, 0, 0.0, NOW), 0.3 * exp(-1.0)));
}

/* The composite lies in [0, 1] (the index bounds the blend with it) and moves the right way
 * in each argument: older is lower, more accesses and more importance are not lower. */
static void test_bounds_and_monotonicity(void)
{
    const score_params *p = &defaults;
    const int64_t ages[] = {0, 1, DAY_MS, 7 * DAY_MS, 30 * DAY_MS, 365 * DAY_MS, 36500 * DAY_MS};
    const uint32_t accesses[] = {0, 1, 5, 9, 10, 100, UINT32_MAX};
    const double imps[] = {0.0, 0.1, 0.5, 0.9, 1.0};
    int out_of_range = 0, not_monotone = 0;
    for (size_t a = 0; a < sizeof(ages) / sizeof(ages[0]); a++)
        for (size_t c = 0; c < sizeof(accesses) / sizeof(accesses[0]); c++)
            for (size_t i = 0; i < sizeof(imps) / sizeof(imps[0]); i++) {
                double v = score_composite(p, NOW - ages[a], accesses[c], 0, 0, imps[i], NOW);
                if (!(v >= 0.0 && v <= 1.0 + 1e-12))
                    out_of_range++;
                if (a > 0 &&
                    v > score_composite(p, NOW - ages[a - 1], accesses[c], 0, 0, imps[i], NOW))
                    not_monotone++;
                if (c > 0 &&
                    v < score_composite(p, NOW - ages[a], accesses[c - 1], 0, 0, imps[i], NOW))
                    not_monotone++;
                if (i > 0 &&
                    v <= score_composite(p, NOW - ages[a], accesses[c], 0, 0, imps[i - 1], NOW))
                    not_monotone++;
            }
    CHECK_MSG(out_of_range == 0, "%d composites outside [0, 1]", out_of_range);
    CHECK_MSG(not_monotone == 0, "%d pairs in the wrong order", not_monotone);
    /* strictly lower with age while the recency weight is not zero */
    CHECK(score_composite(p, NOW - DAY_MS, 0, 0, 0, 0.5, NOW) <
          score_composite(p, NOW, 0, 0, 0, 0.5, NOW));
}

/* The usefulness term: (cited + 1) / (injected + 2), blended in with w_usefulness; at 0 the
 * seed's formula holds exactly whatever the counts. */
static void test_usefulness(void)
{
    CHECK(near(score_usefulness(0, 0), 0.5));
    CHECK(near(score_usefulness(1, 1), 2.0 / 3.0));
    CHECK(near(score_usefulness(0, 1), 1.0 / 3.0));
    CHECK(near(score_usefulness(9, 10), 10.0 / 12.0));
    CHECK(score_usefulness(UINT32_MAX, UINT32_MAX) <= 1.0);
    const score_params *p = &defaults;
    /* weight 0: counts change nothing, bit for bit */
    double base = score_composite(p, NOW - DAY_MS, 3, 0, 0, 0.25, NOW);
    CHECK(score_composite(p, NOW - DAY_MS, 3, 5, 7, 0.25, NOW) == base);
    CHECK(score_composite(p, NOW - DAY_MS, 3, 0, 100, 0.25, NOW) == base);
    /* weight 0.2: 0.8 * base + 0.2 * usefulness */
    score_params u = defaults;
    u.w_usefulness = 0.2;
    CHECK(near(score_composite(&u, NOW - DAY_MS, 3, 1, 1, 0.25, NOW),
               0.8 * base + 0.2 * (2.0 / 3.0)));
    /* a cited memory beats an injected-but-uncited twin; more citations are not lower */
    CHECK(score_composite(&u, NOW, 0, 1, 1, 0.5, NOW) >
          score_composite(&u, NOW, 0, 0, 1, 0.5, NOW));
    CHECK(score_composite(&u, NOW, 0, 2, 2, 0.5, NOW) >=
          score_composite(&u, NOW, 0, 1, 2, 0.5, NOW));
    /* still in [0, 1] at the extremes */
    u.w_usefulness = 1.0;
    CHECK(near(score_composite(&u, NOW, 10, 0, 0, 1.0, NOW), 0.5));
    CHECK(score_composite(&u, NOW, 10, UINT32_MAX, UINT32_MAX, 1.0, NOW) <= 1.0);
}

static void test_blend(void)
{
    /* the two ends: similarity alone, composite alone */
    CHECK(near(score_blend(1.0, 0.8, 0.1), 0.8));
    CHECK(near(score_blend(0.0, 0.8, 0.1), 0.1));
    /* the default share 0.7: 0.7 * 0.9 + 0.3 * 0.5 */
    CHECK(near(score_blend(0.7, 0.9, 0.5), 0.63 + 0.15));
    /* rises with similarity at slope w, and the composite adds at most 1 - w (what the index
     * assumes with score_slope, score_bound and score_monotone) */
    const double ws[] = {0.0, 0.3, 0.7, 1.0};
    for (size_t k = 0; k < sizeof(ws) / sizeof(ws[0]); k++) {
        double w = ws[k];
        for (double sim = -1.0; sim < 1.0; sim += 0.25) {
            double lo = score_blend(w, sim, 0.4), hi = score_blend(w, sim + 0.25, 0.4);
            CHECK(near(hi - lo, 0.25 * w));
            CHECK(score_blend(w, sim, 1.0) <= w * sim + (1.0 - w) + 1e-12);
            CHECK(score_blend(w, sim, 0.0) >= w * sim - 1e-12);
        }
    }
    /* a higher composite breaks a similarity tie, unless similarity is all that counts */
    CHECK(score_blend(0.7, 0.5, 0.9) > score_blend(0.7, 0.5, 0.2));
    CHECK(score_blend(1.0, 0.5, 0.9) == score_blend(1.0, 0.5, 0.2));
}

int main(void)
{
    test_terms();
    test_other_weights();
    test_bounds_and_monotonicity();
    test_usefulness();
    test_blend();
    CHECK_RETURN();
}
