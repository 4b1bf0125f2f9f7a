"""The example block of a docstring (the indented lines after its ``Example ...::`` line), to
run it as written in a test with only its endpoint replaced."""
from __future__ import annotations

import textwrap


def docstring_example(obj, endpoint: str, replacement: str) -> str:
    doc = obj.__doc__
    head = doc.index("::\n", doc.index("Example"))
    block = textwrap.dedent(doc[head + 3:].rstrip())
    assert repr(endpoint) in block or f'"{endpoint}"' in block, f"{obj.__name__}'s example does not use {endpoint}"
    return block.replace(f'"{endpoint}"', repr(replacement))
