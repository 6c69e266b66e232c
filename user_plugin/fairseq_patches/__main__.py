"""``python -m user_plugin.fairseq_patches``: list the plugin's fairseq patches, which of them
``VASWANI_FAIRSEQ_PATCHES`` leaves on, which runs each applies to (our runs, or every run), what
each replaces and why (``--json`` for a record per patch)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import ENV_VAR, EVERY_RUN, OUR_RUNS, PatchSwitchError, describe, fairseq_version


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
    print(f"'{OUR_RUNS}': runs of the plugin's model or task; any other run gets fairseq's own "
          f"function. '{EVERY_RUN}': only rows that turn a crash of fairseq's into a result or "
          "one error line")
    for record in records:
        state = "on " if record["on"] else "off"
        checked = "" if record["version_checked"] else \
            f" (checked against fairseq {', '.join(record['checked'])} only)"
        print(f"\n[{state}] {record['name']}{checked}")
        decided = "; ".join(dict.fromkeys(record["decided_by"]))
        print(f"      scope: {record['scope']}" + (f" (told by {decided})" if decided else ""))
        for target, replacement in zip(record["targets"], record["replacements"]):
            print(f"      replaces {target} by {replacement}")
        print(f"      {record['fixes']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
