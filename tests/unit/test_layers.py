#!/usr/bin/env python3
"""tests/unit/test_layers.py: includes name a header alone, never a path.

The layers' arrows are enforced by include paths (each library of server/ sees its own folder
and the ones below it: server/meson.build) and by test_link_* (each library links with its
declared dependencies only). A quoted include with a path ("../net/req.h", "net/req.h")
would step around the first, so none may have one.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIRS = ["util", "proto", "index", "storage", "llm", "client", "server"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

bad = []
for d in DIRS:
    for f in sorted((ROOT / d).rglob("*.[ch]")):
        for m in INCLUDE.finditer(f.read_text(errors="replace")):
            if "/" in m.group(1):
                bad.append(f"{f.relative_to(ROOT)}: #include \"{m.group(1)}\"")
if bad:
    print("includes with a path (name the header alone; fix the layer instead):")
    print("\n".join(bad))
    sys.exit(1)
print("ok")
