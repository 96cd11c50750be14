// Head-only microbenchmark of patch 0003's small-batch matmul (`flashdesk head-cost`:
// app/bench/head_cost.py compiles and runs it):
// y = W x for a random Q8_0 W of K x M (the bundled target's tied head: 640 x 262144) held in the
// CPU_SMALLBATCH buffer, x of n = 1..nmax columns, through one or more CPU backend libraries
// loaded side by side in this process (an A/B of two builds). Each round visits every n in a
// random order and, for each n, every library back to back in a random order (drift on a shared
// VM hits them alike); a cell is the median of `reps` timed passes after one untimed one.
//   head_bench <threads> <rounds> <reps> <K> <M> <nmax> <libggml-cpu-*.so> [<libggml-cpu-*.so> ...]
// prints one JSON object: {threads, K, M, rounds, reps, builds: [{lib, median_ms[n], rounds_ms[n][round]}]}
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include "bench_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

struct Build {
    std::string path;
    ggml_backend_reg_t reg;
    ggml_backend_t backend;
    ggml_context * wctx;
    ggml_backend_buffer_t wbuf;
    ggml_tensor * W;
    std::vector<ggml_context *> gctx;
    std::vector<ggml_cgraph *> graphs;
    std::vector<ggml_backend_buffer_t> gbufs;
};

int main(int argc, char ** argv) {
    if (argc < 8) { fprintf(stderr, "usage: head_bench threads rounds reps K M nmax lib...\n"); return 2; }
    const int threads = atoi(argv[1]), rounds = atoi(argv[2]), reps = atoi(argv[3]);
    const int64_t K = atoll(argv[4]), M = atoll(argv[5]);
    const int NMAX = atoi(argv[6]);
    if (threads < 1 || rounds < 1 || reps < 1 || K <= 0 || K % 32 || M <= 0 || M % 8 || NMAX < 1) {
        fprintf(stderr, "head_bench: bad arguments (K a multiple of 32, M of 8)\n");
        return 2;
    }
    std::mt19937 rng(1);
    // random Q8_0 blocks: 2-byte f16 scale then 32 int8
    const size_t wbytes = (size_t) M * (K / 32) * 34;
    std::vector<uint8_t> wdata(wbytes);
    for (size_t b = 0; b < wbytes / 34; b++) {
        uint8_t * p = wdata.data() + b * 34;
        const uint16_t d = 0x211F;  // ~0.01
        memcpy(p, &d, 2);
        for (int j = 0; j < 32; j++) p[2 + j] = (uint8_t) (rng() & 0xFF);
    }
    std::vector<Build> builds;
    for (int a = 7; a < argc; a++) {
        Build b;
        b.path = argv[a];
        ggml_backend_dev_t dev = nullptr;
        b.backend = bench_load_backend(argv[a], threads, &dev);
        if (!b.backend) return 1;
        b.reg = ggml_backend_dev_backend_reg(dev);
        auto extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(b.reg, "ggml_backend_dev_get_extra_bufts");
        ggml_backend_buffer_type_t sb = nullptr;
        for (ggml_backend_buffer_type_t * p = extra(dev); p && *p; p++) {
            if (strcmp(ggml_backend_buft_name(*p), "CPU_SMALLBATCH") == 0) sb = *p;
        }
        if (!sb) { fprintf(stderr, "%s: no CPU_SMALLBATCH buffer type\n", argv[a]); return 1; }
        ggml_init_params ip = {ggml_tensor_overhead() * 4, nullptr, true};
        b.wctx = ggml_init(ip);
        b.W = ggml_new_tensor_2d(b.wctx, GGML_TYPE_Q8_0, K, M);
        b.wbuf = ggml_backend_alloc_ctx_tensors_from_buft(b.wctx, sb);
        ggml_backend_buffer_set_usage(b.wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        ggml_backend_tensor_set(b.W, wdata.data(), 0, wbytes);
        for (int n = 1; n <= NMAX; n++) {
            ggml_init_params gp = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
            ggml_context * g = ggml_init(gp);
            ggml_tensor * x = ggml_new_tensor_2d(g, GGML_TYPE_F32, K, n);
            ggml_tensor * y = ggml_mul_mat(g, b.W, x);
            ggml_cgraph * gr = ggml_new_graph(g);
            ggml_build_forward_expand(gr, y);
            ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(g, b.backend);
            std::vector<float> xv((size_t) K * n);
            for (auto & v : xv) v = (float) ((rng() % 2001) - 1000) / 1000.0f;
            ggml_backend_tensor_set(x, xv.data(), 0, xv.size() * sizeof(float));
            b.gctx.push_back(g);
            b.graphs.push_back(gr);
            b.gbufs.push_back(buf);
        }
        builds.push_back(b);
    }
    std::vector<std::string> paths;
    for (const Build & b : builds) paths.push_back(b.path);
    const auto ms = bench_time_cells(builds.size(), NMAX, rounds, reps, rng, [&](size_t bi, size_t c) {
        ggml_backend_graph_compute(builds[bi].backend, builds[bi].graphs[c]);
    });
    printf("{\"threads\": %d, \"K\": %lld, \"M\": %lld, \"rounds\": %d, \"reps\": %d, ", threads,
           (long long) K, (long long) M, rounds, reps);
    bench_print_builds(paths, ms);
    printf("}\n");
    return 0;
}
