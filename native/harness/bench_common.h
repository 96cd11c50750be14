// What the in-process kernel microbenchmarks (head_bench.cpp, attn_bench.cpp) share: loading a CPU
// backend library with its thread count, the interleaved timing of every (library, cell) pair, and
// the "builds" part of their JSON (app/bench/kernel_bench.py reads it).
#pragma once

#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

// the library's CPU device, its backend set to `threads`; nullptr (and a message) if it is not one
static ggml_backend_t bench_load_backend(const char * path, int threads, ggml_backend_dev_t * dev_out = nullptr) {
    ggml_backend_reg_t reg = ggml_backend_load(path);
    if (!reg) { fprintf(stderr, "cannot load %s\n", path); return nullptr; }
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    auto set_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (!backend || !set_threads) { fprintf(stderr, "%s: not a CPU backend\n", path); return nullptr; }
    set_threads(backend, threads);
    if (dev_out) *dev_out = dev;
    return backend;
}

// ms[library][cell][round]: each round visits every cell in a random order and, for each cell, every
// library back to back in a random order (drift on a shared VM hits them alike); a round's time is
// the median of `reps` timed runs of `run(library, cell)` after one untimed one
static std::vector<std::vector<std::vector<double>>> bench_time_cells(size_t nlibs, size_t ncells, int rounds, int reps,
                                                                      std::mt19937 & rng,
                                                                      const std::function<void(size_t, size_t)> & run) {
    std::vector<std::vector<std::vector<double>>> ms(nlibs, std::vector<std::vector<double>>(ncells));
    std::vector<size_t> order(ncells), libs(nlibs);
    for (size_t i = 0; i < ncells; i++) order[i] = i;
    for (size_t i = 0; i < nlibs; i++) libs[i] = i;
    for (int r = 0; r < rounds; r++) {
        std::shuffle(order.begin(), order.end(), rng);
        for (size_t c : order) {
            std::shuffle(libs.begin(), libs.end(), rng);
            for (size_t li : libs) {
                run(li, c);  // warm
                std::vector<double> t;
                for (int i = 0; i < reps; i++) {
                    auto t0 = std::chrono::steady_clock::now();
                    run(li, c);
                    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                }
                std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
                ms[li][c].push_back(t[reps / 2]);
            }
        }
    }
    return ms;
}

// "builds": [{lib, median_ms[cell], rounds_ms[cell][round]}]
static void bench_print_builds(const std::vector<std::string> & paths, const std::vector<std::vector<std::vector<double>>> & ms) {
    printf("\"builds\": [");
    for (size_t li = 0; li < paths.size(); li++) {
        printf("%s{\"lib\": \"%s\", \"median_ms\": [", li ? ", " : "", paths[li].c_str());
        for (size_t c = 0; c < ms[li].size(); c++) {
            std::vector<double> v = ms[li][c];
            std::sort(v.begin(), v.end());
            printf("%s%.4f", c ? ", " : "", v[v.size() / 2]);
        }
        printf("], \"rounds_ms\": [");
        for (size_t c = 0; c < ms[li].size(); c++) {
            printf("%s[", c ? ", " : "");
            for (size_t i = 0; i < ms[li][c].size(); i++) printf("%s%.4f", i ? ", " : "", ms[li][c][i]);
            printf("]");
        }
        printf("]}");
    }
    printf("]");
}
