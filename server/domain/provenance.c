/* server/domain/provenance.c: a response's sentences and the word overlap of memory.provenance
 * (see provenance.h).
 *
 * Terms are hashed (XXH64) as they are read; a response keeps one hash map from feature
 * (a term, a pair of consecutive terms, a number's place: the word before it and its unit)
 * to the byte offset of its first occurrence, and a memory is scored by looking its own
 * features up in it.
 */
#include "provenance.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idmap.h"
#include "textrule.h"
#include "wordlist.h"
#include "xxh64.h"

/* ---- sentences -------------------------------------------------------------------------- */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

size_t prov_sentences(const char *s, size_t n, const char **sent, size_t *len, size_t max)
{
    size_t count = 0, start = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t end = 0; /* one past the sentence's last byte, 0: no break here */
        size_t next = i + 1;
        if (i == n) {
            end = n;
        } else if (s[i] == '\n') {
            end = i;
        } else if ((s[i] == '.' || s[i] == '!' || s[i] == '?') &&
                   (i + 1 == n || is_space(s[i + 1]))) {
            end = i + 1;
        } else if (i + 2 < n && (unsigned char)s[i] == 0xE3 && (unsigned char)s[i + 1] == 0x80 &&
                   (unsigned char)s[i + 2] == 0x82) {
            end = next = i + 3;
        } else if (i + 2 < n && (unsigned char)s[i] == 0xEF && (unsigned char)s[i + 1] == 0xBC &&
                   ((unsigned char)s[i + 2] == 0x81 || (unsigned char)s[i + 2] == 0x9F)) {
            end = next = i + 3;
        } else {
            continue;
        }
        size_t a = start, b = end;
        while (a < b && is_space(s[a]))
            a++;
        while (b > a && is_space(s[b - 1]))
            b--;
        if (b > a) {
            if (count < max) {
                sent[count] = s + a;
                len[count] = b - a;
            }
            count++;
        }
        start = next;
        i = next - 1;
    }
    return count;
}

/* ---- word lists (sorted: searched by bisection; prov_selfcheck checks them) ------------- */

/* English function words and pronouns, as textrule spells them (apostrophes dropped); "no",
 * "not" and "never" are not among them: they change what a sentence says. */
static const char *const stop_words[] = {
    "a",       "about",   "above",      "after",    "again",      "against", "all",       "also",
    "am",      "an",      "and",        "any",      "are",        "as",      "at",        "be",
    "because", "been",    "before",     "being",    "below",      "between", "both",      "but",
    "by",      "can",     "could",      "did",      "do",         "does",    "doing",     "down",
    "during",  "each",    "either",     "else",     "ever",       "every",   "few",       "for",
    "from",    "further", "had",        "has",      "have",       "having",  "he",        "her",
    "here",    "hers",    "herself",    "hes",      "him",        "himself", "his",       "how",
    "i",       "if",      "im",         "in",       "into",       "is",      "it",        "its",
    "itself",  "ive",     "just",       "lets",     "me",         "might",   "more",      "most",
    "must",    "my",      "myself",     "neither",  "of",         "off",     "on",        "once",
    "only",    "or",      "other",      "ought",    "our",        "ours",    "ourselves", "out",
    "over",    "own",     "per",        "same",     "shall",      "she",     "shes",      "should",
    "so",      "some",    "such",       "than",     "that",       "thats",   "the",       "their",
    "theirs",  "them",    "themselves", "then",     "there",      "theres",  "these",     "they",
    "theyre",  "theyve",  "this",       "those",    "through",    "thus",    "to",        "too",
    "under",   "until",   "up",         "upon",     "us",         "user",    "users",     "very",
    "via",     "was",     "we",         "were",     "weve",       "what",    "whats",     "when",
    "where",   "whereas", "which",      "while",    "who",        "whom",    "whose",     "why",
    "will",    "with",    "within",     "would",    "yet",        "you",     "youd",      "youll",
    "your",    "youre",   "yours",      "yourself", "yourselves", "youve"};

/* words (after the suffix strip) that name a unit another way: synonyms[i] -> canon[i] */
static const char *const synonyms[] = {"dollar", "euro", "pct", "percent", "usdollar", "yen"};
static const char *const synonym_canon[] = {"usd", "eur", "%", "%", "usd", "jpy"};

