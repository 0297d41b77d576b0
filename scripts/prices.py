#!/usr/bin/env python3
"""Puts a price catalog into a filter configuration (docs/limits.md#prices).

    prices.py CONFIG [--catalog FILE] [--today YYYY-MM-DD]

CONFIG is the filter's configuration as JSON (a file, or - for stdin). The
configuration is printed with the catalog's two members (`catalog_as_of`,
`catalog`; by default those of examples/prices.json) in its `limits`; the
rest of it, `limits.prices` included, is kept as it is, and the filter lets
an entry of `limits.prices` replace the catalog's entry of the same key.
A catalog more than 90 days old is used all the same, with a warning on
stderr: prices move.
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "examples" / "prices.json"
STALE_DAYS = 90
MEMBERS = ("catalog_as_of", "catalog")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="the filter's configuration (JSON), - for stdin")
    p.add_argument("--catalog", default=str(CATALOG), help="the catalog (default %(default)s)")
    p.add_argument("--today", help="the date the catalog's age is counted to (default: today)")
    args = p.parse_args()

    text = sys.stdin.read() if args.config == "-" else Path(args.config).read_text()
    config = json.loads(text) if text.strip() else {}
    catalog = json.loads(Path(args.catalog).read_text())
    if not isinstance(config, dict) or not isinstance(config.get("limits", {}), dict):
        sys.exit("prices.py: the configuration is not an object with an object `limits`")
    if set(catalog) != set(MEMBERS):
        sys.exit(f"prices.py: {args.catalog} is not a catalog (members: {', '.join(MEMBERS)})")

    as_of = datetime.date.fromisoformat(catalog["catalog_as_of"])
    today = datetime.date.fromisoformat(args.today) if args.today else datetime.date.today()
    age = (today - as_of).days
    if age > STALE_DAYS:
        print(f"prices.py: the catalog's prices are of {as_of}, {age} days ago: "
              "check them against the providers' pages", file=sys.stderr)

    limits = config.setdefault("limits", {})
    for member in MEMBERS:
        limits[member] = catalog[member]
    json.dump(config, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
