#!/usr/bin/env python3
"""The crate's public items that nothing outside src/ names: the list to audit when asking
"does an app need this?".

Reads rustdoc's JSON of the library (a nightly format, built with the installed toolchain):

    RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="-Zunstable-options --output-format json" \\
        cargo doc --no-deps --lib
    tools/public_items.py [target/doc/moeflow.json]

and prints, by file and line, every public module-level item (function, type, constant,
trait, module) and every public inherent method whose name appears in none of tests/,
examples/, benches/, web/src/ (the browser page), README.md and docs/. Names are matched as
words (a method as `.name` or `::name`), so a common name used elsewhere hides an item: the list is a floor, not a verdict.
An item it lists stays public when a public signature or public documentation names it
(rustc's `private_interfaces` lint and rustdoc's private-link check say so when it is made
crate-private) or when it states a limit or a format an app reads; otherwise it becomes
`pub(crate)`. Exit status 0 always: this is a listing, not a check.
"""

import glob
import json
import re
import sys

OUTSIDE = [
    "tests/**/*.rs",
    "examples/**/*.rs",
    "benches/**/*.rs",
    "web/src/**/*.rs",
    "README.md",
    "docs/**/*.md",
]


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "target/doc/moeflow.json"
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    index, paths = doc["index"], doc["paths"]
    text = "\n".join(
        open(f, encoding="utf-8").read() for g in OUTSIDE for f in glob.glob(g, recursive=True)
    )

    def named(pattern: str) -> bool:
        return re.search(pattern, text) is not None

    rows = []
    for key, p in paths.items():
        if p["crate_id"] != 0 or p["kind"] == "variant" or key not in index:
            continue
        name = p["path"][-1]
        if not named(r"\b" + re.escape(name) + r"\b"):
            rows.append((index[key]["span"], p["kind"], "::".join(p["path"])))

    owner = {}
    for item in index.values():
        impl = item["inner"].get("impl") if item["crate_id"] == 0 else None
        if impl and not impl.get("trait"):
            for_type = impl["for"].get("resolved_path", {}).get("path", "?")
            for member in impl["items"]:
                owner[str(member)] = for_type
    for key, item in index.items():
        if item["crate_id"] != 0 or item.get("visibility") != "public":
            continue
        if "function" not in item["inner"] or key in paths or key not in owner:
            continue
        if not named(r"[.:]" + re.escape(item["name"]) + r"\b"):
            rows.append((item["span"], "method", f"{owner[key]}::{item['name']}"))

    rows.sort(key=lambda r: (r[0]["filename"], r[0]["begin"][0]))
    for span, kind, name in rows:
        print(f"{span['filename']}:{span['begin'][0]}\t{kind}\t{name}")
    print(f"{len(rows)} public items named nowhere outside src/", file=sys.stderr)


if __name__ == "__main__":
    main()
