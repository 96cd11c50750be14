"""The DFlash engine: model loading, the decode loop, sampling, stats. Knows nothing of Qt."""
