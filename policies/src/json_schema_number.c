/*
 * json_schema_number.c — the JSON Schema compiler's numbers and integers (json_schema.h,
 * "Numbers"): the unbounded forms, and bounds as exact digit-by-digit ranges.
 *
 * A bounded value is written as sign, integer part and an optional fraction that does not end in
 * 0, with at most JSON_SCHEMA_MAX_DIGITS significant digits (integers: no fraction at all). Bounds
 * are decimals: a JSON integer's digits, or a real's shortest round-trip decimal. The set of
 * values in [lo, hi] splits into the non-negative ones and the negative ones (a minus sign and a
 * magnitude range), and a magnitude range [lo, hi] into:
 *   A  the integer part of lo, with a fraction >= lo's (> when lo is exclusive);
 *   B  every integer part strictly between, with any fraction: the classic range-to-regex of
 *      integers, one piece per number of digits (`1[5-9]|[2-9][0-9]|1[0-1][0-9]|12[0-5]`);
 *   C  the integer part of hi, with a fraction <= hi's (< when exclusive);
 * or, when lo and hi share their integer part, that part with a fraction between both. Fractions
 * are compared digit by digit: a recursive walk over the positions that keeps, for each of the
 * two bounds, whether the digits so far equal the bound's ("tight"); a position tight to neither
 * allows any canonical rest in one closed form, so each level adds at most two tight branches and
 * the pattern stays linear in the digits.
 *
 * Why at most 15 significant digits: two different decimals of at most 15 significant digits are
 * two different doubles (DBL_DIG), and rounding to double keeps order, so a validator that
 * compares doubles (as JSON Schema validators do) orders every admitted value against a bound
 * exactly as the decimals compare, including at an exclusive bound.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema_impl.h"

#define FRAC_MAX      30                     /* digits after the point in a bound */
#define INTEGER_LIMIT 1000000000000000000ull /* |integer bound| <= 10^18 */
#define NUMBER_LIMIT  1000000000000000ull    /* |number bound| < 10^15 */

/* A non-negative decimal: ip.fp, fp without trailing zeros ("" for none). */
typedef struct dec {
    uint64_t ip;
    char fp[FRAC_MAX + 1];
} dec;

typedef struct bound {
    bool set, excl, neg; /* neg: the value is below zero (never for zero itself) */
    dec mag;
    const char *key; /* the keyword it came from, for messages */
} bound;

/* Alternatives being collected: "a|b|c"; n counts them, eps says one is the empty string. */
typedef struct alts {
    regex_text t;
    int n;
    bool eps;
} alts;

static void alts_init(alts *a) {
    *a = (alts){.t = {.limit = JSON_SCHEMA_MAX_REGEX}};
}

static void alts_add(alts *a, const char *s, size_t len) {
    if (a->n++) regex__text_puts(&a->t, "|");
    if (len == 0) a->eps = true;
    regex__text_put(&a->t, s, len);
}

/* Append `prefix` followed by the alternatives of sub (nothing when sub is only the empty
 * string) to a as one alternative; nothing when sub has none. */
static void alts_add_seq(alts *a, const char *prefix, const alts *sub) {
    if (sub->n == 0) return;
    if (a->n++) regex__text_puts(&a->t, "|");
    regex__text_puts(&a->t, prefix);
    if (sub->n == 1 && sub->eps) return;
    regex__text_puts(&a->t, "(?:");
    regex__text_put(&a->t, sub->t.data, sub->t.len);
    regex__text_puts(&a->t, ")");
    if (sub->t.status != CORRAL_OK && a->t.status == CORRAL_OK) a->t.status = sub->t.status;
}

static void alts_free(alts *a) {
    free(a->t.data);
    a->t.data = NULL;
}

