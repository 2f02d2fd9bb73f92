"""`python -m moss_vl.testing PATH [--size tiny|full]`: write a MOSS-VL checkpoint into PATH."""

from __future__ import annotations

import argparse
import sys

from moss_vl.testing import write_config_only
from moss_vl.testing.checkpoint import SIZES, write_checkpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moss_vl.testing",
        description="Write a MOSS-VL checkpoint with random bf16 weights: tiny for tests, "
                    "or the full 11 B architecture for measurements.",
    )
    parser.add_argument("path", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny",
                        help="tiny (tests) or full (MOSS-VL-Instruct-0708's shapes, ~21 GiB)")
    parser.add_argument("--device", default="cpu",
                        help="where the random weights are drawn (cuda: seconds for the full size)")
    parser.add_argument("--config-only", action="store_true",
                        help="write config, code and tokenizer files but no weights")
    args = parser.parse_args(argv)
    if args.config_only:
        path = write_config_only(args.path, **SIZES[args.size])
    else:
        path = write_checkpoint(args.path, size=args.size, seed=args.seed, device=args.device)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
