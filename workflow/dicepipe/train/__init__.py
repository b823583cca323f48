"""Training loops and their shared parts: data plans, checkpoints, metrics, optimizers and
parallelism (applied from outside the model). `sft` is the supervised stage; the RL stages
reuse the rest together with dicepipe.model's layout, loss and decoding."""
