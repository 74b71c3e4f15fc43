"""The README lists every runnable recipe, as docs/recipes.md and `recipes/__init__.py` do."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def runnable_recipes() -> set[str]:
    return {path.stem for path in (REPO / "recipes").glob("*.py")
            if 'if __name__ == "__main__":' in path.read_text()}


def test_every_runnable_recipe_is_listed():
    recipes = runnable_recipes()
    assert {"vision", "text_lm"} <= recipes
    readme = (REPO / "README.md").read_text()
    listed = set(re.findall(r"^- `(\w+)`: ", readme, re.M))
    assert listed == recipes
    sections = set(re.findall(r"^## (\w+)$", (REPO / "docs" / "recipes.md").read_text(), re.M))
    assert recipes <= sections
    docstring = (REPO / "recipes" / "__init__.py").read_text()
    assert all(name in docstring for name in recipes)


def test_the_example_configurations_the_readme_links_exist():
    readme = (REPO / "README.md").read_text()
    for link in re.findall(r"\]\((examples/configs/[\w./]+)\)", readme):
        assert (REPO / link).is_file(), link
