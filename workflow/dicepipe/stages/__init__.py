"""One module per pipeline stage (same name as its CLI subcommand and its rule file).
Each exposes `add_arguments(parser)` and `run(args, params) -> int`. The two RL stages
share theirs: rl.py is the stage, rl_infill.py and rl_e2e.py name it."""