static int n_digits(uint64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

static uint64_t pow10u(int n) {
    uint64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
}

/* ---- fractions ------------------------------------------------------------------------------- */

/* The fraction bounds of one magnitude range. */
typedef struct frac_bounds {
    const char *lo, *hi; /* digits, no trailing zeros */
    int lo_n, hi_n;
    bool lo_excl, hi_excl;
} frac_bounds;

static void digit_class(char *buf, size_t cap, int a, int b) {
    if (a == b)
        snprintf(buf, cap, "%d", a);
    else if (a == 0 && b == 9)
        snprintf(buf, cap, "[0-9]");
    else
        snprintf(buf, cap, "[%d-%d]", a, b);
}

/* The fractions (with their point; the empty string for none) after i digits equal so far to
 * lo's (tl) and/or hi's (th), the last of them a zero (lastzero), with r digits still allowed,
 * that keep the value within the bounds and end in a nonzero digit. */
static void frac(const frac_bounds *f, int i, bool tl, bool th, bool lastzero, int r, alts *out) {
    if (i == 0 || !lastzero) { /* stop here: the value is the prefix */
        bool ok = true;
        if (tl) ok = i >= f->lo_n && !f->lo_excl; /* lo has nonzero digits left: lo > prefix */
        if (ok && th && i >= f->hi_n) ok = !f->hi_excl;
        if (ok) alts_add(out, "", 0);
    }
    if (r == 0) return;
    /* Past lo's last digit, equal so far: every canonical rest makes the value larger than lo. */
    if (tl && i >= f->lo_n) tl = false;
    const char *dot = i == 0 ? "\\." : "";
    char buf[64];
    if (!tl && !th) { /* any canonical rest */
        if (r == 1)
            snprintf(buf, sizeof buf, "%s[1-9]", dot);
        else
            snprintf(buf, sizeof buf, "%s[0-9]{0,%d}[1-9]", dot, r - 1);
        alts_add(out, buf, strlen(buf));
        return;
    }
    const int dlo = tl ? f->lo[i] - '0' : 0;
    /* Past hi's last digit with equal digits so far, every nonzero digit would exceed hi. */
    const int dhi = th ? (i < f->hi_n ? f->hi[i] - '0' : -1) : 9;
    for (int c = dlo; c <= dhi;) {
        const bool ntl = tl && c == dlo, nth = th && c == dhi;
        int end = c;
        if (!ntl && !nth && c > 0) end = th ? dhi - 1 : 9; /* a free run of nonzero digits */
        alts sub;
        alts_init(&sub);
        frac(f, i + 1, ntl, nth, end == 0, r - 1, &sub);
        char cls[32];
        digit_class(cls, sizeof cls, c, end);
        snprintf(buf, sizeof buf, "%s%s", dot, cls);
        alts_add_seq(out, buf, &sub);
        alts_free(&sub);
        c = end + 1;
    }
}

/* ---- integer parts ---------------------------------------------------------------------------
 */

static const char nines[] = "9999999999999999999999";
static const char zeros[] = "0000000000000000000000";

/* The n-digit strings from a to b (a <= b, both n digits). */
static void same_length(regex_text *t, const char *a, const char *b, int n) {
    if (n == 0) return;
    if (a[0] == b[0]) {
        regex__text_put(t, a, 1);
        same_length(t, a + 1, b + 1, n - 1);
        return;
    }
    const bool lo_zeros = strncmp(a + 1, zeros, (size_t)n - 1) == 0;
    const bool hi_nines = strncmp(b + 1, nines, (size_t)n - 1) == 0;
    int first = a[0] - '0', last = b[0] - '0', k = 0;
    regex__text_puts(t, "(?:");
    if (!lo_zeros) {
        regex__text_put(t, a, 1);
        same_length(t, a + 1, nines, n - 1);
        first++, k++;
    }
    if (!hi_nines) last--;
    if (first <= last) {
        char cls[32];
        digit_class(cls, sizeof cls, first, last);
        regex__text_puts(t, k++ ? "|" : "");
        regex__text_puts(t, cls);
        if (n > 2) regex__text_printf(t, "[0-9]{%d}", n - 1);
        if (n == 2) regex__text_puts(t, "[0-9]");
    }
    if (!hi_nines) {
        regex__text_puts(t, k ? "|" : "");
        regex__text_put(t, b, 1);
        same_length(t, zeros, b + 1, n - 1);
    }
    regex__text_puts(t, ")");
}

/* The fraction allowed after an integer part of len digits: any canonical one, or none. */
static int frac_room(bool integer, int len) {
    return integer || len >= JSON_SCHEMA_MAX_DIGITS ? 0 : JSON_SCHEMA_MAX_DIGITS - len;
}

/* Every integer part x..y (y may be "no limit": up to max_digits digits) with any fraction. */
static void middle(alts *out, uint64_t x, uint64_t y, bool integer) {
    const int lx = n_digits(x), ly = n_digits(y);
    for (int len = lx; len <= ly; len++) {
        const uint64_t lo = len == lx ? x : pow10u(len - 1);
        const uint64_t hi = len == ly ? y : pow10u(len) - 1;
        if (lo > hi) continue;
        char a[24], b[24];
        snprintf(a, sizeof a, "%llu", (unsigned long long)lo);
        snprintf(b, sizeof b, "%llu", (unsigned long long)hi);
        if (out->n++) regex__text_puts(&out->t, "|");
        same_length(&out->t, a, b, len);
        const int r = frac_room(integer, len);
        if (r == 1) regex__text_puts(&out->t, "(?:\\.[1-9])?");
        if (r > 1) regex__text_printf(&out->t, "(?:\\.[0-9]{0,%d}[1-9])?", r - 1);
    }
}

/* The magnitudes from lo to hi (hi NULL: no upper bound; then integer parts up to max_digits
 * digits). */
static void magnitudes(alts *out, const bound *lo, const bound *hi, bool integer, int max_digits) {
    const uint64_t a = lo->mag.ip;
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)a);
    frac_bounds f = {.lo = lo->mag.fp,
                     .lo_n = (int)strlen(lo->mag.fp),
                     .lo_excl = lo->excl,
                     .hi = hi ? hi->mag.fp : "",
                     .hi_n = hi ? (int)strlen(hi->mag.fp) : 0,
                     .hi_excl = hi && hi->excl};
    alts sub;
    if (hi && hi->mag.ip < a) return;
    if (hi && hi->mag.ip == a) {
        alts_init(&sub);
        frac(&f, 0, true, true, false, frac_room(integer, n_digits(a)), &sub);
        alts_add_seq(out, digits, &sub);
        alts_free(&sub);
        return;
    }
    alts_init(&sub);
    frac(&f, 0, true, false, false, frac_room(integer, n_digits(a)), &sub);
    alts_add_seq(out, digits, &sub); /* A */
    alts_free(&sub);
    if (!hi) {
        middle(out, a + 1, pow10u(max_digits) - 1, integer); /* B, open above */
        return;
    }
    const uint64_t b = hi->mag.ip;
    if (b - a >= 2) middle(out, a + 1, b - 1, integer); /* B */
    alts_init(&sub);
    frac(&f, 0, false, true, false, frac_room(integer, n_digits(b)), &sub);
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)b);
    alts_add_seq(out, digits, &sub); /* C */
    alts_free(&sub);
}

