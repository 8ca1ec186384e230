// ggml's CPU MUL_MAT_ID at the host expert bench's shape (benches/host_experts.rs), with the
// tokens routed to other experts on every run, so that each run reads its experts' weights
// from memory as a model's decode does (each layer's experts are new to the caches).
// test-backend-ops' perf mode repeats one op on one routing instead: on a CPU whose last-level
// cache holds one op's experts (a Q4_0 or Q8_0 projection of 8 Qwen3-30B-A3B experts is
// 7-27 MB), it times them from that cache.
//
// Per run: the two cases tools/host_abba.sh reads from test-backend-ops (the fused gate/up,
// m = 2F, k = H; and down, m = H, k = F; each `b = false`: one f32 input row per token and
// expert), as one graph on ggml's CPU backend with a persistent thread pool. Routing: each
// token `k` distinct experts, `ROUTINGS` routings drawn up front and taken in turn.
// Weights as the bench makes them: f32/f16 values (byte - 127.5) / 2048, quantised blocks
// random codes under the scale 0.001 (MXFP4: scale byte 118).
//
// Build against a ggml build (tools/ggml_moe_cold.sh does it):
//   cc -O2 tools/ggml_moe_cold.c -I$GGML/include -L$GGML/build/src -lggml -lggml-base -lggml-cpu
// Run: ggml_moe_cold TYPE TOKENS THREADS [ROUTINGS [ITERS [WARMUP]]]
//   TYPE: f32, f16, q8_0, q4_0 or mxfp4. Prints one JSON line: the median, minimum and
//   maximum ms of the ITERS timed runs (of both ops).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"

enum { EXPERTS = 128, USED = 8, HIDDEN = 2048, FFN = 768 };

static uint64_t rng_state = 54;

