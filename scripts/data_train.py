"""Write the training sets used by the training stage (HDF5: x float32 [N, ...], y int64 [N]).

  python scripts/data_train.py --config-json '{"stage": {...}}' --digits D.h5 --tabular T.h5
  (--payload FILE: the same JSON from a file, as the workflow passes it)
"""
import argparse
import sys
from pathlib import Path

from gpulab.config import validate_section
from gpulab.data.errors import DataError
from gpulab.data.settings import Settings
from gpulab.data.train_sets import build
from gpulab.stage import load_payload, setup_logging


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/data_train.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config-json", default="{}", help="JSON: {'stage': <data config section>}")
    ap.add_argument("--payload", type=Path, default=None, help="JSON file instead of --config-json")
    ap.add_argument("--digits", required=True, help="output HDF5 for the digits training set")
    ap.add_argument("--tabular", required=True, help="output HDF5 for the synthetic tabular set")
    ap.add_argument("--cache-dir", default=None,
                    help="dataset cache (results/data/cache in the workflow; default: none)")
    args = ap.parse_args(argv)
    setup_logging()
    try:
        # The payload holds only the keys that shape the training sets (seed, train), so that
        # resizing the benchmark does not rebuild them: the schema fills in the rest.
        section = validate_section("data", load_payload(args.config_json, args.payload)["stage"])
        build(Settings.from_section(section), args.digits, args.tabular, args.cache_dir)
    except (DataError, ValueError) as exc:
        print(f"data_train: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