/* ---- bounds ---------------------------------------------------------------------------------- */

/* v's magnitude as the shortest decimal that reads back as the same double. */
static bool dec_from_real(double v, dec *out) {
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* buf: d[.ddd]e[+-]XX */
    char mant[24];
    int k = 0;
    const char *p = buf;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && k < 20) mant[k++] = *p;
    mant[k] = '\0';
    const int e = *p == 'e' ? atoi(p + 1) : 0; /* value = m[0].m[1..] x 10^e */
    *out = (dec){0};
    if (e >= 19) return false;
    int frac_n = 0;
    if (e < 0) { /* 0.000ddd */
        if (-e - 1 + k > FRAC_MAX) return false;
        for (int z = 0; z < -e - 1; z++) out->fp[frac_n++] = '0';
        for (int i = 0; i < k; i++) out->fp[frac_n++] = mant[i];
    } else {
        if (k - e - 1 > FRAC_MAX) return false;
        for (int i = 0; i < k; i++) {
            if (i <= e)
                out->ip = out->ip * 10 + (uint64_t)(mant[i] - '0');
            else
                out->fp[frac_n++] = mant[i];
        }
        for (int i = k; i <= e; i++) out->ip *= 10; /* the integer part's trailing zeros */
    }
    while (frac_n > 0 && out->fp[frac_n - 1] == '0') frac_n--;
    out->fp[frac_n] = '\0';
    return true;
}