static uint64_t next_random(void) {
    // splitmix64
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Fills a weight tensor as the bench fills its stored values.
static void fill(struct ggml_tensor *t) {
    size_t bytes = ggml_nbytes(t);
    uint8_t *p = t->data;
    for (size_t i = 0; i < bytes; i++) {
        p[i] = (uint8_t)next_random();
    }
    size_t values = (size_t)ggml_nelements(t);
    switch (t->type) {
    case GGML_TYPE_F32:
        for (size_t i = 0; i < values; i++) {
            ((float *)p)[i] = ((float)p[4 * i] - 127.5f) / 2048.0f;
        }
        break;
    case GGML_TYPE_F16:
        for (size_t i = 0; i < values; i++) {
            ((ggml_fp16_t *)p)[i] = ggml_fp32_to_fp16(((float)p[2 * i] - 127.5f) / 2048.0f);
        }
        break;
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0: {
        size_t block = ggml_type_size(t->type);
        ggml_fp16_t d = ggml_fp32_to_fp16(0.001f);
        for (size_t b = 0; b < bytes / block; b++) {
            memcpy(p + b * block, &d, sizeof d);
        }
        break;
    }
    case GGML_TYPE_MXFP4: {
        size_t block = ggml_type_size(t->type);
        for (size_t b = 0; b < bytes / block; b++) {
            p[b * block] = 118;
        }
        break;
    }
    default:
        break;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TYPE TOKENS THREADS [ROUTINGS [ITERS [WARMUP]]]\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    int tokens = atoi(argv[2]), threads = atoi(argv[3]);
    int routings = argc > 4 ? atoi(argv[4]) : 16;
    int iters = argc > 5 ? atoi(argv[5]) : 20;
    int warmup = argc > 6 ? atoi(argv[6]) : 3;
    enum ggml_type type;
    if (!strcmp(name, "f32")) type = GGML_TYPE_F32;
    else if (!strcmp(name, "f16")) type = GGML_TYPE_F16;
    else if (!strcmp(name, "q8_0")) type = GGML_TYPE_Q8_0;
    else if (!strcmp(name, "q4_0")) type = GGML_TYPE_Q4_0;
    else if (!strcmp(name, "mxfp4")) type = GGML_TYPE_MXFP4;
    else {
        fprintf(stderr, "unknown type %s\n", name);
        return 2;
    }
    if (tokens < 1 || threads < 1 || routings < 1 || iters < 1 || warmup < 0) {
        fprintf(stderr, "tokens, threads, routings and iters are at least 1\n");
        return 2;
    }
    ggml_cpu_init();

    size_t weights = ggml_row_size(type, HIDDEN) * 2 * FFN * EXPERTS + ggml_row_size(type, FFN) * HIDDEN * EXPERTS;
    size_t inputs = sizeof(float) * (size_t)tokens * USED * (HIDDEN + FFN + 2 * FFN + HIDDEN);
    struct ggml_init_params params = {
        .mem_size = weights + inputs + sizeof(int32_t) * tokens * USED + 16 * ggml_tensor_overhead() +
                    ggml_graph_overhead() + (1 << 20),
        .mem_buffer = NULL,
        .no_alloc = false,
    };
    struct ggml_context *ctx = ggml_init(params);
    if (!ctx) {
        fprintf(stderr, "cannot allocate %zu bytes\n", params.mem_size);
        return 1;
    }
    struct ggml_tensor *gate_up = ggml_new_tensor_3d(ctx, type, HIDDEN, 2 * FFN, EXPERTS);
    struct ggml_tensor *down = ggml_new_tensor_3d(ctx, type, FFN, HIDDEN, EXPERTS);
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, HIDDEN, USED, tokens);
    struct ggml_tensor *act = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, FFN, USED, tokens);
    struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, USED, tokens);
    fill(gate_up);
    fill(down);
    for (int64_t i = 0; i < ggml_nelements(x); i++) {
        ((float *)x->data)[i] = (float)(next_random() % 2001) / 1000.0f - 1.0f;
    }
    for (int64_t i = 0; i < ggml_nelements(act); i++) {
        ((float *)act->data)[i] = (float)(next_random() % 2001) / 1000.0f - 1.0f;
    }
    struct ggml_tensor *out_gate_up = ggml_mul_mat_id(ctx, gate_up, x, ids);
    struct ggml_tensor *out_down = ggml_mul_mat_id(ctx, down, act, ids);
    struct ggml_cgraph *graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out_gate_up);
    ggml_build_forward_expand(graph, out_down);

    // Each routing: every token's USED distinct experts.
    int32_t *route = malloc(sizeof(int32_t) * (size_t)routings * tokens * USED);
    for (int r = 0; r < routings; r++) {
        for (int t = 0; t < tokens; t++) {
            int32_t *row = route + ((size_t)r * tokens + t) * USED;
            for (int u = 0; u < USED; u++) {
                int32_t e;
                int fresh;
                do {
                    e = (int32_t)(next_random() % EXPERTS);
                    fresh = 1;
                    for (int v = 0; v < u; v++) fresh &= row[v] != e;
                } while (!fresh);
                row[u] = e;
            }
        }
    }

    struct ggml_threadpool_params pool_params = ggml_threadpool_params_default(threads);
    struct ggml_threadpool *pool = ggml_threadpool_new(&pool_params);
    struct ggml_cplan plan = ggml_graph_plan(graph, threads, pool);
    plan.work_data = plan.work_size ? malloc(plan.work_size) : NULL;
    double *ms = malloc(sizeof(double) * iters);
    for (int i = 0; i < warmup + iters; i++) {
        memcpy(ids->data, route + (size_t)(i % routings) * tokens * USED, sizeof(int32_t) * tokens * USED);
        double start = now_ms();
        if (ggml_graph_compute(graph, &plan) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "compute failed\n");
            return 1;
        }
        if (i >= warmup) ms[i - warmup] = now_ms() - start;
    }
    qsort(ms, iters, sizeof(double), by_value);
    printf("{\"case\":\"ggml_mul_mat_id_cold\",\"dtype\":\"%s\",\"tokens\":%d,\"threads\":%d,\"routings\":%d,"
           "\"iters\":%d,\"median_ms\":%f,\"min_ms\":%f,\"max_ms\":%f,\"weight_bytes\":%zu}\n",
           name, tokens, threads, routings, iters, ms[iters / 2], ms[0], ms[iters - 1], weights);
    ggml_threadpool_free(pool);
    free(plan.work_data);
    free(ms);
    free(route);
    ggml_free(ctx);
    return 0;
}
