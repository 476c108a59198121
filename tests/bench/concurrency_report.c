/*
 * concurrency_report.c — the tables and the JSON of tests/bench/concurrency (see concurrency.h).
 *
 * Every figure is the median over the runs with the minimum and maximum beside it; per-stream
 * columns are medians over the runs of each run's minimum, median and maximum stream; the ratio
 * to llama-server is taken within each pair of runs (corral, then llama-server), then its median.
 */
#include "concurrency.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "benchutil.h"

const char *const conc_case_names[CONC_CASE_COUNT] = {"(a) idle daemon", "(b) 8 background streams",
                                                      "(c) another model loading (cold)",
                                                      "(d) a LoRA variant merging (first use)"};
const char *const conc_case_keys[CONC_CASE_COUNT] = {"idle", "background_streams", "cold_load",
                                                     "first_merge"};
const char *const conc_trigger_names[CONC_TRIGGER_COUNT] = {
    "", "status LOADING", "status unanswered", "load already over", "no sign of a load"};

conc_spread conc_spread_of(const double *v, int n) {
    conc_spread s = {0, 0, 0};
    if (n <= 0) return s;
    static _Thread_local double sorted[CONC_MAX_REPS * CONC_MAX_STREAMS];
    if (n > (int)(sizeof sorted / sizeof *sorted)) n = (int)(sizeof sorted / sizeof *sorted);
    memcpy(sorted, v, (size_t)n * sizeof *v);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
    s.med = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    s.lo = sorted[0];
    s.hi = sorted[n - 1];
    return s;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static uint64_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

static double mib(const char *path) {
    return file_size(path) / 1048576.0;
}

/* "median (min–max)" with `decimals` digits. */
static const char *fmt_spread(char *buf, size_t size, conc_spread s, int decimals) {
    snprintf(buf, size, "%.*f (%.*f–%.*f)", decimals, s.med, decimals, s.lo, decimals, s.hi);
    return buf;
}

/* The series of one field over runs. */
#define SERIES(dst, runs, n, field)                                    \
    do {                                                               \
        for (int i_ = 0; i_ < (n); i_++) (dst)[i_] = (runs)[i_].field; \
    } while (0)

static void print_facts(FILE *out, const conc_opts *o, const conc_facts *f) {
    fprintf(out, "corral concurrency benchmark\n");
    fprintf(out, "  corrald %s (protocol %u): %s, threads %d\n", f->version, f->protocol,
            f->corrald, o->threads);
    fprintf(out, "  cpu: %s; kernel path %s (the engine's choice on this CPU); %s\n",
            f->cpu_features, f->kernel_path, f->uname);
    fprintf(out,
            "  models: %s %.0f MiB (streams, realtime); %s %.0f MiB (cold load, burst); %s %.0f "
            "MiB (rank-16 LoRA of the first: the variant)\n",
            base_name(f->base), mib(f->base), base_name(f->cold), mib(f->cold),
            base_name(f->adapter), mib(f->adapter));
    if (f->stream_prompt_max)
        fprintf(out, "  stream prompts: %u–%u tokens\n", f->stream_prompt_min,
                f->stream_prompt_max);
    if (f->realtime_prompt) fprintf(out, "  realtime prompt: %u tokens\n", f->realtime_prompt);
    if (o->llama) fprintf(out, "  llama-server: %s (%s)\n", o->llama, f->llama_version);
    fprintf(out,
            "  load average (1 min): %.2f before the run, %.2f after it (its own work "
            "included)\n",
            f->load_before, f->load_after);
    fprintf(out, "  %d runs of each measurement; figures are medians (min–max) over the runs\n\n",
            o->reps);
}

static void print_streams(FILE *out, const conc_opts *o, const conc_results *res) {
    const bool llama = o->llama != NULL;
    fprintf(out,
            "Streams: N clients at once, each greedy -n %u tokens from a prompt of its own "
            "(TinyLlama Q4_0)\n",
            o->n_tokens);
    const double pp = (res->pp512[0] + res->pp512[1]) / 2;
    fprintf(out,
            "| N | corral tok/s (aggregate) | of pp512 | per stream tok/s, min / median / max | "
            "TTFT ms (median stream) |");
    if (llama)
        fprintf(out,
                " llama-server tok/s (aggregate) | llama-server per stream, min / median / max "
                "| corral / llama-server |");
    fprintf(out, "\n|---|---|---|---|---|%s\n", llama ? "---|---|---|" : "");
    int short_streams = 0;
    for (int k = 0; k < o->n_ns; k++) {
        const conc_streams *sr = &res->streams[k];
        if (sr->runs == 0) continue;
        double v[CONC_MAX_REPS], w[CONC_MAX_REPS], x[CONC_MAX_REPS];
        char s1[64], s2[64];
        SERIES(v, sr->corral, sr->runs, agg);
        fprintf(out, "| %d | %s |", sr->n,
                fmt_spread(s1, sizeof s1, conc_spread_of(v, sr->runs), 1));
        if (pp > 0)
            fprintf(out, " %.0f %% |", 100 * conc_spread_of(v, sr->runs).med / pp);
        else
            fprintf(out, " – |");
        SERIES(v, sr->corral, sr->runs, per_min);
        SERIES(w, sr->corral, sr->runs, per_med);
        SERIES(x, sr->corral, sr->runs, per_max);
        fprintf(out, " %.1f / %.1f / %.1f |", conc_spread_of(v, sr->runs).med,
                conc_spread_of(w, sr->runs).med, conc_spread_of(x, sr->runs).med);
        SERIES(v, sr->corral, sr->runs, ttft_ms);
        fprintf(out, " %s |", fmt_spread(s2, sizeof s2, conc_spread_of(v, sr->runs), 0));
        for (int r = 0; r < sr->runs; r++) short_streams += sr->corral[r].short_streams;
        if (llama) {
            SERIES(v, sr->llama, sr->runs, agg);
            fprintf(out, " %s |", fmt_spread(s1, sizeof s1, conc_spread_of(v, sr->runs), 1));
            SERIES(v, sr->llama, sr->runs, per_min);
            SERIES(w, sr->llama, sr->runs, per_med);
            SERIES(x, sr->llama, sr->runs, per_max);
            fprintf(out, " %.1f / %.1f / %.1f |", conc_spread_of(v, sr->runs).med,
                    conc_spread_of(w, sr->runs).med, conc_spread_of(x, sr->runs).med);
            for (int r = 0; r < sr->runs; r++) v[r] = sr->corral[r].agg / sr->llama[r].agg;
            fprintf(out, " %s |", fmt_spread(s2, sizeof s2, conc_spread_of(v, sr->runs), 2));
        }
        fputc('\n', out);
    }
    fprintf(
        out,
        "aggregate = all streams' tokens / (first send to last Done); per stream = its tokens / "
        "(its send to its Done); per-stream columns are medians over the runs of each run's "
        "min, median and max; of pp512 = the median aggregate against the mean of `corral bench "
        "-p 512` on the same model and threads before (%.1f tok/s) and after (%.1f) the streams",
        res->pp512[0], res->pp512[1]);
    if (llama)
        fprintf(out, "; corral / llama-server = the ratio of aggregates within each pair of runs "
                     "(corral then llama-server, one llama-server per N with -np N)");
    fprintf(out, "\n");
    if (short_streams)
        fprintf(out,
                "note: %d corral streams ended before %u tokens (end of generation); the rates "
                "count the tokens they did generate\n",
                short_streams, o->n_tokens);
    fprintf(out, "\n");
}

static void print_ttft(FILE *out, const conc_facts *f, const conc_results *res) {
    fprintf(out,
            "Realtime request: time to first token (priority realtime, \"%s\", max_tokens %u, on "
            "the TinyLlama Q4_0 model)\n",
            f->realtime_text, f->realtime_tokens);
    fprintf(out, "| situation | TTFT ms | × idle | realtime Done ms | background work ms |\n");
    fprintf(out, "|---|---|---|---|---|\n");
    double v[CONC_MAX_REPS];
    const int n_idle = res->ttft_runs[CONC_IDLE];
    SERIES(v, res->ttft[CONC_IDLE], n_idle, ttft_ms);
    const double idle = n_idle ? conc_spread_of(v, n_idle).med : 0;
    for (int c = 0; c < CONC_CASE_COUNT; c++) {
        const int n = res->ttft_runs[c];
        if (n == 0) continue;
        char s1[64], s2[64], s3[64];
        SERIES(v, res->ttft[c], n, ttft_ms);
        const conc_spread t = conc_spread_of(v, n);
        fprintf(out, "| %s | %s |", conc_case_names[c], fmt_spread(s1, sizeof s1, t, 1));
        if (idle > 0 && c != CONC_IDLE)
            fprintf(out, " %.2f (%.2f–%.2f) |", t.med / idle, t.lo / idle, t.hi / idle);
        else
            fprintf(out, " %s |", c == CONC_IDLE ? "1" : "–");
        SERIES(v, res->ttft[c], n, total_ms);
        fprintf(out, " %s |", fmt_spread(s2, sizeof s2, conc_spread_of(v, n), 1));
        if (c >= CONC_LOAD) {
            SERIES(v, res->ttft[c], n, bg_load_ms);
            fprintf(out, " %s %s |", c == CONC_LOAD ? "load" : "merge + load",
                    fmt_spread(s3, sizeof s3, conc_spread_of(v, n), 0));
        } else if (c == CONC_STREAMS) {
            int overlapped = 0;
            for (int r = 0; r < n; r++) overlapped += res->ttft[c][r].overlapped;
            fprintf(out, " %d streams generating through it in %d of %d runs |", CONC_BG_STREAMS,
                    overlapped, n);
        } else {
            fprintf(out, " – |");
        }
        fputc('\n', out);
    }
    if (res->ttft_runs[CONC_LOAD] + res->ttft_runs[CONC_MERGE] == 0) {
        fprintf(out, "\n");
        return;
    }
    fprintf(out, "\nThe runs of (c) and (d), in ms after the other client's request was sent\n");
    fprintf(out,
            "| situation | run | realtime sent at (on) | its first token at | the other request: "
            "load (Done.timings) | its prefill | its first token at | loads | merges |\n");
    fprintf(out, "|---|---|---|---|---|---|---|---|---|\n");
    int before_load[CONC_CASE_COUNT] = {0}, before_first[CONC_CASE_COUNT] = {0};
    for (int c = CONC_LOAD; c < CONC_CASE_COUNT; c++)
        for (int r = 0; r < res->ttft_runs[c]; r++) {
            const conc_ttft_run *run = &res->ttft[c][r];
            fprintf(out, "| %.3s | %d | %.0f (%s) | %.0f | %.0f | %.0f | %.0f | +%llu | +%llu |\n",
                    conc_case_names[c], r + 1, run->rt_sent_ms, conc_trigger_names[run->how],
                    run->rt_first_ms, run->bg_load_ms, run->bg_prefill_ms, run->bg_first_ms,
                    (unsigned long long)run->loads, (unsigned long long)run->merges);
            before_load[c] += run->rt_first_ms < run->bg_load_ms;
            before_first[c] += run->rt_first_ms < run->bg_first_ms;
        }
    for (int c = CONC_LOAD; c < CONC_CASE_COUNT; c++)
        if (res->ttft_runs[c])
            fprintf(out,
                    "%.3s: the realtime request's first token came before the other request's %s "
                    "was over in %d of %d runs, before that request's first token in %d\n",
                    conc_case_names[c], c == CONC_LOAD ? "load" : "merge and load", before_load[c],
                    res->ttft_runs[c], before_first[c]);
    fprintf(out, "\n");
}

static void print_burst(FILE *out, const conc_results *res) {
    if (res->burst_runs == 0) return;
    fprintf(out,
            "Burst: %d clients ask for the unloaded Q8_0 model at once (its file and images "
            "dropped from the page cache)\n",
            CONC_BURST_CLIENTS);
    fprintf(out,
            "| run | loads started | succeeded | first send to last Done ms | latency median / max "
            "ms |\n|---|---|---|---|---|\n");
    for (int r = 0; r < res->burst_runs; r++) {
        const conc_burst_run *run = &res->burst[r];
        fprintf(out, "| %d | %llu | %d of %d | %.0f | %.0f / %.0f |\n", r + 1,
                (unsigned long long)run->loads, run->ok, CONC_BURST_CLIENTS, run->wall_ms,
                run->lat_med_ms, run->lat_max_ms);
    }
    for (int r = 0; r < res->burst_runs; r++)
        if (res->burst[r].error[0])
            fprintf(out, "run %d, first failure: %s\n", r + 1, res->burst[r].error);
    fprintf(out, "loads started = ModelStatus.loads after the burst minus before\n");
}

static void json_str(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(out, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(out, "\\u%04x", *s);
        else
            fputc(*s, out);
    }
    fputc('"', out);
}

static void json_spread(FILE *out, const char *key, const double *v, int n) {
    const conc_spread s = conc_spread_of(v, n);
    fprintf(out, "\"%s\": %.3f, \"%s_min\": %.3f, \"%s_max\": %.3f", key, s.med, key, s.lo, key,
            s.hi);
}

void conc_report_json(FILE *out, const conc_opts *o, const conc_facts *f, const conc_results *res) {
    fprintf(out, "{\n  \"corrald\": ");
    json_str(out, f->corrald);
    fprintf(out, ", \"version\": ");
    json_str(out, f->version);
    fprintf(out, ", \"protocol\": %u, \"threads\": %d,\n  \"cpu_features\": ", f->protocol,
            o->threads);
    json_str(out, f->cpu_features);
    fprintf(out, ", \"kernel_path\": ");
    json_str(out, f->kernel_path);
    fprintf(out, ", \"uname\": ");
    json_str(out, f->uname);
    fprintf(out, ", \"load_before\": %.2f, \"load_after\": %.2f", f->load_before, f->load_after);
    fprintf(out, ",\n  \"models\": {\"base\": ");
    json_str(out, f->base);
    fprintf(out, ", \"base_bytes\": %llu, \"cold\": ", (unsigned long long)file_size(f->base));
    json_str(out, f->cold);
    fprintf(out, ", \"cold_bytes\": %llu, \"adapter\": ", (unsigned long long)file_size(f->cold));
    json_str(out, f->adapter);
    fprintf(out, ", \"adapter_bytes\": %llu},\n  \"llama_server\": ",
            (unsigned long long)file_size(f->adapter));
    if (o->llama) {
        json_str(out, o->llama);
        fprintf(out, ", \"llama_server_version\": ");
        json_str(out, f->llama_version);
    } else {
        fprintf(out, "null");
    }
    fprintf(out,
            ",\n  \"tokens\": %u, \"runs\": %d, \"stream_prompt_tokens_min\": %u, "
            "\"stream_prompt_tokens_max\": %u, \"realtime_prompt_tokens\": %u,\n  "
            "\"pp512_tok_s_before\": %.3f, \"pp512_tok_s_after\": %.3f,\n  \"streams\": [",
            o->n_tokens, o->reps, f->stream_prompt_min, f->stream_prompt_max, f->realtime_prompt,
            res->pp512[0], res->pp512[1]);
    double v[CONC_MAX_REPS];
    bool first = true;
    for (int k = 0; k < o->n_ns; k++) {
        const conc_streams *sr = &res->streams[k];
        if (sr->runs == 0) continue;
        const int n = sr->runs;
        fprintf(out, "%s\n    {\"n\": %d, ", first ? "" : ",", sr->n);
        first = false;
        SERIES(v, sr->corral, n, agg);
        json_spread(out, "tok_s", v, n);
        fprintf(out, ", ");
        SERIES(v, sr->corral, n, per_min);
        fprintf(out, "\"stream_tok_s_min\": %.3f, ", conc_spread_of(v, n).med);
        SERIES(v, sr->corral, n, per_med);
        fprintf(out, "\"stream_tok_s_median\": %.3f, ", conc_spread_of(v, n).med);
        SERIES(v, sr->corral, n, per_max);
        fprintf(out, "\"stream_tok_s_max\": %.3f, ", conc_spread_of(v, n).med);
        SERIES(v, sr->corral, n, ttft_ms);
        json_spread(out, "ttft_ms", v, n);
        int short_streams = 0;
        for (int r = 0; r < n; r++) short_streams += sr->corral[r].short_streams;
        fprintf(out, ", \"short_streams\": %d", short_streams);
        if (o->llama) {
            fprintf(out, ", ");
            SERIES(v, sr->llama, n, agg);
            json_spread(out, "llama_tok_s", v, n);
            SERIES(v, sr->llama, n, per_med);
            fprintf(out, ", \"llama_stream_tok_s_median\": %.3f, ", conc_spread_of(v, n).med);
            for (int r = 0; r < n; r++) v[r] = sr->corral[r].agg / sr->llama[r].agg;
            json_spread(out, "ratio", v, n);
        }
        fprintf(out, "}");
    }
    fprintf(out, "\n  ],\n  \"ttft\": {");
    const int n_idle = res->ttft_runs[CONC_IDLE];
    SERIES(v, res->ttft[CONC_IDLE], n_idle, ttft_ms);
    const double idle = n_idle ? conc_spread_of(v, n_idle).med : 0;
    first = true;
    for (int c = 0; c < CONC_CASE_COUNT; c++) {
        const int n = res->ttft_runs[c];
        if (n == 0) continue;
        fprintf(out, "%s\n    \"%s\": {", first ? "" : ",", conc_case_keys[c]);
        first = false;
        SERIES(v, res->ttft[c], n, ttft_ms);
        json_spread(out, "ttft_ms", v, n);
        fprintf(out, ", \"ratio_to_idle\": %.3f, ", idle > 0 ? conc_spread_of(v, n).med / idle : 0);
        SERIES(v, res->ttft[c], n, total_ms);
        json_spread(out, "total_ms", v, n);
        if (c == CONC_STREAMS) {
            int overlapped = 0;
            for (int r = 0; r < n; r++) overlapped += res->ttft[c][r].overlapped;
            fprintf(out, ", \"overlapped_runs\": %d", overlapped);
        }
        if (c >= CONC_LOAD) {
            fprintf(out, ", \"runs\": [");
            for (int r = 0; r < n; r++) {
                const conc_ttft_run *run = &res->ttft[c][r];
                fprintf(out,
                        "%s{\"ttft_ms\": %.3f, \"rt_sent_ms\": %.3f, \"rt_first_ms\": %.3f, "
                        "\"bg_first_ms\": %.3f, \"bg_done_ms\": %.3f, \"bg_load_ms\": %.3f, "
                        "\"bg_prefill_ms\": %.3f, \"last_load_ms\": %llu, \"loads\": %llu, "
                        "\"merges\": %llu, \"trigger\": ",
                        r ? ", " : "", run->ttft_ms, run->rt_sent_ms, run->rt_first_ms,
                        run->bg_first_ms, run->bg_done_ms, run->bg_load_ms, run->bg_prefill_ms,
                        (unsigned long long)run->last_load_ms, (unsigned long long)run->loads,
                        (unsigned long long)run->merges);
                json_str(out, conc_trigger_names[run->how]);
                fprintf(out, "}");
            }
            fprintf(out, "]");
        }
        fprintf(out, "}");
    }
    fprintf(out, "\n  },\n  \"burst\": [");
    for (int r = 0; r < res->burst_runs; r++) {
        const conc_burst_run *run = &res->burst[r];
        fprintf(out,
                "%s\n    {\"clients\": %d, \"succeeded\": %d, \"loads\": %llu, \"wall_ms\": %.3f, "
                "\"latency_ms_median\": %.3f, \"latency_ms_max\": %.3f, \"error\": ",
                r ? "," : "", CONC_BURST_CLIENTS, run->ok, (unsigned long long)run->loads,
                run->wall_ms, run->lat_med_ms, run->lat_max_ms);
        json_str(out, run->error);
        fprintf(out, "}");
    }
    fprintf(out, "\n  ]\n}\n");
}

void conc_report_text(FILE *out, const conc_opts *o, const conc_facts *f, const conc_results *res) {
    print_facts(out, o, f);
    if (o->phases & CONC_PHASE_STREAMS) print_streams(out, o, res);
    if (o->phases & CONC_PHASE_TTFT) print_ttft(out, f, res);
    if (o->phases & CONC_PHASE_BURST) print_burst(out, res);
}
