/*
 * pretokenize.c — llama.cpp's BPE pre-tokenizers, written as small splitters in C.
 *
 * How llama.cpp splits, and therefore what the reference ids depend on: each `tokenizer.ggml.pre`
 * value selects a list of regexes that are applied one after the other. Every regex refines the
 * current list of segments: inside each segment it finds the successive leftmost matches
 * (ECMAScript semantics: at each position the alternatives are tried in order, quantifiers are
 * greedy and backtrack), and both the matches and the unmatched stretches between them become
 * segments. A match never crosses a segment boundary, and `$` and look-aheads see the segment end
 * as the end of the text.
 *
 * The regexes themselves are evaluated in one of three ways there, and each has quirks that the
 * reference vectors reflect:
 *   - two patterns (GPT-2's and Llama 3's) have hand-written splitters that classify code points
 *     with Unicode flags;
 *   - a pattern that uses \p{...} runs through std::regex on a "collapsed" copy of the text in
 *     which every code point >= 0x80 is replaced by one byte naming its class (letter, number,
 *     punctuation, symbol, mark, other) or by 0x0B when it is White_Space, while ASCII stays
 *     itself; \p{L} then means A-Za-z or a non-ASCII letter, \s means White_Space, and so on;
 *   - a pattern without \p{...} runs through std::wregex on the code points, after every
 *     non-ASCII White_Space code point was replaced by 0x0B (so a literal class that contains,
 *     say, U+3000 never matches it).
 *
 * Here every regex is a matcher: a function that, given a position inside a segment, returns the
 * length of the match that starts there (0 for none). One driver (split_segment) turns a matcher
 * into the leftmost-match splitting described above; a family is a list of matchers. Each matcher
 * answers in time proportional to its match (or O(1) when it fails), so splitting is linear —
 * except "\s+$", which would be quadratic on long blank runs as a matcher and therefore has a
 * splitter of its own. The class tests reproduce the collapsed and wide-regex views exactly
 * (see is_* below); the GPT-2 and Llama 3 matchers follow llama.cpp's hand-written splitters,
 * which agree with their regexes.
 */
#include "pretokenize.h"

#include <string.h>

#include "corral/unicode.h"

/* ---- names ----------------------------------------------------------------------------------- */

/* Values of `tokenizer.ggml.pre` that llama.cpp maps onto one of the families implemented here,
 * with the flags it sets for them. "gpt-neox" is not a llama.cpp name; GPT-NeoX-20B's tokenizer
 * uses the GPT-2 byte-level pattern, so it is accepted as GPT-2. Names whose models need more
 * than the regex (a separator token, per-token strip rules, other normalisers) are left out on
 * purpose: they are rejected as unknown rather than tokenized almost right. */
