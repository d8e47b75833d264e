/* server/domain/textrule.c: the text rules of consolidation (see textrule.h).
 *
 * A text becomes a sequence of tokens: words (runs of letters, digits after a letter and
 * non-ASCII bytes, lower-cased, apostrophes joined, a possessive 's dropped) and values
 * (numbers with their currency, percent and unit; dates; times; '#' numbers), with ':' and
 * '=' kept as separators that only the classification looks at. A few words that never
 * change what a sentence states are dropped (a, an, the, now, currently, still). Each value
 * is then classified as a quantity (may change in an update) or an identifier (names a
 * thing: must be equal) from its neighbours, and three hashes are taken: of everything, of
 * everything but the quantities' numbers, and of the quantities' numbers.
 */
#include "textrule.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wordlist.h"
#include "xxh64.h"

enum { K_WORD, K_NUM, K_DATE, K_TIME, K_ID, K_EQ };

/* One token. Words are lower-cased into the call's word buffer (woff, wlen); values carry
 * their canonical form (canon) and the unit part of it (unit: currency prefix and suffix). */
typedef struct tok {
    unsigned char kind;
    bool attached; /* a value with a unit of its own (%, currency, suffix) */
    bool quantity; /* a value that may change in an update */
    bool isint;    /* a whole number without unit (or with an ordinal suffix): ival is set */
    bool ordinal;  /* 5th, 1st */
    bool first;    /* the first token of the text */
    bool compound; /* a number joined by a hyphen to the word after it: 7-day */
    bool slash;    /* a number right after another and '/': the 85 of 130/85 */
    bool cap;      /* the word began with a capital letter */
    size_t woff, wlen;
    size_t soff, slen; /* the source bytes (for the reasons) */
    long long ival;
    char canon[32];
    char unit[12];
} tok;

/* ---- word lists (sorted: searched by bisection; textrule_selfcheck checks them) ---------- */

static const char *const copulas[] = {"are",     "be",    "became", "become", "becomes", "been",
                                      "being",   "equal", "equals", "is",     "remain",  "remained",
                                      "remains", "stay",  "stayed", "stays",  "was",     "were"};

/* verbs after which a date or time is what the sentence states (directly or through a
 * preposition): "was moved to", "expires on", "due" */
static const char *const date_verbs[] = {
    "arrives", "begin",       "begins",    "booked", "born",  "changed", "closes",    "delayed",
    "departs", "due",         "end",       "ended",  "ends",  "expire",  "expired",   "expires",
    "launch",  "launches",    "leaves",    "moved",  "opens", "planned", "postponed", "renew",
    "renews",  "rescheduled", "scheduled", "set",    "start", "started", "starts"};

static const char *const date_preps[] = {"after", "at", "before", "by", "for",  "from",
                                         "in",    "on", "till",   "to", "until"};

/* words after which a number is an amount: verbs of having, costing and measuring, and the
 * prepositions of quantities */
static const char *const num_intro[] = {
    "about",    "above",   "almost",   "approximately", "around",   "at",     "average",
    "averages", "below",   "by",       "charges",       "contains", "cost",   "costs",
    "down",     "earn",    "earns",    "eats",          "employs",  "every",  "for",
    "from",     "gets",    "had",      "has",           "have",     "held",   "hits",
    "hold",     "holds",   "includes", "least",         "most",     "nearly", "needs",
    "of",       "only",    "over",     "owns",          "pay",      "pays",   "per",
    "reaches",  "returns", "roughly",  "runs",          "scores",   "sleeps", "takes",
    "than",     "to",      "totals",   "under",         "up",       "uses",   "walks",
    "weighs",   "with",    "worth",    "yields"};

/* words that name a thing by a number after them: the number is an identifier */
static const char *const id_words[] = {
    "account", "agent",    "apartment",  "apt",    "block",   "building", "bus",     "case",
    "chain",   "chapter",  "class",      "day",    "episode", "epoch",    "flight",  "floor",
    "gate",    "gen",      "generation", "grade",  "group",   "house",    "id",      "issue",
    "item",    "job",      "lane",       "level",  "line",    "lot",      "model",   "month",
    "no",      "node",     "number",     "option", "order",   "page",     "part",    "phase",
    "plan",    "platform", "pool",       "port",   "pr",      "region",   "release", "room",
    "round",   "route",    "run",        "season", "seat",    "section",  "series",  "server",
    "shard",   "slot",     "sprint",     "stage",  "step",    "suite",    "table",   "task",
    "team",    "terminal", "test",       "ticket", "tier",    "track",    "type",    "unit",
    "vault",   "version",  "volume",     "wallet", "ward",    "week",     "zone"};

/* words after a number that make it an amount of something */
static const char *const unit_words[] = {
    "aud",      "bn",      "bp",        "bpm",       "bps",         "btc",        "cad",
    "cal",      "calorie", "calories",  "cent",      "centimeters", "cents",      "chf",
    "children", "cm",      "customers", "dai",       "day",         "days",       "degrees",
    "dollar",   "dollars", "employees", "engineers", "eth",         "eur",        "euro",
    "euros",    "feet",    "foot",      "ft",        "g",           "gal",        "gallon",
    "gallons",  "gb",      "gbp",       "gbps",      "ghz",         "gib",        "grams",
    "gwei",     "h",       "hour",      "hours",     "hr",          "hrs",        "hz",
    "inch",     "inches",  "items",     "jpy",       "k",           "kb",         "kcal",
    "kg",       "kgs",     "kids",      "kilograms", "kilometers",  "kilometres", "kilos",
    "km",       "kw",      "kwh",       "l",         "laps",        "lb",         "lbs",
    "liter",    "liters",  "litre",     "litres",    "m",           "matic",      "mb",
    "mbps",     "members", "meter",     "meters",    "metre",       "metres",     "mg",
    "mhz",      "mi",      "mib",       "mile",      "miles",       "million",    "min",
    "mins",     "minute",  "minutes",   "ml",        "mm",          "month",      "months",
    "ms",       "mw",      "night",     "nights",    "ounce",       "ounces",     "oz",
    "pct",      "people",  "percent",   "points",    "pound",       "pounds",     "pts",
    "qps",      "reps",    "rpm",       "rps",       "s",           "sats",       "sec",
    "second",   "seconds", "secs",      "sets",      "shares",      "sol",        "steps",
    "students", "tb",      "thousand",  "tib",       "times",       "tokens",     "ton",
    "tonnes",   "tons",    "tps",       "usd",       "usdc",        "usdt",       "users",
    "v",        "w",       "wbtc",      "week",      "weeks",       "wei",        "weth",
    "x",        "year",    "years",     "yen",       "yr",          "yrs"};

