"""Train a DFlash drafter for a GGUF target by self-distillation (`flashdesk distill`), and measure
how quantization changes its acceptance (`flashdesk quant-tau`)."""
