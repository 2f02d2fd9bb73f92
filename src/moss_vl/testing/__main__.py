"""`python -m moss_vl.testing PATH`: write a tiny MOSS-VL checkpoint into PATH."""

from __future__ import annotations

import argparse
import sys

from moss_vl.testing import write_config_only, write_tiny_checkpoint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moss_vl.testing",
        description="Write a tiny MOSS-VL checkpoint (random bf16 weights) for tests.",
    )
    parser.add_argument("path", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--lm-head-scale", type=float, default=1.0,
                        help="multiply the LM head (e.g. 50) for peaked output distributions")
    parser.add_argument("--config-only", action="store_true",
                        help="write config, code and tokenizer files but no weights")
    args = parser.parse_args(argv)
    if args.config_only:
        path = write_config_only(args.path)
    else:
        path = write_tiny_checkpoint(args.path, seed=args.seed, lm_head_scale=args.lm_head_scale)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