/* Read bound keyword key of s, if present, into b. */
static bool read_bound(js_ctx *j, const json_t *s, const char *key, bool excl, bool integer,
                       bound *b) {
    const json_t *v = json_object_get(s, key);
    *b = (bound){.key = key};
    if (!v) return true;
    const uint64_t limit = integer ? INTEGER_LIMIT : NUMBER_LIMIT;
    const char *range = integer ? "10^18 in magnitude" : "below 10^15 in magnitude";
    if (json_is_integer(v)) {
        const json_int_t x = json_integer_value(v);
        const uint64_t m = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        if (m > limit || (!integer && m == limit))
            return js__fail(j, key, CORRAL_INVALID_ARGUMENT,
                            "%s %lld is not supported: bounds must be %s", key, (long long)x,
                            range);
        *b = (bound){.set = true, .excl = excl, .neg = x < 0, .mag = {.ip = m}, .key = key};
        return true;
    }
    if (!json_is_real(v))
        return js__fail(j, key, CORRAL_INVALID_ARGUMENT, "%s must be a number", key);
    const double x = json_real_value(v), m = fabs(x);
    if (!(m < (double)limit || (integer && m == (double)limit)))
        return js__fail(j, key, CORRAL_INVALID_ARGUMENT,
                        "%s %g is not supported: bounds must be %s", key, x, range);
    b->set = true;
    b->excl = excl;
    b->neg = x < 0;
    if (!dec_from_real(m, &b->mag))
        return js__fail(j, key, CORRAL_INVALID_ARGUMENT,
                        "%s %g is not supported: at most %d digits after the point", key, x,
                        FRAC_MAX);
    if (b->mag.ip == 0 && !b->mag.fp[0]) b->neg = false; /* -0.0 */
    return true;
}

/* Signed comparison of two set bounds' values. */
static int bound_cmp(const bound *a, const bound *b) {
    if (a->neg != b->neg) return a->neg ? -1 : 1;
    int c = a->mag.ip < b->mag.ip ? -1 : a->mag.ip > b->mag.ip;
    if (!c) c = strcmp(a->mag.fp, b->mag.fp);
    if (c) c = c < 0 ? -1 : 1;
    return a->neg ? -c : c;
}

/* The tighter of an inclusive and an exclusive bound on the same side (lower: the larger). */
static bound tighter(const bound *incl, const bound *excl, bool lower) {
    if (!incl->set) return *excl;
    if (!excl->set) return *incl;
    const int c = bound_cmp(incl, excl);
    if (c == 0) return *excl;
    return (c > 0) == lower ? *incl : *excl;
}

/* A boolean exclusiveMinimum/Maximum (draft 4) makes minimum/maximum exclusive. */
static bool read_side(js_ctx *j, const json_t *s, bool lower, bool integer, bound *out) {
    const char *incl_key = lower ? "minimum" : "maximum";
    const char *excl_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    const json_t *ex = json_object_get(s, excl_key);
    bound in, exb = {0};
    if (!read_bound(j, s, incl_key, json_is_true(ex), integer, &in)) return false;
    if (ex && !json_is_boolean(ex) && !read_bound(j, s, excl_key, true, integer, &exb))
        return false;
    *out = tighter(&in, &exb, lower);
    return true;
}

