"""Why do two runs differ? Compare what produced them: config keys, code (commit, dirty flag,
diff hash, user modules), packages (only the versions that differ), machine and data (per
source, per split).

    python compare.py runs/<run_a> runs/<run_b>     # and their curves: runs/compare/<a>-vs-<b>.png
    python compare.py checkpoints/<run_a>/best.pt checkpoints/<run_b>
    python compare.py runs/<run_a> runs/<run_b> --curves none      # the text answer alone

Each side is a run folder (its provenance.json), a checkpoint folder
(its last.pt) or a checkpoint file, read as untrusted data. Exit code: 0 when nothing differs,
1 when something does, 2 on bad input (one line naming it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils.errors import EXIT_USER_ERROR, UserError, print_error
from utils.files import write_file
from utils.report.history import compared_curves
from utils.run.compare import GROUPS, differences, read_run
from utils.text import shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="a run folder, checkpoint folder or .pt file")
    parser.add_argument("second", type=Path)
    parser.add_argument(
        "--curves",
        default=None,
        help="where the two runs' curves go (a .png; none: not drawn); default "
        "runs/compare/<a>-vs-<b>.png when both are run folders with a history",
    )
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
    try:
        drawn = curves(args.first, args.second, args.curves)
    except UserError as error:
        print_error(error)
        return EXIT_USER_ERROR
    if drawn is not None:
        print(f"curves: {shown(drawn)}")
    return 1 if count else 0


def curves(first: Path, second: Path, asked: str | None) -> Path | None:
    """The two runs' curves on common axes, written where ``asked`` says (or the default);
    None when not asked for or when either side has no history."""
    if asked == "none" or not (first.is_dir() and second.is_dir()):
        return None
    picture = compared_curves(first, second)
    if picture is None:
        return None
    path = Path(asked) if asked else Path("runs", "compare", f"{first.name}-vs-{second.name}.png")
    if path.suffix.lower() != ".png":
        raise UserError(f"--curves {path}: name a .png file (or none)")
    write_file(path, picture, "pass --curves with a path this user can write")
    return path


if __name__ == "__main__":
    sys.exit(main())