/* unit suffixes that multiply a number; the ones marked need a currency ("$48m", not "5m") */
static const struct {
    const char *s;
    double mult;
    bool needs_currency;
} multipliers[] = {{"b", 1e9, true},         {"billion", 1e9, false}, {"bn", 1e9, false},
                   {"k", 1e3, false},        {"m", 1e6, true},        {"million", 1e6, false},
                   {"mln", 1e6, false},      {"mn", 1e6, false},      {"thousand", 1e3, false},
                   {"trillion", 1e12, false}};

int prov_selfcheck(void)
{
    const struct {
        const char *const *l;
        size_t n;
    } lists[] = {{WORDLIST(stop_words)}, {WORDLIST(synonyms)}};
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++)
        if (!wordlist_sorted(lists[k].l, lists[k].n))
            return (int)k + 1;
    if (sizeof(synonyms) / sizeof(synonyms[0]) != sizeof(synonym_canon) / sizeof(synonym_canon[0]))
        return 2;
    for (size_t i = 1; i < sizeof(multipliers) / sizeof(multipliers[0]); i++)
        if (strcmp(multipliers[i - 1].s, multipliers[i].s) >= 0)
            return 3;
    return 0;
}

/* ---- terms ------------------------------------------------------------------------------ */

enum { T_WORD, T_NUM, T_UNIT };

typedef struct term {
    uint64_t h;
    size_t off; /* the source token's offset */
    unsigned char kind;
} term;

/* A number token as terms: its value, its currency code and its unit. */
typedef struct numterm {
    bool set;
    char num[48];
    char cur[8];
    char unit[32];
    size_t off;
} numterm;

/* A text's terms as they are read. keep_text: their text too (prov_terms), in txt. */
typedef struct terms {
    term *v;
    size_t n, cap;
    char *buf; /* scratch for one token */
    size_t bufcap;
    bool keep_text;
    char *txt;
    size_t tn, tcap;
    numterm pend; /* a number read, not yet added: a multiplier word may follow */
} terms;

static const uint64_t SEED_TERM = 0x70726f7661746572ULL;
static const uint64_t SEED_UNI = 0x756e696772616d31ULL;
static const uint64_t SEED_BI = 0x62696772616d3232ULL;
static const uint64_t SEED_SLOT = 0x736c6f746e756d33ULL;

