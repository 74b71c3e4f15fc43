"""Files that some docs blocks read, written into the block's working folder before it runs.

A block asks for them with `<!-- docs-test: files: NAME, ... -->` on the line above its fence; each
function here writes what a reader of that page would already have (small, made offline).
"""

from __future__ import annotations
