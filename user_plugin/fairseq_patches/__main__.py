"""``python -m user_plugin.fairseq_patches``: list the plugin's fairseq patches, which of them
``VASWANI_FAIRSEQ_PATCHES`` leaves on, what each replaces and why (``--json`` for a record per
patch)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import ENV_VAR, PatchSwitchError, describe, fairseq_version


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m user_plugin.fairseq_patches",
        description="List what the plugin changes in fairseq when it loads, and why.")
    parser.add_argument("--json", action="store_true", help="one JSON record per patch")
    args = parser.parse_args(argv)
    try:
        records = describe()
    except PatchSwitchError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        for record in records:
            print(json.dumps(record))
        return 0
    version = fairseq_version()
    on = sum(record["on"] for record in records)
    print(f"fairseq {version}; {on} of {len(records)} patches on when the plugin loads "
          f"({ENV_VAR}=off, or off:NAME,NAME, turns them off)")
    for record in records:
        state = "on " if record["on"] else "off"
        checked = "" if record["version_checked"] else \
            f" (checked against fairseq {', '.join(record['checked'])} only)"
        print(f"\n[{state}] {record['name']}{checked}")
        for target in record["targets"]:
            print(f"      replaces {target}")
        print(f"      {record['fixes']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
