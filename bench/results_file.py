"""bench/RESULTS.md: the full tables of the last `make bench` and `make quality`, committed so a
reader sees them without running anything. Each script owns one section, between
``<!-- name -->`` and ``<!-- /name -->``, and replaces only its own on a full run."""
from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"
HEAD = ("# Benchmark results\n\nWritten by `make bench` (the paired step table) and `make quality` "
        "(learning quality); each run replaces its own section. The README quotes from here.\n")


def write_section(name: str, title: str, markdown: str, path: Path = RESULTS) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise ValueError(f"section name {name!r}: lower-case letters, digits and '-'")
    block = f"<!-- {name} -->\n## {title}\n\n{markdown.strip()}\n<!-- /{name} -->"
    text = path.read_text() if path.exists() else HEAD
    pattern = re.compile(rf"<!-- {name} -->.*?<!-- /{name} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
