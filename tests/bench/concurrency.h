/*
 * concurrency.h — what tests/bench/concurrency measures: the options, the facts about the machine
 * and the inputs, and the results of every run, shared by the measuring program (concurrency.c)
 * and the tables and JSON that report them (concurrency_report.c).
 *
 * Times are milliseconds, rates tokens per second. Every figure is kept per run; the report takes
 * medians, minima and maxima over the runs.
 */
#ifndef CORRAL_BENCH_CONCURRENCY_H
#define CORRAL_BENCH_CONCURRENCY_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum {
    CONC_MAX_STREAMS = 64,   /* largest N of --streams */
    CONC_MAX_NS = 16,        /* entries of --streams */
    CONC_MAX_REPS = 50,      /* -r */
    CONC_BG_STREAMS = 8,     /* background streams of case (b) */
    CONC_BURST_CLIENTS = 16, /* clients of the burst */
};

enum { CONC_PHASE_STREAMS = 1, CONC_PHASE_TTFT = 2, CONC_PHASE_BURST = 4 };

typedef struct conc_opts {
    int threads;         /* -t: corrald's and llama-server's compute threads */
    uint32_t n_tokens;   /* -n: tokens each stream generates */
    int reps;            /* -r */
    int ns[CONC_MAX_NS]; /* --streams */
    int n_ns;
    unsigned phases;   /* CONC_PHASE_* bits (--only) */
    const char *dir;   /* --dir: the inputs, and the run directory under it */
    const char *llama; /* --llama-server or $LLAMA_SERVER; NULL: none */
    bool keep, json;
} conc_opts;

/* The report's heading: what ran, where, on what. */
typedef struct conc_facts {
    char corrald[PATH_MAX];
    char version[32]; /* the daemon's Pong */
    uint32_t protocol;
    char cpu_features[256]; /* corrald --version */
    char kernel_path[32];   /* the engine's kernel table on this CPU (bench_kernel_path) */
    char uname[200];
    char base[PATH_MAX];    /* TinyLlama-1.1B shape, Q4_0: the streams and the realtime request */
    char cold[PATH_MAX];    /* the same shape in Q8_0: the model that loads cold */
    char adapter[PATH_MAX]; /* rank-16 LoRA for base: the variant */
    char llama_version[256];
    /* Prompt lengths as the daemon counted them (Done.prompt_tokens); 0 when not measured. */
    uint32_t stream_prompt_min, stream_prompt_max, realtime_prompt;
    const char *realtime_text;
    uint32_t realtime_tokens; /* its max_tokens */
    /* The 1-minute load average before the run (others' work) and after it (ours included). */
    double load_before, load_after;
} conc_facts;

/* One run of N streams, on either server. */
typedef struct conc_stream_run {
    double agg;                       /* all tokens / (first send to last Done) */
    double per_min, per_med, per_max; /* each stream's tokens / (its send to its Done) */
    double ttft_ms;                   /* median over the streams (corral only: first chunk) */
    uint64_t tokens;
    int short_streams; /* streams that ended before -n tokens */
} conc_stream_run;

typedef struct conc_streams {
    int n;    /* streams */
    int runs; /* of each server */
    conc_stream_run corral[CONC_MAX_REPS], llama[CONC_MAX_REPS];
} conc_streams;

/* The situations of the realtime request. */
typedef enum conc_case {
    CONC_IDLE = 0,    /* (a) */
    CONC_STREAMS = 1, /* (b) 8 background streams */
    CONC_LOAD = 2,    /* (c) another model loading cold */
    CONC_MERGE = 3,   /* (d) a variant merging for the first time */
    CONC_CASE_COUNT
} conc_case;

extern const char *const conc_case_names[CONC_CASE_COUNT]; /* "(a) idle daemon", ... */
extern const char *const conc_case_keys[CONC_CASE_COUNT];  /* JSON: "idle", ... */

/* What sent the realtime request in (c) and (d). */
typedef enum conc_trigger {
    CONC_TRIGGER_NONE = 0,    /* (a), (b) */
    CONC_TRIGGER_LOADING = 1, /* Status said LOADING */
    CONC_TRIGGER_BUSY = 2,    /* Status went unanswered (the daemon was busy with the load) */
    CONC_TRIGGER_LATE = 3,    /* Status already said RESIDENT: the load was over */
    CONC_TRIGGER_TIMEOUT = 4, /* 10 s without either */
    CONC_TRIGGER_COUNT
} conc_trigger;

extern const char *const conc_trigger_names[CONC_TRIGGER_COUNT];

typedef struct conc_ttft_run {
    double ttft_ms;  /* the realtime request: send to first chunk */
    double total_ms; /* send to Done */
    /* (b): every background stream was still generating when the realtime's first token came */
    bool overlapped;
    /* (c), (d): the other client's request ("background"), times after it was sent */
    double rt_sent_ms, rt_first_ms, bg_first_ms, bg_done_ms;
    double bg_load_ms;      /* its Done.timings.load_us */
    double bg_prefill_ms;   /* its Done.timings.prefill_us */
    uint64_t last_load_ms;  /* its model's Status after the run */
    uint64_t loads, merges; /* its model's Status counters, after minus before */
    conc_trigger how;
} conc_ttft_run;

typedef struct conc_burst_run {
    int ok;         /* requests that ended with a Done */
    uint64_t loads; /* ModelStatus.loads after minus before */
    double wall_ms; /* first send to last Done */
    double lat_med_ms, lat_max_ms;
    char error[512]; /* the first failure, "" when none */
} conc_burst_run;

typedef struct conc_results {
    /* The engine's own prefill rate on the streams' model (`corral bench -p 512`, same threads),
     * before and after the streams phase: the ceiling a batched decode step cannot beat (a step
     * of B streams is a B-token product, as a prefill chunk is). 0 when not measured. */
    double pp512[2];
    conc_streams streams[CONC_MAX_NS]; /* in the order of opts.ns */
    conc_ttft_run ttft[CONC_CASE_COUNT][CONC_MAX_REPS];
    int ttft_runs[CONC_CASE_COUNT];
    conc_burst_run burst[CONC_MAX_REPS];
    int burst_runs;
} conc_results;

/* Median (the mean of the middle two for an even count), minimum and maximum. */
typedef struct conc_spread {
    double med, lo, hi;
} conc_spread;

/* The spread of v[0..n) (at most CONC_MAX_REPS * CONC_MAX_STREAMS values); all 0 when n is 0. */
conc_spread conc_spread_of(const double *v, int n);

/* The tables (Markdown) and the JSON document of a finished run, to out. */
void conc_report_text(FILE *out, const conc_opts *o, const conc_facts *f, const conc_results *r);
void conc_report_json(FILE *out, const conc_opts *o, const conc_facts *f, const conc_results *r);

#endif /* CORRAL_BENCH_CONCURRENCY_H */
