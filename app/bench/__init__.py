"""Benchmarks: the bench runner (plain vs DFlash over prompt files), verify cost, prompt sets, plots."""
