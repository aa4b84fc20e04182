"""Write scikit-learn's handwritten digits as class sub-folders ``0`` ... ``9`` of PNGs: the data of
``experiment=dit_digits``.

    python scripts/make_digits.py data/digits [--resolution 16]
    python train.py +experiment=dit_digits data.path=data/digits
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit_trainer.data.sources.digits import write_digits_folder
from dit_trainer.errors import USER_ERRORS, exit_code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path, help="a new folder")
    parser.add_argument("--resolution", type=int, default=16)
    options = parser.parse_args(argv)
    if options.out_dir.exists():
        parser.error(f"{options.out_dir} exists already; pass a new folder (nothing is overwritten)")
    try:
        print(f"Wrote 1797 digits to {write_digits_folder(options.out_dir, options.resolution)}")
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return exit_code(error)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
