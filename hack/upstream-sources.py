"""Print, or record, the normalised source hash of every hook's upstream target.

    PYTHONPATH=src .venv/bin/python hack/upstream-sources.py            # compare
    PYTHONPATH=src .venv/bin/python hack/upstream-sources.py --record   # write

Run with the Python of the SGLang release to check (e.g.
`.venv-sglang-0.5.24/bin/python`). `--record` stores the installed release's
hashes in tests/compat/upstream_sources.json under its version: do it only
after reading upstream's change to each target that differs and adapting
the hook (docs/upgrading-sglang.md), because the compatibility test accepts
whatever is recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
RECORD = ROOT / "tests" / "compat" / "upstream_sources.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write the installed hashes")
    args = parser.parse_args()

    from npu_stubs import import_ascend_backend

    from moss_vl.hooks import all_hooks, upstream
    from moss_vl.sglang_versions import installed, nearest_line

    version = installed()
    line = nearest_line(version)
    import_ascend_backend()
    recorded = json.loads(RECORD.read_text())
    changed = 0
    for hook in all_hooks():
        if line not in hook.sglang_versions:
            continue
        digest = upstream.source_sha256(upstream.original(hook.target))
        entry = recorded.setdefault(hook.name, {"target": hook.target, "sha256": {}})
        entry["target"] = hook.target
        known = {v: h for v, h in entry["sha256"].items() if v in line or v == line.name}
        state = "same" if digest in known.values() else "CHANGED"
        changed += state == "CHANGED"
        print(f"{state:8} {hook.name:48} {digest[:16]}  (recorded: {known or 'none'})")
        if args.record and state == "CHANGED":
            entry["sha256"][version] = digest
    if args.record:
        RECORD.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        print(f"recorded SGLang {version} in {RECORD.relative_to(ROOT)}")
    return 1 if changed and not args.record else 0


if __name__ == "__main__":
    sys.exit(main())