/* currency codes that may stand before an amount ("USD 500") */
static const char *const currencies[] = {"aud", "btc", "cad", "chf", "dai",  "eth", "eur",
                                         "gbp", "jpy", "sol", "usd", "usdc", "usdt"};

/* past tenses of verbs of events: a number after one counts what happened once ("bought 10
 * ETH", "ran 5 km"), not a state that a newer text updates (besides verbs ending in -ed) */
static const char *const past_events[] = {
    "ate",   "bought", "brought", "built",    "came",  "caught", "chose", "did",
    "drank", "drew",   "drove",   "fell",     "flew",  "forgot", "found", "gave",
    "got",   "grew",   "hit",     "knew",     "lent",  "left",   "lost",  "made",
    "met",   "paid",   "ran",     "rode",     "rose",  "sank",   "saw",   "sent",
    "shot",  "slept",  "sold",    "spent",    "spoke", "stole",  "swam",  "taught",
    "threw", "told",   "took",    "withdrew", "woke",  "won",    "wore",  "wrote"};

/* negative contractions, written out: "doesn't" (doesnt) is "does not" */
static const char *const contractions[] = {
    "arent",  "cannot", "cant",   "couldnt", "didnt",    "doesnt", "dont",   "hadnt", "hasnt",
    "havent", "isnt",   "mustnt", "neednt",  "shouldnt", "wasnt",  "werent", "wont",  "wouldnt"};
/* the first word of each of contractions[] */
static const char *const contraction_head[] = {"are",  "can",    "can", "could", "did",  "does",
                                               "do",   "had",    "has", "have",  "is",   "must",
                                               "need", "should", "was", "were",  "will", "would"};

static const char *const fillers[] = {"an", "currently", "now", "still", "the"};

static const char *const months[] = {"apr", "april",    "aug",   "august",  "dec",      "december",
                                     "feb", "february", "jan",   "january", "jul",      "july",
                                     "jun", "june",     "march", "may",     "nov",      "november",
                                     "oct", "october",  "sep",   "sept",    "september"};
/* the month number of each entry of months[] */
static const int month_no[] = {4, 4, 8, 8, 12, 12, 2,  2,  1, 1, 7, 7,
                               6, 6, 3, 5, 11, 11, 10, 10, 9, 9, 9};

static const char *const weekdays[] = {"friday",   "monday",  "saturday", "sunday",
                                       "thursday", "tuesday", "wednesday"};

int textrule_selfcheck(void)
{
    const struct {
        const char *const *l;
        size_t n;
    } lists[] = {{WORDLIST(copulas)},    {WORDLIST(date_verbs)}, {WORDLIST(date_preps)},
                 {WORDLIST(num_intro)},  {WORDLIST(id_words)},   {WORDLIST(unit_words)},
                 {WORDLIST(currencies)}, {WORDLIST(fillers)},    {WORDLIST(months)},
                 {WORDLIST(weekdays)}};
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++)
        if (!wordlist_sorted(lists[k].l, lists[k].n))
            return (int)k + 1;
    if (sizeof(month_no) / sizeof(month_no[0]) != sizeof(months) / sizeof(months[0]))
        return 9;
    if (sizeof(contraction_head) / sizeof(contraction_head[0]) !=
        sizeof(contractions) / sizeof(contractions[0]))
        return 12;
    return 0;
}

/* ---- bytes ------------------------------------------------------------------------------ */

enum { SP_NONE, SP_APOS, SP_SEP, SP_CUR, SP_DEG, SP_MINUS };

