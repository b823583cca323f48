"""The build subsystem: a candidate's `load_inline` extensions compiled into the cache.

  buildspec      what one `load_inline` call builds, its content key (sources, flags,
                 toolchain) and where the build lives in the content-addressed cache
  builder        one build, in a builder worker (role `build` of harness/worker/main.py)
  compile_steps  the steps of one build, run without ninja, each in a CPU slot shared by
                 every builder
  nvcc_split     one nvcc run phase by phase, its host pass against a precompiled header

The host decides what to build (pools.BuildService: each key once) and device workers
import what was built (worker/extensions.py); both read the cache through buildspec.
From harness/ a build reads only gpus.py (which GPUs' architecture is the target).
"""