bool js__any_number(regex_text *out) {
    /* At most JSON_SCHEMA_MAX_DIGITS digits on each side of the point (and an exponent up to 99):
     * every value is a finite double, and integers stay exact in one (and in int64), so that
     * consumers with fixed-size numbers read what was written. */
    return regex__text_printf(out,
                              "-?(?:0|[1-9][0-9]{0,%d})(?:\\.[0-9]{0,%d}[1-9])?"
                              "(?:[eE][+\\-]?[1-9][0-9]?)?",
                              JSON_SCHEMA_MAX_DIGITS - 1, JSON_SCHEMA_MAX_DIGITS - 1);
}

bool js__number(js_ctx *j, const json_t *s, bool integer) {
    bound lo, hi;
    if (!read_side(j, s, true, integer, &lo) || !read_side(j, s, false, integer, &hi)) return false;
    if (!lo.set && !hi.set) {
        if (!integer) return js__any_number(j->out);
        return regex__text_printf(j->out, "(?:0|-?[1-9][0-9]{0,%d})", JSON_SCHEMA_MAX_DIGITS - 1);
    }
    const char *what = integer ? "integer" : "number";
    if (lo.set && hi.set) {
        const int c = bound_cmp(&lo, &hi);
        if (c > 0 || (c == 0 && (lo.excl || hi.excl)))
            return js__fail(j, hi.key, CORRAL_INVALID_ARGUMENT, "no %s is within %s and %s", what,
                            lo.key, hi.key);
    }
    int max_digits = JSON_SCHEMA_MAX_DIGITS;
    if (integer) {
        if (lo.set && n_digits(lo.mag.ip) > max_digits) max_digits = n_digits(lo.mag.ip);
        if (hi.set && n_digits(hi.mag.ip) > max_digits) max_digits = n_digits(hi.mag.ip);
    }
    alts all;
    alts_init(&all);
    const bound zero_in = {.set = true}, zero_ex = {.set = true, .excl = true};
    /* Values >= 0: unless hi is below zero (or zero, exclusive). */
    const bool hi_below_zero = hi.set && (hi.neg || (hi.mag.ip == 0 && !hi.mag.fp[0] && hi.excl));
    if (!hi_below_zero) {
        const bound *from = lo.set && !lo.neg ? &lo : &zero_in;
        magnitudes(&all, from, hi.set ? &hi : NULL, integer, max_digits);
    }
    /* Values < 0: unless lo is zero or above. */
    if (!lo.set || lo.neg) {
        alts neg;
        alts_init(&neg);
        const bound *from = hi.set && hi.neg ? &hi : &zero_ex;
        magnitudes(&neg, from, lo.set ? &lo : NULL, integer, max_digits);
        if (neg.n) {
            if (all.n++) regex__text_puts(&all.t, "|");
            regex__text_puts(&all.t, "-(?:");
            regex__text_put(&all.t, neg.t.data, neg.t.len);
            regex__text_puts(&all.t, ")");
            if (neg.t.status != CORRAL_OK && all.t.status == CORRAL_OK) all.t.status = neg.t.status;
        }
        alts_free(&neg);
    }
    bool ok;
    if (all.t.status != CORRAL_OK) {
        ok = js__fail(j, NULL, all.t.status,
                      all.t.status == CORRAL_OUT_OF_MEMORY ? "out of memory"
                                                           : "the bounds' pattern is too large");
    } else if (all.n == 0) {
        ok = js__fail(j, lo.set ? lo.key : hi.key, CORRAL_INVALID_ARGUMENT,
                      "no %s within the bounds can be written with at most %d significant digits",
                      what, JSON_SCHEMA_MAX_DIGITS);
    } else {
        regex__text_puts(j->out, "(?:");
        regex__text_put(j->out, all.t.data, all.t.len);
        ok = regex__text_puts(j->out, ")");
    }
    alts_free(&all);
    return ok && js__ok(j);
}
