"""dicepipe: the DICE recipe (diffusion language models that write CUDA kernels) as a
reproducible pipeline. Stages live in `dicepipe.stages`, one module per stage."""

__version__ = "0.1.0"