static int add_term(terms *ts, const char *s, size_t n, unsigned char kind, size_t off)
{
    if (n == 0)
        return 0;
    if (ts->n == ts->cap) {
        size_t cap = ts->cap ? 2 * ts->cap : 64;
        term *v = realloc(ts->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        ts->v = v;
        ts->cap = cap;
    }
    if (ts->keep_text) {
        if (ts->tn + n + 2 > ts->tcap) {
            size_t cap = 2 * (ts->tn + n + 2);
            char *t = realloc(ts->txt, cap);
            if (!t)
                return -ENOMEM;
            ts->txt = t;
            ts->tcap = cap;
        }
        if (ts->tn)
            ts->txt[ts->tn++] = ' ';
        memcpy(ts->txt + ts->tn, s, n);
        ts->tn += n;
        ts->txt[ts->tn] = '\0';
    }
    ts->v[ts->n++] = (term){.h = xxh64(s, n, SEED_TERM), .off = off, .kind = kind};
    return 0;
}

/* Strips an English inflection from the ASCII word w (NUL-terminated, changed in place):
 * -ies to -y, -sses to -ss, a plural or third-person -s, then -ing or -ed, a doubled final
 * consonant, a final -e. Crude on purpose: both sides of a comparison go through it, so
 * what matters is that forms of one word meet ("prefers", "preferred": prefer; "move",
 * "moved", "moving": mov), not that the stem is a word. */
static void stem(char *w)
{
    size_t n = strlen(w);
    if (n <= 3)
        return;
    if (n > 4 && !strcmp(w + n - 3, "ies")) {
        strcpy(w + n - 3, "y");
        n -= 2;
    } else if (!strcmp(w + n - 4, "sses")) {
        n -= 2;
    } else if (w[n - 1] == 's' && w[n - 2] != 's' && w[n - 2] != 'u' && w[n - 2] != 'i') {
        n -= 1;
    }
    w[n] = '\0';
    bool cut = false;
    if (n >= 6 && !strcmp(w + n - 3, "ing")) {
        n -= 3;
        cut = true;
    } else if (n >= 5 && !strcmp(w + n - 2, "ed")) {
        n -= 2;
        cut = true;
    }
    w[n] = '\0';
    if (cut && n >= 3 && w[n - 1] == w[n - 2] && w[n - 1] != 'l' && w[n - 1] != 's' &&
        w[n - 1] != 'z' && !strchr("aeiou", w[n - 1]))
        w[--n] = '\0';
    if (n >= 4 && w[n - 1] == 'e')
        w[--n] = '\0';
}

/* Adds the ASCII word w (n bytes, lower-case): a stop word adds nothing; others are
 * stemmed and mapped through the synonyms. kind: T_WORD, or T_UNIT for a value's unit. */
static int add_ascii_word(terms *ts, const char *w, size_t n, size_t off, unsigned char kind)
{
    char b[64];
    if (n >= sizeof(b))
        return add_term(ts, w, n, kind, off); /* no English word is this long */
    memcpy(b, w, n);
    b[n] = '\0';
    if (kind == T_WORD && wordlist_find(b, WORDLIST(stop_words)) >= 0)
        return 0;
    stem(b);
    int syn = wordlist_find(b, WORDLIST(synonyms));
    const char *s = syn >= 0 ? synonym_canon[syn] : b;
    return add_term(ts, s, strlen(s), kind, off);
}

/* Decodes the UTF-8 sequence at s[i] (n bytes in all): the code point, its length in *k (1
 * for an invalid byte, whose value is then returned as is with *k = 1). */
static uint32_t decode(const unsigned char *s, size_t n, size_t i, size_t *k)
{
    unsigned char c = s[i];
    size_t len = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
    if (c < 0x80 || len == 1 || i + len > n) {
        *k = 1;
        return c;
    }
    uint32_t cp = c & (0x7F >> len);
    for (size_t j = 1; j < len; j++) {
        if ((s[i + j] & 0xC0) != 0x80) {
            *k = 1;
            return c;
        }
        cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    *k = len;
    return cp;
}

/* The lower case of cp where Unicode pairs it one to one within two-byte UTF-8 (the length
 * stays): Latin-1, Latin Extended-A, Greek, Cyrillic; cp otherwise. */
static uint32_t lower_cp(uint32_t cp)
{
    if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) || (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) ||
        (cp >= 0x410 && cp <= 0x42F))
        return cp + 0x20;
    if (cp >= 0x400 && cp <= 0x40F)
        return cp + 0x50;
    if (((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) && cp % 2 == 0)
        return cp + 1;
    if (((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) && cp % 2 == 1)
        return cp + 1;
    return cp;
}

/* A character written without spaces between words: CJK ideographs, kana, hangul. */
static bool is_cjk(uint32_t cp)
{
    return (cp >= 0x2E80 && cp <= 0x2FDF) || (cp >= 0x3040 && cp <= 0x31FF) ||
           (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) ||
           (cp >= 0xAC00 && cp <= 0xD7AF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
           (cp >= 0x20000 && cp <= 0x2FFFF);
}

/* Punctuation inside a token that separates words: general punctuation, CJK symbols and
 * punctuation, full-width punctuation. */
static bool is_sep(uint32_t cp)
{
    return (cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F) ||
           (cp >= 0xFF01 && cp <= 0xFF0F) || (cp >= 0xFF1A && cp <= 0xFF20) ||
           (cp >= 0xFF3B && cp <= 0xFF40) || (cp >= 0xFF5B && cp <= 0xFF65);
}

static void encode2(unsigned char *p, uint32_t cp)
{
    p[0] = (unsigned char)(0xC0 | (cp >> 6));
    p[1] = (unsigned char)(0x80 | (cp & 0x3F));
}

/* Adds the run w[a, b) of a word (lower-cased already): ASCII words through
 * add_ascii_word, others as they are. */
static int add_run(terms *ts, const char *w, size_t a, size_t b, size_t off)
{
    if (b <= a)
        return 0;
    for (size_t i = a; i < b; i++)
        if ((unsigned char)w[i] >= 0x80)
            return add_term(ts, w + a, b - a, T_WORD, off);
    return add_ascii_word(ts, w + a, b - a, off, T_WORD);
}

/* Adds a word token (text, n bytes; ASCII already lower-cased; srclen bytes of the source
 * at off): non-ASCII letters lower-cased, split at separators, each CJK character a term of
 * its own. A part's offset is off plus its place in the word, which is its place in the
 * source unless an apostrophe or a contraction came before it in the word (near enough:
 * it only says which sentence a quote starts in). */
static int add_word(terms *ts, const char *text, size_t n, size_t off, size_t srclen)
{
    if (n > ts->bufcap) {
        char *b = realloc(ts->buf, n);
        if (!b)
            return -ENOMEM;
        ts->buf = b;
        ts->bufcap = n;
    }
    unsigned char *w = (unsigned char *)ts->buf;
    memcpy(w, text, n);
    size_t run = 0, i = 0, k;
    int rc = 0;
    while (i < n && rc == 0) {
        if (w[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp = decode(w, n, i, &k);
        if (k == 2) {
            uint32_t lc = lower_cp(cp);
            if (lc != cp)
                encode2(w + i, lc);
        }
        if (k > 1 && (is_cjk(cp) || is_sep(cp))) {
            rc = add_run(ts, (char *)w, run, i, off + (run < srclen ? run : srclen - 1));
            if (rc == 0 && is_cjk(cp))
                rc = add_term(ts, (char *)w + i, k, T_WORD, off + (i < srclen ? i : srclen - 1));
            run = i + k;
        }
        i += k;
    }
    return rc ? rc : add_run(ts, (char *)w, run, n, off + (run < srclen ? run : srclen - 1));
}

/* The code a currency symbol stands for, or NULL. */
static const char *currency_code(const char *c, size_t n)
{
    if (n == 1 && c[0] == '$')
        return "usd";
    if (n == 3 && !memcmp(c, "\xe2\x82\xac", 3))
        return "eur";
    if (n == 2 && !memcmp(c, "\xc2\xa3", 2))
        return "gbp";
    if (n == 2 && !memcmp(c, "\xc2\xa5", 2))
        return "jpy";
    return NULL;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Multiplies the pending number by the multiplier named w (NUL-terminated): "k", "million",
 * ...; those that need a currency only with one. Returns false when w is none (or the
 * product is out of range). */
static bool multiply(numterm *p, const char *w)
{
    for (size_t m = 0; m < sizeof(multipliers) / sizeof(multipliers[0]); m++) {
        if (strcmp(w, multipliers[m].s) != 0)
            continue;
        if (multipliers[m].needs_currency && !p->cur[0])
            return false;
        double v = strtod(p->num, NULL) * multipliers[m].mult;
        if (!(v < 1e18 && v > -1e18))
            return false;
        snprintf(p->num, sizeof(p->num), "%.12g", v);
        return true;
    }
    return false;
}

/* Reads a number token (canonical "[#][currency][-]digits[.digits][unit]") into ts's
 * pending number: its value (multiplied out by a multiplier unit: "10k"), its currency and
 * its unit. It becomes terms when the next token is read (which may be a multiplier word:
 * "$1.2 million"), or at the end. */
static void read_number(terms *ts, const textrule_token *t)
{
    numterm *p = &ts->pend;
    const char *c = t->text;
    size_t n = t->len, i = 0;
    memset(p, 0, sizeof(*p));
    p->set = true;
    p->off = t->off;
    if (i < n && c[i] == '#')
        i++;
    size_t cs = i;
    while (i < n && !is_digit(c[i]) && c[i] != '-')
        i++;
    size_t ce = i, ns = i;
    if (i < n && c[i] == '-')
        i++;
    while (i < n && (is_digit(c[i]) || c[i] == '.'))
        i++;
    size_t ne = i;
    const char *code = ce > cs ? currency_code(c + cs, ce - cs) : NULL;
    if (code)
        snprintf(p->cur, sizeof(p->cur), "%s", code);
    else if (ce > cs && ce - cs < sizeof(p->cur))
        memcpy(p->cur, c + cs, ce - cs);
    size_t nn = ne - ns < sizeof(p->num) ? ne - ns : sizeof(p->num) - 1;
    memcpy(p->num, c + ns, nn);
    size_t un = n - ne < sizeof(p->unit) ? n - ne : sizeof(p->unit) - 1;
    memcpy(p->unit, c + ne, un);
    if (un > 0 && multiply(p, p->unit))
        p->unit[0] = '\0';
}

/* Adds the pending number's terms, if any. */
static int flush_number(terms *ts)
{
    numterm *p = &ts->pend;
    if (!p->set)
        return 0;
    p->set = false;
    int rc = add_term(ts, p->num, strlen(p->num), T_NUM, p->off);
    if (rc == 0 && p->cur[0])
        rc = add_term(ts, p->cur, strlen(p->cur), T_UNIT, p->off);
    size_t un = strlen(p->unit);
    if (rc == 0 && un > 0) {
        bool ascii = true;
        for (size_t k = 0; k < un; k++)
            ascii &= (unsigned char)p->unit[k] < 0x80;
        rc = ascii ? add_ascii_word(ts, p->unit, un, p->off, T_UNIT)
                   : add_term(ts, p->unit, un, T_UNIT, p->off);
    }
    return rc;
}

static int on_token(void *arg, const textrule_token *t)
{
    terms *ts = arg;
    if (ts->pend.set && t->kind == TEXTRULE_TOK_WORD && !ts->pend.unit[0] && t->len < 16) {
        char w[16];
        memcpy(w, t->text, t->len);
        w[t->len] = '\0';
        if (multiply(&ts->pend, w))
            return 0; /* "$1.2 million": the word was the number's */
    }
    int rc = flush_number(ts);
    if (rc < 0)
        return rc;
    switch (t->kind) {
    case TEXTRULE_TOK_WORD:
        return add_word(ts, t->text, t->len, t->off, t->srclen ? t->srclen : 1);
    case TEXTRULE_TOK_NUM:
    case TEXTRULE_TOK_ID:
        read_number(ts, t);
        return 0;
    default: /* dates and times, by their canonical form */
        return add_term(ts, t->text, t->len, T_NUM, t->off);
    }
}

static void terms_fini(terms *ts)
{
    free(ts->v);
    free(ts->buf);
    free(ts->txt);
    memset(ts, 0, sizeof(*ts));
}

/* Reads text into ts (zeroed by the caller but for keep_text). Returns 0 or -ENOMEM (ts is
 * then finished). */
static int read_terms(const char *text, size_t len, terms *ts)
{
    int rc = textrule_tokens(text, len, on_token, ts);
    if (rc == 0)
        rc = flush_number(ts);
    if (rc < 0)
        terms_fini(ts);
    return rc < 0 ? -ENOMEM : 0;
}

/* ---- features --------------------------------------------------------------------------- */

/* A feature's key in the maps (never idmap's reserved UINT64_MAX). */
static uint64_t key(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t ab[2] = {a, b};
    uint64_t k = xxh64(ab, sizeof(ab), seed);
    return k == UINT64_MAX ? k - 1 : k;
}

/* The place of number v[j]: the term before it and its unit (0 for none); false when there
 * is no term before or it is a unit (in a list, "0.05%, 0.30% and 1%", the place of a number
 * is another number's unit: no place). */
static bool slot_of(const term *v, size_t n, size_t j, uint64_t *k)
{
    if (j == 0 || v[j].kind != T_NUM || v[j - 1].kind == T_UNIT)
        return false;
    uint64_t unit = j + 1 < n && v[j + 1].kind == T_UNIT ? v[j + 1].h : 0;
    *k = key(SEED_SLOT, v[j - 1].h, unit);
    return true;
}

struct prov_text {
    idmap *feat; /* feature key -> byte offset of its first occurrence */
    size_t nterms;
};

static int put_first(idmap *m, uint64_t k, size_t off)
{
    return idmap_get(m, k, NULL) ? 0 : idmap_put(m, k, off);
}

int prov_text_create(const char *text, size_t len, prov_text **out)
{
    terms ts = {0};
    prov_text *t = calloc(1, sizeof(*t));
    if (!t || read_terms(text, len, &ts) < 0)
        goto fail;
    t->nterms = ts.n;
    t->feat = idmap_create(3 * ts.n + 1);
    if (!t->feat)
        goto fail;
    for (size_t j = 0; j < ts.n; j++) {
        uint64_t sk;
        int rc = put_first(t->feat, key(SEED_UNI, ts.v[j].h, 0), ts.v[j].off);
        if (rc == 0 && j > 0)
            rc = put_first(t->feat, key(SEED_BI, ts.v[j - 1].h, ts.v[j].h), ts.v[j - 1].off);
        if (rc == 0 && slot_of(ts.v, ts.n, j, &sk))
            rc = put_first(t->feat, sk, ts.v[j].off);
        if (rc < 0)
            goto fail;
    }
    terms_fini(&ts);
    *out = t;
    return 0;
fail:
    terms_fini(&ts);
    prov_text_destroy(t);
    return -ENOMEM;
}

void prov_text_destroy(prov_text *t)
{
    if (!t)
        return;
    idmap_destroy(t->feat);
    free(t);
}

size_t prov_text_terms(const prov_text *t)
{
    return t->nterms;
}

/* Counts feature k of the memory once (seen holds those counted): total, found, and the
 * response offset of the first found into *at. */
static int count_feature(const prov_text *t, idmap *seen, uint64_t k, prov_overlap *o, size_t *at)
{
    if (idmap_get(seen, k, NULL))
        return 0;
    if (idmap_put(seen, k, 0) < 0)
        return -ENOMEM;
    o->total++;
    uint64_t off;
    if (idmap_get(t->feat, k, &off)) {
        o->found++;
        if (*at == SIZE_MAX)
            *at = (size_t)off;
    }
    return 0;
}

int prov_overlap_score(const prov_text *t, const char *mem, size_t len, prov_overlap *out)
{
    terms ts = {0};
    memset(out, 0, sizeof(*out));
    out->at = SIZE_MAX;
    if (read_terms(mem, len, &ts) < 0)
        return -ENOMEM;
    idmap *seen = idmap_create(2 * ts.n + 1);
    if (!seen) {
        terms_fini(&ts);
        return -ENOMEM;
    }
    size_t at_uni = SIZE_MAX, at_bi = SIZE_MAX;
    uint32_t run = 1;
    int rc = 0;
    for (size_t j = 0; j < ts.n && rc == 0; j++) {
        uint32_t f0 = out->found, t0 = out->total;
        rc = count_feature(t, seen, key(SEED_UNI, ts.v[j].h, 0), out, &at_uni);
        out->words += out->total - t0;
        out->words_found += out->found - f0;
        if (rc == 0 && j > 0) {
            uint64_t bk = key(SEED_BI, ts.v[j - 1].h, ts.v[j].h);
            rc = count_feature(t, seen, bk, out, &at_bi);
            bool hit = idmap_get(t->feat, bk, NULL);
            run = hit ? run + 1 : 1;
            if (hit && run > out->run)
                out->run = run;
        }
        uint64_t sk;
        /* a number the response lacks, with another number in its place there */
        if (rc == 0 && !out->conflict && !idmap_get(t->feat, key(SEED_UNI, ts.v[j].h, 0), NULL) &&
            slot_of(ts.v, ts.n, j, &sk) && idmap_get(t->feat, sk, NULL))
            out->conflict = true;
    }
    idmap_destroy(seen);
    terms_fini(&ts);
    if (rc < 0) {
        memset(out, 0, sizeof(*out));
        out->at = SIZE_MAX;
        return -ENOMEM;
    }
    if (out->run == 0 && out->words_found > 0)
        out->run = 1;
    out->score = out->total ? (double)out->found / out->total : 0.0;
    out->at = at_bi != SIZE_MAX ? at_bi : at_uni;
    return 0;
}

int prov_terms(const char *text, size_t len, char *out, size_t outlen)
{
    terms ts = {.keep_text = true};
    if (read_terms(text, len, &ts) < 0)
        return -ENOMEM;
    snprintf(out, outlen, "%s", ts.txt ? ts.txt : "");
    terms_fini(&ts);
    return 0;
}
