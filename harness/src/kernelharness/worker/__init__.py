"""What runs inside a sandboxed worker process (`python -m kernelharness.worker.main`).

  main         the entry point of every role (extract, build, device); puts up the sandbox
  sandbox      the isolation a worker applies to itself at start (and the scrubbed
               environment the host starts it with)
  loader       KernelBench-format files executed with `load_inline` intercepted
  extract      what a candidate will build, found without building (extractor role)
  extensions   a device worker's `load_inline`: from the cache, or built by the host
  device_job   one job on a device: load both programs, check, time, check again
  trials       the strict correctness trials; kb_trials, KernelBench's own
  correctness  inputs and their variants, output comparison, the memory checks
  measure      the timing phase: input slots, output checks, repeats
  timing       reference and candidate timed interleaved on rotated inputs
  guards       run-time tamper checks (patched functions, new threads)

Nothing here imports the host's machinery (session, orchestrator, pools, workerproc,
results, rows); from harness/ a worker uses only the modules both sides share: protocol
(its channel), hygiene (its memory report) and stats (the repeat rule). The builder role
runs compilation/.
"""
