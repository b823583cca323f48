"""One module per pipeline stage (same name as its CLI subcommand and its rule file).
Each exposes `add_arguments(parser)` and `run(args, params) -> int`."""
