#!/usr/bin/env python3
"""Regenerates the configuration table in README.md from `trainer --help` (the schema in
launch/Config.cpp is the single source). Usage: scripts/docs/update_readme_config.py [build/bin/trainer]"""
import re
import subprocess
import sys

trainer = sys.argv[1] if len(sys.argv) > 1 else "build/bin/trainer"
out = subprocess.run([trainer, "--help"], capture_output=True, text=True, check=True).stdout.splitlines()
rows = []
for i, line in enumerate(out):
    m = re.match(r"^  (\S+) = ?(.*)$", line)
    if m and not line.startswith("      "):
        key, default = m.group(1), m.group(2).strip()
        rows.append(f"| `{key}` | {'`' + default + '`' if default else '(empty)'} | {out[i + 1].strip()} |")
table = "| key | default | meaning |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n"
readme = open("README.md").read()
new, n = re.subn(r"\| key \| default \| meaning \|\n\| --- \| --- \| --- \|\n(?:\|.*\|\n)+", table, readme)
if n != 1:
    sys.exit("README.md: configuration table not found")
open("README.md", "w").write(new)
print(f"README.md: {len(rows)} keys")