static const pretok_name pretok_names[] = {
    {"default", PRETOK_DEFAULT, 0, 0},
    {"gpt-2", PRETOK_GPT2, 0, 0},
    {"phi-2", PRETOK_GPT2, 0, 0},
    {"gpt-neox", PRETOK_GPT2, 0, 0},
    {"mpt", PRETOK_GPT2, 0, 0},
    {"olmo", PRETOK_GPT2, 0, 0},
    {"jais", PRETOK_GPT2, 0, 0},
    {"jina-es", PRETOK_GPT2, 0, 0},
    {"jina-de", PRETOK_GPT2, 0, 0},
    {"gigachat", PRETOK_GPT2, 0, 0},
    {"a.x-4.0", PRETOK_GPT2, 0, 0},
    {"mellum", PRETOK_GPT2, 0, 0},
    {"exaone4", PRETOK_GPT2, 0, 0},
    {"trillion", PRETOK_GPT2, 0, 0},
    {"granite-docling", PRETOK_GPT2, 0, 0},
    {"llama3", PRETOK_LLAMA3, 1, 1},
    {"llama-v3", PRETOK_LLAMA3, 1, 1},
    {"llama-bpe", PRETOK_LLAMA3, 1, 1},
    {"falcon3", PRETOK_LLAMA3, 1, 1},
    {"falcon-h1", PRETOK_LLAMA3, 1, 1},
    {"pixtral", PRETOK_LLAMA3, 1, 1},
    {"midm-2.0", PRETOK_LLAMA3, 1, 1},
    {"lfm2", PRETOK_LLAMA3, 1, 1},
    {"jina-v5-nano", PRETOK_LLAMA3, 1, 1},
    {"dbrx", PRETOK_LLAMA3, 0, 0},
    {"smaug-bpe", PRETOK_LLAMA3, 0, 0},
    {"qwen2", PRETOK_QWEN2, 0, 0},
    {"deepseek-r1-qwen", PRETOK_QWEN2, 0, 0},
    {"kormo", PRETOK_QWEN2, 0, 0},
    {"f2llmv2", PRETOK_QWEN2, 0, 0},
    {"megrez", PRETOK_QWEN2, 0, 0},
    {"stablelm2", PRETOK_QWEN2, 0, 0},
    {"hunyuan", PRETOK_QWEN2, 0, 0},
    {"solar-open", PRETOK_QWEN2, 0, 0},
    {"grok-2", PRETOK_QWEN2, 0, 0},
    {"falcon", PRETOK_FALCON, 0, 0},
    {"starcoder", PRETOK_STARCODER, 0, 0},
    {"refact", PRETOK_STARCODER, 0, 0},
    {"command-r", PRETOK_STARCODER, 0, 0},
    {"smollm", PRETOK_STARCODER, 0, 0},
    {"codeshell", PRETOK_STARCODER, 0, 0},
    {"exaone", PRETOK_STARCODER, 0, 0},
    {"minerva-7b", PRETOK_STARCODER, 0, 0},
    {"mellum2", PRETOK_STARCODER, 0, 0},
    {"deepseek-llm", PRETOK_DEEPSEEK_LLM, 0, 0},
    {"deepseek-coder", PRETOK_DEEPSEEK_CODER, 0, 0},
};

const pretok_name *pretok_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof pretok_names / sizeof pretok_names[0]; i++) {
        if (strlen(pretok_names[i].name) == len && memcmp(pretok_names[i].name, name, len) == 0) {
            return &pretok_names[i];
        }
    }
    return NULL;
}

const char *pretok_kind_name(pretok_kind kind) {
    static const char *const names[PRETOK_COUNT] = {
        [PRETOK_DEFAULT] = "default",
        [PRETOK_GPT2] = "gpt2",
        [PRETOK_LLAMA3] = "llama3",
        [PRETOK_QWEN2] = "qwen2",
        [PRETOK_FALCON] = "falcon",
        [PRETOK_STARCODER] = "starcoder",
        [PRETOK_DEEPSEEK_LLM] = "deepseek-llm",
        [PRETOK_DEEPSEEK_CODER] = "deepseek-coder",
    };
    return (unsigned)kind < PRETOK_COUNT ? names[kind] : "?";
}

/* ---- the text being split -------------------------------------------------------------------- */

typedef struct pt_text {
    const uint32_t *cpts;
    const uint16_t *flags;
} pt_text;

/* llama.cpp's helpers answer "nothing" outside the current segment: no flags, no code point. */
#define OUT_OF_RANGE 0xFFFFFFFFu

static uint32_t cpt_at(const pt_text *t, size_t pos, size_t end) {
    return pos < end ? t->cpts[pos] : OUT_OF_RANGE;
}

static uint32_t flags_at(const pt_text *t, size_t pos, size_t end) {
    return pos < end ? t->flags[pos] : 0;
}

#define F_WS  UNICODE_FLAG_WHITESPACE
#define F_L   UNICODE_FLAG_LETTER
#define F_N   UNICODE_FLAG_NUMBER
#define F_LNW (UNICODE_FLAG_LETTER | UNICODE_FLAG_NUMBER | UNICODE_FLAG_WHITESPACE)

/* ---- classes as the collapsed std::regex sees them ------------------------------------------- */

/* The ASCII members of \p{P} in llama.cpp's collapsed regexes (equal to Unicode's). */
static int ascii_is_punct(uint32_t c) {
    return c < 0x80 && c != 0 && strchr("!\"#%&'()*,-./:;?@[\\]_{}", (int)c) != NULL;
}

