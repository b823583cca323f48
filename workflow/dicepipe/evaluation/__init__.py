"""KernelBench evaluation: generation with any model, scoring through the harness, the
metrics of the paper's Table 1 (and the harness's stricter reading of them), baselines."""
