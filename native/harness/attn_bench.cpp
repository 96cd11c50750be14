// Attention-only microbenchmark of patch 0005's small-batch flash attention (`flashdesk attn-cost`:
// app/bench/attn_cost.py compiles and runs it through app/bench/kernel_bench.py):
// one GGML_OP_FLASH_ATTN_EXT of n query rows per head over a cache of kv cells (F16 K and V, a causal
// mask over the last n cells, as a verify of n tokens reads it), for every (kv, n) cell, through one or
// more CPU backend libraries loaded side by side in this process (an A/B of two builds). Each round
// visits every cell in a random order and, for each cell, every library back to back in a random
// order; a round's time is the median of `reps` timed passes after one untimed one.
//   attn_bench <threads> <rounds> <reps> <head_dim> <heads> <kv_heads> <kv,kv,...> <n,n,...> <libggml-cpu-*.so>...
// prints one JSON object: {threads, rounds, reps, head_dim, heads, kv_heads, cells: ["<kv>x<n>"],
//                          builds: [{lib, median_ms[cell], rounds_ms[cell][round]}]}
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include "bench_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

struct Cell {
    int64_t kv, n;
};

struct Build {
    std::string path;
    ggml_backend_t backend;
    std::vector<ggml_cgraph *> graphs;  // one per cell
    std::vector<ggml_context *> ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
};

static std::vector<int64_t> parse_list(const char * s) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(atoll(item.c_str()));
    return out;
}

static float uniform(std::mt19937 & rng) { return (float) ((int) (rng() % 2001) - 1000) / 1000.0f; }

int main(int argc, char ** argv) {
    if (argc < 10) {
        fprintf(stderr, "usage: attn_bench threads rounds reps head_dim heads kv_heads kv,.. n,.. lib...\n");
        return 2;
    }
    const int threads = atoi(argv[1]), rounds = atoi(argv[2]), reps = atoi(argv[3]);
    const int64_t D = atoll(argv[4]), H = atoll(argv[5]), HKV = atoll(argv[6]);
    const std::vector<int64_t> kvs = parse_list(argv[7]), ns = parse_list(argv[8]);
    if (threads < 1 || rounds < 1 || reps < 1 || D <= 0 || HKV <= 0 || H % HKV || kvs.empty() || ns.empty()) {
        fprintf(stderr, "attn_bench: bad arguments (heads a multiple of kv_heads)\n");
        return 2;
    }
    std::vector<Cell> cells;
    for (int64_t kv : kvs) {
        for (int64_t n : ns) {
            if (kv < n || n < 1) { fprintf(stderr, "attn_bench: bad cell %lld x %lld\n", (long long) kv, (long long) n); return 2; }
            cells.push_back({kv, n});
        }
    }
    std::mt19937 rng(1);
    std::vector<Build> builds;
    for (int a = 9; a < argc; a++) {
        Build b;
        b.path = argv[a];
        b.backend = bench_load_backend(argv[a], threads);
        if (!b.backend) return 1;
        for (const Cell & c : cells) {
            ggml_init_params gp = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
            ggml_context * g = ggml_init(gp);
            ggml_tensor * q = ggml_new_tensor_4d(g, GGML_TYPE_F32, D, c.n, H, 1);
            ggml_tensor * k = ggml_new_tensor_4d(g, GGML_TYPE_F16, D, c.kv, HKV, 1);
            ggml_tensor * v = ggml_new_tensor_4d(g, GGML_TYPE_F16, D, c.kv, HKV, 1);
            ggml_tensor * m = ggml_new_tensor_4d(g, GGML_TYPE_F16, c.kv, c.n, 1, 1);
            ggml_tensor * o = ggml_flash_attn_ext(g, q, k, v, m, 1.0f / sqrtf((float) D), 0.0f, 0.0f);
            ggml_cgraph * gr = ggml_new_graph(g);
            ggml_build_forward_expand(gr, o);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(g, b.backend);
            std::vector<float> qv((size_t) D * c.n * H);
            for (float & x : qv) x = uniform(rng);
            ggml_backend_tensor_set(q, qv.data(), 0, qv.size() * sizeof(float));
            std::vector<ggml_fp16_t> kvv((size_t) D * c.kv * HKV);
            for (ggml_tensor * t : {k, v}) {
                for (ggml_fp16_t & x : kvv) x = ggml_fp32_to_fp16(uniform(rng));
                ggml_backend_tensor_set(t, kvv.data(), 0, kvv.size() * sizeof(ggml_fp16_t));
            }
            // row r (the r-th of the n tokens) sees the cells up to its own: kv - n + r
            std::vector<ggml_fp16_t> mv((size_t) c.kv * c.n, ggml_fp32_to_fp16(0.0f));
            for (int64_t r = 0; r < c.n; r++) {
                for (int64_t j = c.kv - c.n + r + 1; j < c.kv; j++) mv[(size_t) r * c.kv + j] = ggml_fp32_to_fp16(-INFINITY);
            }
            ggml_backend_tensor_set(m, mv.data(), 0, mv.size() * sizeof(ggml_fp16_t));
            b.ctxs.push_back(g);
            b.graphs.push_back(gr);
            b.bufs.push_back(buf);
        }
        builds.push_back(b);
    }
    std::vector<std::string> paths;
    for (const Build & b : builds) paths.push_back(b.path);
    const auto ms = bench_time_cells(builds.size(), cells.size(), rounds, reps, rng, [&](size_t bi, size_t c) {
        ggml_backend_graph_compute(builds[bi].backend, builds[bi].graphs[c]);
    });
    printf("{\"threads\": %d, \"rounds\": %d, \"reps\": %d, \"head_dim\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"cells\": [",
           threads, rounds, reps, (long long) D, (long long) H, (long long) HKV);
    for (size_t c = 0; c < cells.size(); c++) printf("%s\"%lldx%lld\"", c ? ", " : "", (long long) cells[c].kv, (long long) cells[c].n);
    printf("], ");
    bench_print_builds(paths, ms);
    printf("}\n");
    return 0;
}
