"""Why do two runs differ? Compare what produced them: config keys, code (commit, dirty flag,
diff hash, user modules), packages (only the versions that differ), machine and data (per
source, per split).

    python compare.py runs/<run_a> runs/<run_b>
    python compare.py checkpoints/<run_a>/best.pt checkpoints/<run_b>

Each side is a run folder (its provenance.json), a checkpoint folder
(its last.pt) or a checkpoint file, read as untrusted data. Exit code: 0 when nothing differs,
1 when something does, 2 on bad input (one line naming it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils.errors import EXIT_USER_ERROR, UserError, print_error
from utils.run.compare import GROUPS, differences, read_run
from utils.text import shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="a run folder, checkpoint folder or .pt file")
    parser.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    try:
        found = differences(read_run(args.first), read_run(args.second))
    except UserError as error:
        print_error(error)
        return EXIT_USER_ERROR
    count = sum(len(found[group]) for group in GROUPS)
    print(f"{shown(args.first)}  vs  {shown(args.second)}: ", end="")
    print("the same" if not count else f"{count} difference(s)")
    for group in GROUPS:
        if found[group]:
            print(group)
            for key, first, second in found[group]:
                print(f"  {shown(key)}: {shown(first)} -> {shown(second)}")
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
