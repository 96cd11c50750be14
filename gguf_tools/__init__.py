"""Tools that make or read GGUF files: inspect, pair-check, convert, quantize, synth, distill."""