static int is_letter(const pt_text *t, size_t i) { /* \p{L} */
    uint32_t c = t->cpts[i];
    if (c < 0x80) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    }
    return (t->flags[i] & (F_L | F_WS)) == F_L;
}

static int is_number(const pt_text *t, size_t i) { /* \p{N} */
    uint32_t c = t->cpts[i];
    if (c < 0x80) {
        return c >= '0' && c <= '9';
    }
    return (t->flags[i] & (F_N | F_WS)) == F_N;
}

static int is_punct(const pt_text *t, size_t i) { /* \p{P} */
    uint32_t c = t->cpts[i];
    if (c < 0x80) {
        return ascii_is_punct(c);
    }
    return (t->flags[i] & (UNICODE_FLAG_PUNCTUATION | F_WS)) == UNICODE_FLAG_PUNCTUATION;
}

static int is_space(const pt_text *t, size_t i) { /* \s, in both regex flavours */
    return (t->flags[i] & F_WS) != 0;
}

/* [\p{P}\$\+<=>\^~\|`] (falcon) and the same without the backquote (default). */
static int is_falcon_punct(const pt_text *t, size_t i) {
    uint32_t c = t->cpts[i];
    return is_punct(t, i) || (c < 0x80 && c != 0 && strchr("$+<=>^~|`", (int)c) != NULL);
}

static int is_default_punct(const pt_text *t, size_t i) {
    uint32_t c = t->cpts[i];
    return is_punct(t, i) || (c < 0x80 && c != 0 && strchr("$+<=>^~|", (int)c) != NULL);
}

/* ---- literal classes as std::wregex sees them ------------------------------------------------ */

/* The code point a wide regex compares: non-ASCII White_Space was turned into 0x0B. */
static uint32_t wide_cpt(const pt_text *t, size_t i) {
    uint32_t c = t->cpts[i];
    return (c >= 0x80 && (t->flags[i] & F_WS)) ? 0x0B : c;
}

/* [一-龥ࠀ-一가-퟿] of both DeepSeek cascades: U+4E00-U+9FA5, U+0800-U+4E00, U+AC00-U+D7FF.
 */
static const unicode_range cjk_ranges[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};

static int is_deepseek_cjk(const pt_text *t, size_t i) {
    return unicode_in_ranges(cjk_ranges, sizeof cjk_ranges / sizeof cjk_ranges[0], wide_cpt(t, i));
}

/* DeepSeek LLM's letter class, transcribed as code points from its regex
 * "[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-Ֆ...𞤀-𞥃]"
 * (llama.cpp, LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM): the cased letters (Lu/Ll/Lt) of these blocks.
 * Sorted. */
