"""Block-diffusion language model on top of transformers' Qwen3: loading (`loading`), the
training layout and mask (`layout`, `masks`), the objective and its loss (`objective`,
`loss`), and decoding with a KV cache (`decode`, `kv_engine`, `sampling`). Heavy imports
(torch, transformers) happen when a submodule is imported, not here."""
