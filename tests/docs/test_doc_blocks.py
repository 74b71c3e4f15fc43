"""Every fenced Python block of README.md and docs/*.md runs, as a reader would paste it.

The blocks of one page run in order in one fresh Python process (so a block may use what an earlier
block of its page defined), in an empty working folder, on the CPU. A block that cannot run here
says so in a marker on the line just above its fence, and the marker is counted:

    <!-- docs-test: skip: the reason, e.g. "needs two hosts (tests/sharding runs it in real processes)" -->
    <!-- docs-test: setup: image_folder, experiment_toml -->

`setup` names functions of `tests/docs/doc_setup.py` that run first, in the block's folder: they
write the files a reader of the page would already have, or return the objects the block says it
takes (a model, pipelines), which join the page's names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)  # fences inside list items are indented
MARKER = re.compile(r"^<!--\s*docs-test:\s*(skip|setup)\s*:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # the block's first code line in the page
    code: str
    skip: str | None = None  # the marker's reason
    setup: tuple[str, ...] = ()


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for match in FENCE.finditer(text):
        line = text[:match.start()].count("\n") + 2
        above = next((s.strip() for s in reversed(lines[:line - 2]) if s.strip()), "")
        marker = MARKER.match(above)
        skip = setup = None
        if marker and marker.group(1) == "skip":
            skip = marker.group(2)
            if not skip:
                raise ValueError(f"{path.name}:{line - 2}: a docs-test skip marker must give its reason")
        elif marker:
            setup = tuple(name.strip() for name in marker.group(2).split(","))
        out.append(Block(path.name, line, textwrap.dedent(match.group(2)), skip, setup or ()))
    return out


# What runs the blocks in the child process: each block is compiled with its page's line numbers,
# so a traceback points at the page.
DRIVER = r"""
import json, sys, traceback
sys.path.insert(0, {tests!r})
import doc_setup
ns = {{"__name__": "__main__"}}
for block in json.load(open(sys.argv[1])):
    for name in block["setup"]:
        ns.update(getattr(doc_setup, name)() or {{}})
    try:
        exec(compile("\n" * (block["line"] - 1) + block["code"], block["page"], "exec"), ns)
    except BaseException:
        print("FAILED", block["line"], flush=True)
        traceback.print_exc()
        sys.exit(1)
    print("RAN", block["line"], flush=True)
"""


def run_blocks(blocks: list[Block], workdir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs the blocks that are not skipped, in order, in one fresh process in `workdir`."""
    spec = workdir / "blocks.json"
    spec.write_text(json.dumps([{"page": b.page, "line": b.line, "code": b.code, "setup": list(b.setup)}
                                for b in blocks if b.skip is None]))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("DATARAX_TEST_JAX_CACHE", None)
    driver = DRIVER.format(tests=str(Path(__file__).parent))
    # The timeout is a hang guard only: a page's blocks take seconds to a minute or two.
    return subprocess.run([sys.executable, "-c", driver, str(spec)], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=timeout)


PAGES_WITH_BLOCKS = [p for p in PAGES if blocks_of(p)]


@pytest.mark.parametrize("path", PAGES_WITH_BLOCKS, ids=lambda p: p.name)
def test_every_python_block_of_the_page_runs(path, tmp_path):
    blocks = blocks_of(path)
    result = run_blocks(blocks, tmp_path)
    ran = [int(n) for n in re.findall(r"^RAN (\d+)$", result.stdout, re.M)]
    assert result.returncode == 0, f"{path.name}: a block failed\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    assert ran == [b.line for b in blocks if b.skip is None]


def test_skipped_blocks_are_few_and_each_gives_its_reason():
    skipped = [(b.page, b.line, b.skip) for p in PAGES for b in blocks_of(p) if b.skip is not None]
    total = sum(len(blocks_of(p)) for p in PAGES)
    assert all(len(reason) >= 10 for _, _, reason in skipped), skipped
    assert len(skipped) <= total // 5, skipped


def test_a_failing_block_fails_the_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip: shows a call that needs a GPU -->\n"
                    "```python\nraise SystemExit(3)\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n")
    blocks = blocks_of(page)
    assert [(b.line, b.skip) for b in blocks] == [(4, None), (9, "shows a call that needs a GPU"), (13, None)]
    result = run_blocks(blocks, tmp_path)
    assert result.returncode == 1
    assert "RAN 4" in result.stdout and "FAILED 13" in result.stdout
    assert 'File "page.md", line 13' in result.stderr and "x is 1" in result.stderr


def test_a_skip_marker_without_a_reason_is_an_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skip: -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="must give its reason"):
        blocks_of(page)
