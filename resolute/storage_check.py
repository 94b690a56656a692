"""`python -m resolute.storage_check < checkpoint_storage.json`: the agent's check of a
trial's checkpoint storage before its ranks start, run in the ranks' environment so that
the store sees the same credential chain. Prints the problem on one line and exits 1."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from resolute.storage import StorageError, from_config, one_line


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print("usage: python -m resolute.storage_check < checkpoint_storage.json")
        return 2
    try:
        from_config(json.load(sys.stdin)).validate()
    except (StorageError, ValueError) as exc:
        print(one_line(exc))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
