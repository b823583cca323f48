"""`dicepipe cache`: check every entry of the build cache and the resume stores against the
hash written with it, and remove the damaged or orphaned ones.

    dicepipe cache verify     # a summary; exit 1 when anything is damaged or orphaned
    dicepipe cache prune      # the same check, then what it found removed

Not a pipeline stage: the stages check each entry before they use it and rebuild a damaged
one themselves (kernelharness/compilation/entries.py); this is the whole cache at once, for a look after
a crash or a full disk. A damaged row is dropped from its resume file (measured again by the
next run that needs it); a removed build is made again when next needed.
"""

from __future__ import annotations

from pathlib import Path

RESUME_DIR = Path(".cache/dicepipe/resume")


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["verify", "prune"],
                        help="verify: check and summarise; prune: check, then remove what "
                             "is damaged or orphaned")
    parser.add_argument("--cache-dir", default=None,
                        help="build cache (default: harness.run.cache_dir of params.yaml)")
    parser.add_argument("--resume-dir", default=str(RESUME_DIR),
                        help=f"resume stores of verify and evaluate (default: {RESUME_DIR})")


def run(args, params: dict) -> int:
    from kernelharness.cache_check import (
        check_build_cache,
        check_resume_stores,
        prune_build_cache,
        prune_resume_stores,
    )

    cache = Path(args.cache_dir or params["harness"]["run"]["cache_dir"]).resolve()
    resume = Path(args.resume_dir).resolve()
    builds, rows = check_build_cache(cache), check_resume_stores(resume)
    for line in builds.lines("build cache") + rows.lines("resume stores", unit="rows"):
        print(line)
    found = len(builds.problems) + len(rows.problems)
    if args.action == "verify":
        if found:
            print(f"{found} damaged or orphaned: `dicepipe cache prune` removes them (a build "
                  "is made again when next needed, a row measured again)")
        else:
            print("no entry is damaged or orphaned")
        return 1 if found else 0
    prune_build_cache(cache, builds)
    dropped = prune_resume_stores(rows)
    print(f"removed {len(builds.findings)} build cache entries "
          f"({builds.count('damaged')} damaged, {builds.count('orphaned')} orphaned, "
          f"{builds.count('unhashed')} made before entries carried a hash), "
          f"{dropped} damaged rows and {rows.count('orphaned')} orphaned files of the "
          "resume stores")
    for name in rows.busy:
        print(f"not pruned, another run is writing it: {name} (run prune again after it)")
    return 0