/* What the non-ASCII sequence at s[i] is to the tokenizer; *n its length. */
static int special(const unsigned char *s, size_t len, size_t i, size_t *n)
{
    *n = 1;
    if (s[i] == 0xC2 && i + 1 < len) {
        *n = 2;
        switch (s[i + 1]) {
        case 0xA0: /* no-break space */
        case 0xAB: /* guillemets */
        case 0xBB:
            return SP_SEP;
        case 0xA3: /* pound, yen */
        case 0xA5:
            return SP_CUR;
        case 0xB0: /* degree */
            return SP_DEG;
        }
        return SP_NONE;
    }
    if (s[i] == 0xE2 && i + 2 < len && s[i + 1] == 0x80) {
        *n = 3;
        if (s[i + 2] == 0x98 || s[i + 2] == 0x99)
            return SP_APOS;
        if ((s[i + 2] >= 0x90 && s[i + 2] <= 0x9F) || s[i + 2] == 0xA6)
            return SP_SEP; /* dashes, quotes, ellipsis */
        return SP_NONE;
    }
    if (s[i] == 0xE2 && i + 2 < len && s[i + 1] == 0x82 && s[i + 2] == 0xAC) {
        *n = 3;
        return SP_CUR; /* euro */
    }
    if (s[i] == 0xE2 && i + 2 < len && s[i + 1] == 0x88 && s[i + 2] == 0x92) {
        *n = 3;
        return SP_MINUS;
    }
    return SP_NONE;
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static bool is_alpha(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static unsigned char lower(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

/* A byte that continues a word at s[i]: ASCII letters and digits, non-ASCII bytes that are
 * not punctuation the tokenizer knows. */
static bool word_byte(const unsigned char *s, size_t len, size_t i)
{
    size_t n;
    if (is_alpha(s[i]) || is_digit(s[i]))
        return true;
    return s[i] >= 0x80 && (s[i] & 0xC0) != 0x80 ? special(s, len, i, &n) == SP_NONE : s[i] >= 0x80;
}

/* An apostrophe at s[i] (ASCII or U+2019/U+2018); its length in *n. */
static bool is_apos(const unsigned char *s, size_t len, size_t i, size_t *n)
{
    if (s[i] == '\'') {
        *n = 1;
        return true;
    }
    return s[i] >= 0x80 && special(s, len, i, n) == SP_APOS;
}

/* ---- tokenizing ------------------------------------------------------------------------- */

typedef struct scan {
    const unsigned char *s;
    size_t len;
    tok *t;
    size_t n;
    char *w; /* word buffer: every word's lower-cased bytes */
    size_t wn;
} scan;

static tok *push(scan *sc, unsigned char kind, size_t soff, size_t slen)
{
    tok *t = &sc->t[sc->n++];
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->soff = soff;
    t->slen = slen;
    t->first = sc->n == 1;
    return t;
}

/* Scans a word from s[i] (a word byte); returns the index after it. Apostrophes inside are
 * dropped ("don't" is "dont"); a possessive 's is dropped with its apostrophe. */
static size_t scan_word(scan *sc, size_t i)
{
    const unsigned char *s = sc->s;
    size_t start = i, n;
    tok *t = push(sc, K_WORD, i, 0);
    t->woff = sc->wn;
    t->cap = s[i] >= 'A' && s[i] <= 'Z';
    while (i < sc->len) {
        if (word_byte(s, sc->len, i)) {
            sc->w[sc->wn++] = (char)lower(s[i]);
            i++;
        } else if (is_apos(s, sc->len, i, &n) && i + n < sc->len && word_byte(s, sc->len, i + n)) {
            if (lower(s[i + n]) == 's' &&
                (i + n + 1 >= sc->len || !word_byte(s, sc->len, i + n + 1))) {
                i += n + 1;
                break;
            }
            i += n;
        } else {
            break;
        }
    }
    t->wlen = sc->wn - t->woff;
    t->slen = i - start;
    /* a negative contraction becomes two words (the buffer has room: see analyze) */
    char b[12];
    int c = -1;
    if (t->wlen < sizeof(b)) {
        memcpy(b, sc->w + t->woff, t->wlen);
        b[t->wlen] = '\0';
        c = wordlist_find(b, WORDLIST(contractions));
    }
    if (c >= 0) {
        size_t hl = strlen(contraction_head[c]);
        memcpy(sc->w + t->woff, contraction_head[c], hl);
        t->wlen = hl;
        sc->wn = t->woff + hl;
        tok *nt = push(sc, K_WORD, t->soff, t->slen);
        nt->woff = sc->wn;
        memcpy(sc->w + sc->wn, "not", 3);
        nt->wlen = 3;
        sc->wn += 3;
    }
    return i;
}

/* Parses up to max digits at s[i]; returns how many (0 if none), the value in *v. */
static size_t digits(const unsigned char *s, size_t len, size_t i, size_t max, long long *v)
{
    size_t k = 0;
    *v = 0;
    while (i + k < len && k < max && is_digit(s[i + k])) {
        *v = *v * 10 + (s[i + k] - '0');
        k++;
    }
    return k;
}

/* After a value ending at s[i]: nothing that would continue a word. */
static bool ends_value(const unsigned char *s, size_t len, size_t i)
{
    return i >= len || !word_byte(s, len, i);
}

/* am/pm at s[i] (after optional spaces, "am", "a.m.", "pm", "p.m."): 1 am, 2 pm, 0 none; *end
 * after it. */
static int ampm(const unsigned char *s, size_t len, size_t i, size_t *end)
{
    while (i < len && s[i] == ' ')
        i++;
    if (i + 1 >= len || (lower(s[i]) != 'a' && lower(s[i]) != 'p'))
        return 0;
    int which = lower(s[i]) == 'a' ? 1 : 2;
    if (lower(s[i + 1]) == 'm' && ends_value(s, len, i + 2)) {
        *end = i + 2;
        return which;
    }
    if (s[i + 1] == '.' && i + 3 < len && lower(s[i + 2]) == 'm' && s[i + 3] == '.') {
        *end = i + 4;
        return which;
    }
    return 0;
}

/* Scans a date or a time at s[i] (a digit) into a token; returns the index after it, or 0
 * when there is none. */
static size_t scan_date(scan *sc, size_t start, size_t i)
{
    const unsigned char *s = sc->s;
    size_t len = sc->len, k;
    long long a, b, c;
    tok *t;
    /* 2024-06-01 */
    if (digits(s, len, i, 4, &a) == 4 && i + 4 < len && s[i + 4] == '-' &&
        (k = digits(s, len, i + 5, 2, &b)) > 0 && i + 5 + k < len && s[i + 5 + k] == '-') {
        size_t k2 = digits(s, len, i + 6 + k, 2, &c);
        size_t end = i + 6 + k + k2;
        if (k2 > 0 && b >= 1 && b <= 12 && c >= 1 && c <= 31 && ends_value(s, len, end)) {
            t = push(sc, K_DATE, start, end - start);
            snprintf(t->canon, sizeof(t->canon), "%04lld-%02lld-%02lld", a, b, c);
            return end;
        }
    }
    /* 5/3/2024, 05/03/24 */
    if ((k = digits(s, len, i, 2, &a)) > 0 && i + k < len && s[i + k] == '/') {
        size_t j = i + k + 1, k1 = digits(s, len, j, 2, &b);
        if (k1 > 0 && j + k1 < len && s[j + k1] == '/') {
            size_t k2 = digits(s, len, j + k1 + 1, 4, &c), end = j + k1 + 1 + k2;
            if ((k2 == 2 || k2 == 4) && ends_value(s, len, end)) {
                t = push(sc, K_DATE, start, end - start);
                snprintf(t->canon, sizeof(t->canon), "%lld/%lld/%lld", a, b, c);
                return end;
            }
        }
    }
    /* 10:30, 9:05:00, 8:30 pm */
    if ((k = digits(s, len, i, 2, &a)) > 0 && i + k + 2 < len && s[i + k] == ':' &&
        digits(s, len, i + k + 1, 2, &b) == 2 && a <= 24 && b <= 59) {
        size_t end = i + k + 3;
        if (end + 2 < len && s[end] == ':' && digits(s, len, end + 1, 2, &c) == 2)
            end += 3;
        size_t e2;
        int ap = ampm(s, len, end, &e2);
        if (ap && a >= 1 && a <= 12) {
            a = (a % 12) + (ap == 2 ? 12 : 0);
            end = e2;
        }
        if (!ends_value(s, len, end))
            return 0;
        t = push(sc, K_TIME, start, end - start);
        snprintf(t->canon, sizeof(t->canon), "%02lld:%02lld", a, b);
        return end;
    }
    return 0;
}

/* Scans a word that begins with a digit (an address, a hash) from start. */
static size_t scan_digit_word(scan *sc, size_t start)
{
    size_t i = start;
    tok *t = push(sc, K_WORD, start, 0);
    t->woff = sc->wn;
    while (i < sc->len && word_byte(sc->s, sc->len, i))
        sc->w[sc->wn++] = (char)lower(sc->s[i++]);
    t->wlen = sc->wn - t->woff;
    t->slen = i - start;
    return i;
}

/* A number as scan_value reads it: its digits (no group commas), its unit. */
typedef struct numval {
    char num[32];
    size_t nn;
    bool grouped, frac;
    char unit[12];
    size_t un;
    bool ord; /* 1st, 2nd, 3rd, 4th */
} numval;

/* Reads digits, thousands groups and a fraction from s[i] into v. Returns the index after
 * them, or 0 when they are too long to be an amount (an identifier). */
static size_t read_number(const scan *sc, size_t i, numval *v)
{
    const unsigned char *s = sc->s;
    size_t len = sc->len, j = i, intdigits = 0;
    while (j < len && is_digit(s[j])) {
        if (v->nn < sizeof(v->num) - 1)
            v->num[v->nn++] = (char)s[j];
        j++;
        intdigits++;
    }
    /* 1,850 and 1,000,000: groups of exactly three after one to three digits */
    while (intdigits >= 1 && intdigits <= 3 && j + 3 < len && s[j] == ',' && is_digit(s[j + 1]) &&
           is_digit(s[j + 2]) && is_digit(s[j + 3]) && (j + 4 >= len || !is_digit(s[j + 4]))) {
        for (int d = 1; d <= 3; d++)
            if (v->nn < sizeof(v->num) - 1)
                v->num[v->nn++] = (char)s[j + d];
        j += 4;
        v->grouped = true;
    }
    if (j + 1 < len && s[j] == '.' && is_digit(s[j + 1])) {
        v->frac = true;
        if (v->nn < sizeof(v->num) - 1)
            v->num[v->nn++] = '.';
        j++;
        while (j < len && is_digit(s[j])) {
            if (v->nn < sizeof(v->num) - 1)
                v->num[v->nn++] = (char)s[j];
            j++;
        }
    }
    if (v->nn >= sizeof(v->num) - 1)
        return 0;
    v->num[v->nn] = '\0';
    return j;
}

/* Reads the unit right after the number at s[j] into v: %, or letters (and the degree sign);
 * a plural's apostrophe (1990s's, 7's) goes with it. Returns the index after it, or 0 when
 * the number is part of a word (3d4f, 0x1f). */
static size_t read_unit(const scan *sc, size_t j, numval *v)
{
    const unsigned char *s = sc->s;
    size_t len = sc->len, k = j, n, an;
    while (k < len && s[k] == ' ' && k + 1 < len && s[k + 1] == '%')
        k++;
    if (k < len && s[k] == '%') {
        v->unit[v->un++] = '%';
        v->unit[v->un] = '\0';
        return k + 1;
    }
    k = j;
    while (k < len && (is_alpha(s[k]) || (s[k] >= 0x80 && special(s, len, k, &n) == SP_DEG))) {
        size_t step = is_alpha(s[k]) ? 1 : n;
        if (v->un + step >= sizeof(v->unit) - 1)
            return 0;
        for (size_t q = 0; q < step; q++)
            v->unit[v->un++] = (char)lower(s[k + q]);
        k += step;
    }
    v->unit[v->un] = '\0';
    if (v->un > 0 && k < len && word_byte(s, len, k))
        return 0;
    if (v->un > 0 && k < len && is_apos(s, len, k, &an) && k + an < len &&
        lower(s[k + an]) == 's' && ends_value(s, len, k + an + 1))
        k += an + 1; /* 1990s's */
    v->ord = v->un == 2 && !v->frac && !v->grouped &&
             (!strcmp(v->unit, "st") || !strcmp(v->unit, "nd") || !strcmp(v->unit, "rd") ||
              !strcmp(v->unit, "th"));
    j = k;
    if (v->un == 0 && j < len) {
        if (is_apos(s, len, j, &an) && j + an < len && lower(s[j + an]) == 's' &&
            ends_value(s, len, j + an + 1))
            j += an + 1; /* 7's */
        else if (word_byte(s, len, j))
            return 0;
    }
    return j;
}

/* An hour with am/pm (8am, 8 pm) ending at *j: pushes a time token and returns true. */
static bool push_ampm(scan *sc, size_t start, size_t *j, const numval *v)
{
    size_t e2;
    int ap = 0;
    if (!((v->un == 2 && (!strcmp(v->unit, "am") || !strcmp(v->unit, "pm"))) ||
          (v->un == 0 && (ap = ampm(sc->s, sc->len, *j, &e2)) != 0)))
        return false;
    long long h = atoll(v->num);
    if (h < 1 || h > 12)
        return false;
    if (ap == 0)
        ap = v->unit[0] == 'a' ? 1 : 2;
    else
        *j = e2;
    tok *t = push(sc, K_TIME, start, *j - start);
    snprintf(t->canon, sizeof(t->canon), "%02lld:00", (h % 12) + (ap == 2 ? 12 : 0));
    return true;
}

/* Pushes the number v (s[start..j), its digits from s[i]) as a number or id token, with its
 * canonical form: no leading zeros, no trailing fractional zeros. Returns the index after
 * it. */
static size_t push_number(scan *sc, size_t start, size_t i, size_t j, numval *v, const char *cur,
                          bool neg, bool hash)
{
    const unsigned char *s = sc->s;
    size_t len = sc->len;
    char *p = v->num;
    while (p[0] == '0' && is_digit((unsigned char)p[1]))
        p++;
    if (v->frac) {
        size_t m = strlen(p);
        while (m > 0 && p[m - 1] == '0')
            p[--m] = '\0';
        if (m > 0 && p[m - 1] == '.')
            p[--m] = '\0';
    }
    bool zero = strcmp(p, "0") == 0;
    tok *t = push(sc, hash ? K_ID : K_NUM, start, j - start);
    char full[12];
    snprintf(full, sizeof(full), "%s%s", cur ? cur : "", v->ord ? "" : v->unit);
    snprintf(t->unit, sizeof(t->unit), "%s", full);
    int w = snprintf(t->canon, sizeof(t->canon), "%s%s%s%s%s", hash ? "#" : "", cur ? cur : "",
                     neg && !zero ? "-" : "", p, v->ord ? "" : v->unit);
    if (w < 0 || (size_t)w >= sizeof(t->canon)) {
        sc->n--;
        return scan_digit_word(sc, i);
    }
    t->attached = cur != NULL || (v->un > 0 && !v->ord);
    t->compound = v->un == 0 && j + 1 < len && s[j] == '-' && is_alpha(s[j + 1]);
    t->slash = start > 0 && s[start - 1] == '/' && sc->n >= 2 && sc->t[sc->n - 2].kind == K_NUM &&
               sc->t[sc->n - 2].soff + sc->t[sc->n - 2].slen == start - 1;
    t->ordinal = v->ord;
    t->isint = !v->frac && !v->grouped && (v->un == 0 || v->ord) && !cur && !neg && !hash &&
               strlen(p) <= 9;
    t->ival = t->isint ? atoll(p) : 0;
    return j;
}

/* Scans a value from s[start]: an optional sign or currency symbol of pre bytes, then a
 * number, date or time at s[i]. Returns the index after it. */
static size_t scan_value(scan *sc, size_t start, size_t i, const char *cur, bool neg, bool hash)
{
    bool plain = !cur && !neg && !hash;
    if (plain) {
        size_t end = scan_date(sc, start, i);
        if (end)
            return end;
    }
    numval v = {0};
    size_t j = read_number(sc, i, &v);
    if (j)
        j = read_unit(sc, j, &v);
    if (!j)
        return scan_digit_word(sc, i);
    if (plain && !v.frac && !v.grouped && push_ampm(sc, start, &j, &v))
        return j;
    return push_number(sc, start, i, j, &v, cur, neg, hash);
}

/* Splits the text into tokens (sc->t, sc->n). */
static void tokenize(scan *sc)
{
    const unsigned char *s = sc->s;
    size_t len = sc->len, i = 0, n;
    while (i < len) {
        unsigned char c = s[i];
        if (is_alpha(c) || (c >= 0x80 && word_byte(s, len, i))) {
            i = scan_word(sc, i);
        } else if (is_digit(c)) {
            /* a minus sign right before, at the start or after a space, makes it negative */
            bool neg = i > 0 && s[i - 1] == '-' && (i == 1 || s[i - 2] == ' ' || s[i - 2] == '(');
            i = scan_value(sc, neg ? i - 1 : i, i, NULL, neg, false);
        } else if (c == '$' && i + 1 < len && is_digit(s[i + 1])) {
            i = scan_value(sc, i, i + 1, "$", false, false);
        } else if (c == '#' && i + 1 < len && is_digit(s[i + 1])) {
            i = scan_value(sc, i, i + 1, NULL, false, true);
        } else if (c == ':' || c == '=') {
            if (sc->n > 0 && sc->t[sc->n - 1].kind != K_EQ)
                push(sc, K_EQ, i, 1);
            i++;
        } else if (c >= 0x80) {
            int sp = special(s, len, i, &n);
            if (sp == SP_CUR && i + n < len && is_digit(s[i + n])) {
                char cur[4] = {0};
                memcpy(cur, s + i, n);
                i = scan_value(sc, i, i + n, cur, false, false);
            } else if (sp == SP_MINUS && i + n < len && is_digit(s[i + n])) {
                i = scan_value(sc, i, i + n, NULL, true, false);
            } else {
                i += n;
            }
        } else {
            i++;
        }
    }
}

/* A word token's text, NUL-terminated in buf (short words only: longer ones are in no
 * list); "" otherwise. */
static const char *word_of(const scan *sc, const tok *t, char *buf, size_t buflen)
{
    if (!t || t->kind != K_WORD || t->wlen >= buflen) {
        buf[0] = '\0';
        return buf;
    }
    memcpy(buf, sc->w + t->woff, t->wlen);
    buf[t->wlen] = '\0';
    return buf;
}

static bool is_value(const tok *t)
{
    return t && (t->kind == K_NUM || t->kind == K_DATE || t->kind == K_TIME || t->kind == K_ID);
}

/* Joins month names with their day and year into dates ("March 5", "5th of March" is left
 * alone, "5 March 2024", "March 2024"); weekday names become dates; whole numbers from 1900
 * to 2099 without a unit word after them become years. Then drops the filler words. */
static void join_dates(scan *sc)
{
    size_t out = 0;
    char b0[24], b1[24];
    for (size_t i = 0; i < sc->n; i++) {
        tok *t = &sc->t[i];
        tok *nx = i + 1 < sc->n ? &sc->t[i + 1] : NULL;
        tok *nx2 = i + 2 < sc->n ? &sc->t[i + 2] : NULL;
        int m = wordlist_find(word_of(sc, t, b0, sizeof(b0)), WORDLIST(months));
        bool day_next = nx && nx->kind == K_NUM && nx->isint && nx->ival >= 1 && nx->ival <= 31;
        bool year_next = nx && nx->kind == K_NUM && nx->isint && !nx->ordinal && nx->ival >= 1000 &&
                         nx->ival <= 2999;
        /* "may" is a month only before a day or a year written as digits */
        if (m >= 0 && (day_next || year_next)) {
            tok d = *t;
            d.kind = K_DATE;
            d.cap = false;
            if (day_next && nx2 && nx2->kind == K_NUM && nx2->isint && !nx2->ordinal &&
                nx2->ival >= 1000 && nx2->ival <= 2999) {
                snprintf(d.canon, sizeof(d.canon), "%04lld-%02d-%02lld", nx2->ival, month_no[m],
                         nx->ival);
                d.slen = nx2->soff + nx2->slen - t->soff;
                i += 2;
            } else if (day_next) {
                snprintf(d.canon, sizeof(d.canon), "%02d-%02lld", month_no[m], nx->ival);
                d.slen = nx->soff + nx->slen - t->soff;
                i += 1;
            } else {
                snprintf(d.canon, sizeof(d.canon), "%04lld-%02d", nx->ival, month_no[m]);
                d.slen = nx->soff + nx->slen - t->soff;
                i += 1;
            }
            sc->t[out++] = d;
            continue;
        }
        /* 5 March [2024], 5th March */
        if (t->kind == K_NUM && t->isint && t->ival >= 1 && t->ival <= 31 && nx &&
            (m = wordlist_find(word_of(sc, nx, b1, sizeof(b1)), WORDLIST(months))) >= 0 &&
            strcmp(b1, "may") != 0) {
            tok d = *t;
            d.kind = K_DATE;
            d.isint = false;
            if (nx2 && nx2->kind == K_NUM && nx2->isint && !nx2->ordinal && nx2->ival >= 1000 &&
                nx2->ival <= 2999) {
                snprintf(d.canon, sizeof(d.canon), "%04lld-%02d-%02lld", nx2->ival, month_no[m],
                         t->ival);
                d.slen = nx2->soff + nx2->slen - t->soff;
                i += 2;
            } else {
                snprintf(d.canon, sizeof(d.canon), "%02d-%02lld", month_no[m], t->ival);
                d.slen = nx->soff + nx->slen - t->soff;
                i += 1;
            }
            sc->t[out++] = d;
            continue;
        }
        if (wordlist_find(word_of(sc, t, b0, sizeof(b0)), WORDLIST(weekdays)) >= 0) {
            tok d = *t;
            d.kind = K_DATE;
            snprintf(d.canon, sizeof(d.canon), "%s", b0);
            sc->t[out++] = d;
            continue;
        }
        /* a unit word joins its number: "120 GB" is "120GB", "5 percent" is "5%" */
        if (t->kind == K_NUM && !t->attached && !t->ordinal && !t->compound &&
            wordlist_find(word_of(sc, nx, b1, sizeof(b1)), WORDLIST(unit_words)) >= 0) {
            tok d = *t;
            const char *u = !strcmp(b1, "percent") || !strcmp(b1, "pct") ? "%" : b1;
            size_t cl = strlen(d.canon);
            if (cl + strlen(u) < sizeof(d.canon) && strlen(u) < sizeof(d.unit)) {
                snprintf(d.canon + cl, sizeof(d.canon) - cl, "%s", u);
                memcpy(d.unit, u, strlen(u) + 1);
                d.attached = true;
                d.isint = false;
                d.slen = nx->soff + nx->slen - t->soff;
                sc->t[out++] = d;
                i++;
                continue;
            }
        }
        if (t->kind == K_NUM && t->isint && !t->ordinal && t->ival >= 1900 && t->ival <= 2099 &&
            t->slen == 4)
            t->kind = K_DATE; /* a year */
        sc->t[out++] = *t;
    }
    sc->n = out;
    /* the fillers: a (lower case, or first in the text), an, the, now, currently, still */
    out = 0;
    for (size_t i = 0; i < sc->n; i++) {
        tok *t = &sc->t[i];
        const char *w = word_of(sc, t, b0, sizeof(b0));
        if (wordlist_find(w, WORDLIST(fillers)) >= 0 || (!strcmp(w, "a") && (!t->cap || t->first)))
            continue;
        sc->t[out++] = *t;
    }
    sc->n = out;
}

/* A word that tells of an event in the past: a past tense of past_events[], or a word in
 * -ed that no copula or has/have/had makes a state ("was audited", "has earned"). */
static bool is_event(const char *w, const char *prev)
{
    size_t n = strlen(w);
    if (wordlist_find(w, WORDLIST(past_events)) >= 0)
        return true;
    if (n < 4 || strcmp(w + n - 2, "ed") != 0 || w[n - 3] == 'e' || !strcmp(w, "hundred"))
        return false;
    return wordlist_find(prev, WORDLIST(copulas)) < 0 && strcmp(prev, "has") != 0 &&
           strcmp(prev, "have") != 0 && strcmp(prev, "had") != 0;
}

/* Classifies every value as a quantity or an identifier (see textrule.h). */
static void classify(scan *sc)
{
    char b[24], b2[24];
    bool event = false; /* a verb of a past event came before (and no copula since) */
    for (size_t i = 0; i < sc->n; i++) {
        tok *t = &sc->t[i];
        const tok *pv = i > 0 ? &sc->t[i - 1] : NULL;
        const tok *pv2 = i > 1 ? &sc->t[i - 2] : NULL;
        const char *prev = word_of(sc, pv, b, sizeof(b));
        if (t->kind == K_WORD) {
            /* a copula after the verb of an event starts a statement of a state again ("the
             * user's preferred length is 30 minutes") */
            char w[24];
            const char *word = word_of(sc, t, w, sizeof(w));
            if (wordlist_find(word, WORDLIST(copulas)) >= 0)
                event = false;
            else
                event = event || is_event(word, prev);
            continue;
        }
        if (!is_value(t))
            continue;
        if (t->kind == K_ID) {
            t->quantity = false;
        } else if (t->kind == K_NUM) {
            if (wordlist_find(prev, WORDLIST(id_words)) >= 0 || t->compound || event)
                t->quantity = false;
            else if (t->slash && pv && pv->kind == K_NUM)
                t->quantity = pv->quantity;
            else
                t->quantity = (pv && pv->kind == K_EQ) ||
                              wordlist_find(prev, WORDLIST(copulas)) >= 0 ||
                              wordlist_find(prev, WORDLIST(num_intro)) >= 0 ||
                              wordlist_find(prev, WORDLIST(currencies)) >= 0;
        } else {
            /* dates and times */
            const char *prev2 = word_of(sc, pv2, b2, sizeof(b2));
            bool states = pv && (pv->kind == K_EQ || wordlist_find(prev, WORDLIST(copulas)) >= 0 ||
                                 wordlist_find(prev, WORDLIST(date_verbs)) >= 0);
            bool via = pv && wordlist_find(prev, WORDLIST(date_preps)) >= 0 && pv2 &&
                       (pv2->kind == K_EQ || wordlist_find(prev2, WORDLIST(copulas)) >= 0 ||
                        wordlist_find(prev2, WORDLIST(date_verbs)) >= 0);
            /* "on March 5 at 10:00", "March 5 10:00": as the date before it */
            const tok *chain = pv && (pv->kind == K_DATE || pv->kind == K_TIME) ? pv
                               : pv && pv2 && wordlist_find(prev, WORDLIST(date_preps)) >= 0 &&
                                       (pv2->kind == K_DATE || pv2->kind == K_TIME)
                                   ? pv2
                                   : NULL;
            t->quantity = states || via || (chain && chain->quantity);
        }
    }
}

/* ---- signatures ------------------------------------------------------------------------- */

static void feed(xxh64_state *h, int k, const void *p, size_t n)
{
    for (int j = 0; j < k; j++)
        xxh64_update(&h[j], p, n);
}

/* The display of a value as written: control bytes as spaces, at most 24 bytes, never
 * cutting a UTF-8 sequence. */
static size_t shown(const scan *sc, const tok *t, char *out, size_t cap)
{
    size_t n = t->slen < cap ? t->slen : cap;
    if (n < t->slen)
        while (n > 0 && (sc->s[t->soff + n] & 0xC0) == 0x80)
            n--;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = sc->s[t->soff + i];
        out[i] = (char)(c < 0x20 || c == 0x7f ? ' ' : c);
    }
    return n;
}

/* Runs the tokenizer over text into sc (its arrays allocated here; the caller frees sc->t
 * and sc->w). Returns 0 or -ENOMEM. */
static int analyze(const char *text, size_t len, scan *sc)
{
    memset(sc, 0, sizeof(*sc));
    sc->s = (const unsigned char *)text;
    sc->len = len;
    sc->t = malloc((len + 1) * sizeof(tok));
    sc->w = malloc(2 * len + 16); /* contractions grow by up to 3 bytes a word of 4 */
    if (!sc->t || !sc->w) {
        free(sc->t);
        free(sc->w);
        return -ENOMEM;
    }
    tokenize(sc);
    join_dates(sc);
    classify(sc);
    return 0;
}

static const uint64_t seeds[5] = {0x7465787472756c65ULL, 0x9e3779b97f4a7c15ULL,
                                  0x5375626a65637431ULL, 0xc2b2ae3d27d4eb4fULL,
                                  0x5175616e74697479ULL};

int textrule_sign(const char *text, size_t len, textrule_sig *out)
{
    scan sc;
    if (analyze(text, len, &sc) < 0)
        return -ENOMEM;
    memset(out, 0, sizeof(*out));
    xxh64_state ht[2], hs[2], hq;
    for (int j = 0; j < 2; j++) {
        xxh64_init(&ht[j], seeds[j]);
        xxh64_init(&hs[j], seeds[2 + j]);
    }
    xxh64_init(&hq, seeds[4]);
    size_t vn = 0;
    bool vfull = false;
    for (size_t i = 0; i < sc.n; i++) {
        const tok *t = &sc.t[i];
        if (t->kind == K_EQ)
            continue;
        if (t->kind == K_WORD) {
            feed(ht, 2, "w", 1);
            feed(ht, 2, sc.w + t->woff, t->wlen);
            feed(ht, 2, "", 1);
            feed(hs, 2, "w", 1);
            feed(hs, 2, sc.w + t->woff, t->wlen);
            feed(hs, 2, "", 1);
            continue;
        }
        unsigned char tag[2] = {'v', t->kind};
        size_t cl = strlen(t->canon);
        feed(ht, 2, tag, 2);
        feed(ht, 2, t->canon, cl + 1);
        if (!t->quantity) {
            feed(hs, 2, tag, 2);
            feed(hs, 2, t->canon, cl + 1);
            continue;
        }
        tag[0] = 'q';
        feed(hs, 2, tag, 2);
        feed(hs, 2, t->unit, strlen(t->unit) + 1);
        feed(&hq, 1, tag, 2);
        feed(&hq, 1, t->canon, cl + 1);
        if (out->nquant < TEXTRULE_SLOTS) {
            out->qhash[out->nquant] = (uint32_t)xxh64(t->canon, cl, t->kind);
            char disp[25];
            size_t dn = shown(&sc, t, disp, 24);
            if (!vfull && vn + dn + 2 <= TEXTRULE_VALS) {
                if (out->nquant > 0)
                    out->vals[vn++] = '\x1f';
                memcpy(out->vals + vn, disp, dn);
                vn += dn;
                out->vals[vn] = '\0';
            } else {
                vfull = true; /* the later ones are not shown: the k-th stays the k-th */
            }
        }
        if (out->nquant < UINT16_MAX)
            out->nquant++;
    }
    for (int j = 0; j < 2; j++) {
        out->text[j] = xxh64_digest(&ht[j]);
        out->subject[j] = xxh64_digest(&hs[j]);
    }
    out->quant = xxh64_digest(&hq);
    free(sc.t);
    free(sc.w);
    return 0;
}

bool textrule_same(const textrule_sig *a, const textrule_sig *b)
{
    return a->text[0] == b->text[0] && a->text[1] == b->text[1];
}

bool textrule_values(const textrule_sig *older, const textrule_sig *newer)
{
    return older->nquant > 0 && older->nquant == newer->nquant &&
           older->subject[0] == newer->subject[0] && older->subject[1] == newer->subject[1] &&
           older->quant != newer->quant;
}

/* The k-th value shown in sig->vals (n bytes at *p), or false past what it kept. */
static bool nth_val(const textrule_sig *sig, size_t k, const char **p, size_t *n)
{
    const char *v = sig->vals;
    if (!v[0] && sig->nquant > 0)
        return false;
    for (size_t i = 0; i < k; i++) {
        v = strchr(v, '\x1f');
        if (!v)
            return false;
        v++;
    }
    const char *e = strchr(v, '\x1f');
    *p = v;
    *n = e ? (size_t)(e - v) : strlen(v);
    return true;
}

void textrule_explain(const textrule_sig *older, const textrule_sig *newer, char *out,
                      size_t outlen)
{
    size_t at = 0, shown_n = 0;
    out[0] = '\0';
    size_t slots = older->nquant < TEXTRULE_SLOTS ? older->nquant : TEXTRULE_SLOTS;
    for (size_t k = 0; k < slots && at + 1 < outlen; k++) {
        if (older->qhash[k] == newer->qhash[k])
            continue;
        const char *a, *b;
        size_t an, bn;
        int w;
        if (nth_val(older, k, &a, &an) && nth_val(newer, k, &b, &bn))
            w = snprintf(out + at, outlen - at, "%s%.*s -> %.*s", shown_n ? ", " : "", (int)an, a,
                         (int)bn, b);
        else
            w = snprintf(out + at, outlen - at, "%svalue %zu", shown_n ? ", " : "", k + 1);
        if (w < 0)
            break;
        at += (size_t)w < outlen - at ? (size_t)w : outlen - at - 1;
        shown_n++;
    }
    if (shown_n == 0)
        snprintf(out, outlen, "values after the %dth", TEXTRULE_SLOTS);
}

int textrule_compare(const char *older, size_t olen, const char *newer, size_t nlen, char *why,
                     size_t whylen)
{
    textrule_sig a, b;
    if (textrule_sign(older, olen, &a) < 0 || textrule_sign(newer, nlen, &b) < 0)
        return -ENOMEM;
    if (why && whylen)
        why[0] = '\0';
    if (textrule_same(&a, &b))
        return TEXTRULE_SAME;
    if (textrule_values(&a, &b)) {
        if (why && whylen)
            textrule_explain(&a, &b, why, whylen);
        return TEXTRULE_VALUES;
    }
    return TEXTRULE_OTHER;
}

int textrule_render(const char *text, size_t len, char *out, size_t outlen)
{
    scan sc;
    if (analyze(text, len, &sc) < 0)
        return -ENOMEM;
    static const char *const kinds[] = {"word", "num", "date", "time", "id", "="};
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sc.n && at + 1 < outlen; i++) {
        const tok *t = &sc.t[i];
        int w;
        const char *sep = at ? " " : "";
        if (t->kind == K_EQ)
            w = snprintf(out + at, outlen - at, "%s=", sep);
        else if (t->kind == K_WORD)
            w = snprintf(out + at, outlen - at, "%s%.*s", sep, (int)t->wlen, sc.w + t->woff);
        else if (t->quantity)
            w = snprintf(out + at, outlen - at, "%s<%s%s%s>", sep, kinds[t->kind],
                         t->unit[0] ? ":" : "", t->unit);
        else
            w = snprintf(out + at, outlen - at, "%s[%s]", sep, t->canon);
        if (w < 0)
            break;
        at += (size_t)w < outlen - at ? (size_t)w : outlen - at - 1;
    }
    free(sc.t);
    free(sc.w);
    return 0;
}

int textrule_tokens(const char *text, size_t len, int (*fn)(void *arg, const textrule_token *t),
                    void *arg)
{
    scan sc;
    if (analyze(text, len, &sc) < 0)
        return -ENOMEM;
    static const int kinds[] = {[K_WORD] = TEXTRULE_TOK_WORD,
                                [K_NUM] = TEXTRULE_TOK_NUM,
                                [K_DATE] = TEXTRULE_TOK_DATE,
                                [K_TIME] = TEXTRULE_TOK_TIME,
                                [K_ID] = TEXTRULE_TOK_ID};
    int rc = 0;
    for (size_t i = 0; i < sc.n && rc == 0; i++) {
        const tok *t = &sc.t[i];
        if (t->kind == K_EQ)
            continue;
        textrule_token x = {.kind = kinds[t->kind],
                            .quantity = t->quantity,
                            .off = t->soff,
                            .srclen = t->slen,
                            .unit = t->kind == K_WORD ? "" : t->unit};
        if (t->kind == K_WORD) {
            x.text = sc.w + t->woff;
            x.len = t->wlen;
        } else {
            x.text = t->canon;
            x.len = strlen(t->canon);
        }
        rc = fn(arg, &x);
    }
    free(sc.t);
    free(sc.w);
    return rc;
}