static const unicode_range deepseek_letter_ranges[] = {
    {0x0041, 0x005A},   {0x0061, 0x007A},   {0x00B5, 0x00B5},   {0x00C0, 0x00D6},
    {0x00D8, 0x00F6},   {0x00F8, 0x01BA},   {0x01BC, 0x01BF},   {0x01C4, 0x0293},
    {0x0295, 0x02AF},   {0x0370, 0x0373},   {0x0376, 0x0377},   {0x037B, 0x037D},
    {0x037F, 0x037F},   {0x0386, 0x0386},   {0x0388, 0x038A},   {0x038C, 0x038C},
    {0x038E, 0x03A1},   {0x03A3, 0x03F5},   {0x03F7, 0x0481},   {0x048A, 0x052F},
    {0x0531, 0x0556},   {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

static int is_deepseek_letter(const pt_text *t, size_t i) {
    return unicode_in_ranges(deepseek_letter_ranges,
                             sizeof deepseek_letter_ranges / sizeof deepseek_letter_ranges[0],
                             wide_cpt(t, i));
}

/* DeepSeek LLM's "[!-/:-~！-／：-～‘-‟　-。]" (U+3000 is White_Space, so it never matches). */
static const unicode_range deepseek_punct_ranges[] = {
    {0x0021, 0x002F}, {0x003A, 0x007E}, {0x2018, 0x201F},
    {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

static int is_deepseek_punct(const pt_text *t, size_t i) {
    return unicode_in_ranges(deepseek_punct_ranges,
                             sizeof deepseek_punct_ranges / sizeof deepseek_punct_ranges[0],
                             wide_cpt(t, i));
}

static int is_cr_or_lf(const pt_text *t, size_t i) {
    return t->cpts[i] == '\r' || t->cpts[i] == '\n';
}

/* ---- matchers -------------------------------------------------------------------------------- */

typedef int (*class_fn)(const pt_text *t, size_t i);

/* A matcher: the length of the match starting at pos inside [.., end), or 0. */
typedef struct matcher {
    enum { M_ONE, M_RUN, M_SPACE_RUN, M_DIGIT3, M_GPT2, M_LLAMA3, M_QWEN2 } kind;
    class_fn cls; /* for M_ONE ([c]), M_RUN ([c]+), M_SPACE_RUN (\s?[c]+) */
} matcher;

static size_t class_run(const pt_text *t, class_fn cls, size_t pos, size_t end) {
    size_t p = pos;
    while (p < end && cls(t, p)) {
        p++;
    }
    return p - pos;
}

/* 's|'t|'re|'ve|'m|'ll|'d at pos, compared case-sensitively or not. llama.cpp lowers the letters
 * with the full Unicode table, but no code point outside ASCII lowercases to one of these letters,
 * so an ASCII comparison is the same. */
static size_t contraction(const pt_text *t, size_t pos, size_t end, int fold) {
    if (t->cpts[pos] != '\'' || pos + 1 >= end) {
        return 0;
    }
    uint32_t a = t->cpts[pos + 1];
    if (fold && a >= 'A' && a <= 'Z') {
        a += 'a' - 'A';
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        return 2;
    }
    if (pos + 2 >= end) {
        return 0;
    }
    uint32_t b = t->cpts[pos + 2];
    if (fold && b >= 'A' && b <= 'Z') {
        b += 'a' - 'A';
    }
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return 3;
    }
    return 0;
}

/* The blank-run endings shared by both hand-written patterns: \s+(?!\S) gives back the last
 * blank when a non-blank follows inside the segment; otherwise \s+ takes the whole run. */
static size_t blank_run(size_t n_blank, size_t pos, size_t end) {
    if (n_blank > 1 && pos + n_blank < end) {
        return n_blank - 1;
    }
    return n_blank;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S), plus llama.cpp's \s+
 * fallback and a single code point when nothing matches (both become gap segments under the
 * plain regex, with the same boundaries). */
static size_t match_gpt2(const pt_text *t, size_t pos, size_t end) {
    size_t len = contraction(t, pos, end, 0);
    if (len) {
        return len;
    }
    uint32_t c = t->cpts[pos];
    size_t skip = c == ' ';
    uint32_t f = skip ? flags_at(t, pos + 1, end) : t->flags[pos];
    uint32_t want = 0;
    if (f & F_L) {
        want = F_L;
    } else if (f & F_N) {
        want = F_N;
    }
    if (want) {
        size_t p = pos + skip;
        while (flags_at(t, p, end) & want) {
            p++;
        }
        return p - pos;
    }
    if (!(f & F_LNW) && f) { /* f == 0 only past the segment end */
        size_t p = pos + skip;
        for (uint32_t g = f; !(g & F_LNW) && g; g = flags_at(t, ++p, end)) {
        }
        return p - pos;
    }
    size_t n_blank = 0;
    while (flags_at(t, pos + n_blank, end) & F_WS) {
        n_blank++;
    }
    return n_blank ? blank_run(n_blank, pos, end) : 1;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * — Llama 3 (max_digits 3) and Qwen 2 (max_digits 1). */
static size_t match_llama3(const pt_text *t, size_t pos, size_t end, size_t max_digits) {
    size_t len = contraction(t, pos, end, 1);
    if (len) {
        return len;
    }
    uint32_t c = t->cpts[pos];
    uint32_t f = t->flags[pos];
    if (!(c == '\r' || c == '\n' || (f & F_N))) {
        if ((f & F_L) || (flags_at(t, pos + 1, end) & F_L)) {
            size_t p = pos + 1;
            while (flags_at(t, p, end) & F_L) {
                p++;
            }
            return p - pos;
        }
    }
    if (f & F_N) {
        size_t p = pos;
        while (p < end && (t->flags[p] & F_N) && p - pos < max_digits) {
            p++;
        }
        return p - pos;
    }
    size_t skip = c == ' ';
    uint32_t f2 = skip ? flags_at(t, pos + 1, end) : f;
    /* llama.cpp tests the current code point's flags (f) here, not f2; as f is never 0 inside a
     * segment this only lets a lone trailing space through, which \s+ would match the same. */
    if (!(f2 & F_LNW) && f) {
        size_t p = pos + skip;
        for (uint32_t g = f2; !(g & F_LNW) && g; g = flags_at(t, ++p, end)) {
        }
        for (uint32_t d = cpt_at(t, p, end); d == '\r' || d == '\n'; d = cpt_at(t, ++p, end)) {
        }
        return p - pos;
    }
    size_t n_blank = 0, through_newline = 0;
    while (flags_at(t, pos + n_blank, end) & F_WS) {
        uint32_t d = t->cpts[pos + n_blank];
        n_blank++;
        if (d == '\r' || d == '\n') {
            through_newline = n_blank; /* \s*[\r\n]+ ends after the last newline of the run */
        }
    }
    if (through_newline) {
        return through_newline;
    }
    return n_blank ? blank_run(n_blank, pos, end) : 1;
}

static size_t match_at(const matcher *m, const pt_text *t, size_t pos, size_t end) {
    switch (m->kind) {
        case M_ONE:
            return m->cls(t, pos) ? 1 : 0;
        case M_RUN:
            return class_run(t, m->cls, pos, end);
        case M_SPACE_RUN: {
            /* \s?[c]+: the optional blank is greedy but gives way when no [c] follows it */
            if (is_space(t, pos) && pos + 1 < end && m->cls(t, pos + 1)) {
                return 1 + class_run(t, m->cls, pos + 1, end);
            }
            return class_run(t, m->cls, pos, end);
        }
        case M_DIGIT3: { /* [0-9][0-9][0-9] on the real code points */
            if (pos + 3 > end) {
                return 0;
            }
            for (size_t i = pos; i < pos + 3; i++) {
                if (t->cpts[i] < '0' || t->cpts[i] > '9') {
                    return 0;
                }
            }
            return 3;
        }
        case M_GPT2:
            return match_gpt2(t, pos, end);
        case M_LLAMA3:
            return match_llama3(t, pos, end, 3);
        case M_QWEN2:
            return match_llama3(t, pos, end, 1);
    }
    return 0;
}

/* ---- driving the passes ---------------------------------------------------------------------- */

typedef struct seg_out {
    size_t *ends;
    size_t n;
} seg_out;

static void seg_emit(seg_out *o, size_t end) {
    o->ends[o->n++] = end;
}

/* Leftmost matching inside [start, end): matches and the stretches between them are segments. */
static void split_segment(const matcher *m, const pt_text *t, size_t start, size_t end,
                          seg_out *o) {
    size_t gap = start, pos = start;
    while (pos < end) {
        size_t len = match_at(m, t, pos, end);
        if (len == 0) {
            pos++;
            continue;
        }
        if (gap < pos) {
            seg_emit(o, pos);
        }
        pos += len;
        seg_emit(o, pos);
        gap = pos;
    }
    if (gap < end) {
        seg_emit(o, end);
    }
}

/* \s+$ : only the blank run that reaches the segment end matches. */
static void split_trailing_blanks(const pt_text *t, size_t start, size_t end, seg_out *o) {
    size_t tail = end;
    while (tail > start && is_space(t, tail - 1)) {
        tail--;
    }
    if (tail > start && tail < end) {
        seg_emit(o, tail);
    }
    seg_emit(o, end);
}

/* A family: up to six passes; a pass with trailing_blanks set is "\s+$". */
typedef struct pass {
    matcher m;
    int trailing_blanks;
} pass;

#define PASS(kind_, cls_) \
    { .m = {.kind = (kind_), .cls = (cls_)}, .trailing_blanks = 0 }
#define PASS_TRAILING_BLANKS \
    { .m = {.kind = M_ONE, .cls = NULL}, .trailing_blanks = 1 }
#define MAX_PASSES 6

typedef struct family {
    size_t n_passes;
    pass passes[MAX_PASSES];
} family;

/* The regex lists of llama.cpp's llm_tokenizer_bpe, in order, per family. */
static const family families[PRETOK_COUNT] = {
    [PRETOK_DEFAULT] = {4,
                        {
                            PASS(M_RUN, is_default_punct), /* [\p{P}\$\+<=>\^~\|]+ */
                            PASS(M_GPT2, NULL),            /* GPT-2's pattern */
                            PASS(M_RUN, is_number),        /* \p{N}+ */
                            PASS(M_DIGIT3, NULL),          /* [0-9][0-9][0-9] */
                        }},
    [PRETOK_GPT2] = {1, {PASS(M_GPT2, NULL)}},
    [PRETOK_LLAMA3] = {1, {PASS(M_LLAMA3, NULL)}},
    [PRETOK_QWEN2] = {1, {PASS(M_QWEN2, NULL)}},
    [PRETOK_FALCON] = {3,
                       {
                           PASS(M_RUN, is_falcon_punct), /* [\p{P}\$\+<=>\^~\|`]+ */
                           PASS(M_GPT2, NULL),           /* GPT-2's pattern */
                           PASS(M_DIGIT3, NULL),         /* [0-9][0-9][0-9] */
                       }},
    [PRETOK_STARCODER] = {2,
                          {
                              PASS(M_ONE, is_number), /* \p{N} */
                              PASS(M_GPT2, NULL),     /* GPT-2's pattern */
                          }},
    [PRETOK_DEEPSEEK_LLM] = {6,
                             {
                                 PASS(M_ONE, is_cr_or_lf),              /* [\r\n] */
                                 PASS(M_SPACE_RUN, is_deepseek_letter), /* \s?[A-Za-z...]+ */
                                 PASS(M_SPACE_RUN, is_deepseek_punct),  /* \s?[!-/:-~...]+ */
                                 PASS_TRAILING_BLANKS,                  /* \s+$ */
                                 PASS(M_RUN, is_deepseek_cjk), /* [一-龥ࠀ-一가-퟿]+ */
                                 PASS(M_RUN, is_number),       /* \p{N}+ */
                             }},
    [PRETOK_DEEPSEEK_CODER] = {5,
                               {
                                   PASS(M_ONE, is_cr_or_lf),     /* [\r\n] */
                                   PASS(M_SPACE_RUN, is_letter), /* \s?\p{L}+ */
                                   PASS(M_SPACE_RUN, is_punct),  /* \s?\p{P}+ */
                                   PASS(M_RUN, is_deepseek_cjk), /* [一-龥ࠀ-一가-퟿]+ */
                                   PASS(M_ONE, is_number),       /* \p{N} */
                               }},
};

size_t pretok_split(pretok_kind kind, const uint32_t *cpts, const uint16_t *flags, size_t n,
                    size_t *ends, size_t *scratch) {
    if (n == 0 || (unsigned)kind >= PRETOK_COUNT) {
        return 0;
    }
    const pt_text text = {.cpts = cpts, .flags = flags};
    const family *fam = &families[kind];

    /* Segments ping-pong between the two arrays; the last pass must write into ends. */
    size_t *bufs[2] = {ends, scratch};
    size_t cur = fam->n_passes % 2; /* so that after n_passes flips we land on bufs[0] */
    bufs[cur][0] = n;
    size_t n_segs = 1;
    for (size_t p = 0; p < fam->n_passes; p++) {
        const pass *ps = &fam->passes[p];
        seg_out out = {.ends = bufs[cur ^ 1], .n = 0};
        size_t start = 0;
        for (size_t s = 0; s < n_segs; s++) {
            size_t end = bufs[cur][s];
            if (ps->trailing_blanks) {
                split_trailing_blanks(&text, start, end, &out);
            } else {
                split_segment(&ps->m, &text, start, end, &out);
            }
            start = end;
        }
        n_segs = out.n;
        cur ^= 1;
    }
    return n_segs;
}
