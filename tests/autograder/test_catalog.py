"""course/labs.toml: the ladder's data, consistent with the folders on disk."""
import textwrap

import pytest

from autograder.catalog import LEVELS, Catalog, CatalogError, repo_root

ROOT = repo_root()


def test_catalog_covers_three_levels_and_ready_labs_exist():
    catalog = Catalog.load()
    assert {lab.level for lab in catalog.labs} == set(LEVELS)
    assert catalog.ready(), "at least one lab must be ready"
    for lab in catalog.ready():
        assert lab.source_path(ROOT).is_file(), f"{lab.id}: missing {lab.source_path(ROOT)}"
        assert lab.release_path(ROOT).is_file(), f"{lab.id}: missing {lab.release_path(ROOT)}"
        assert lab.parameters("ci")["device"] == "cpu" and lab.parameters("gpu")["device"] == "cuda"
    on_disk = {p.name for p in (ROOT / "solutions").iterdir() if p.is_dir()}
    assert on_disk == {lab.name for lab in catalog.ready()}, "solutions/ folders and ready labs differ"


def test_lookup_by_id_or_name():
    catalog = Catalog.load()
    assert catalog.get("b01") is catalog.get("b01_attention")
    with pytest.raises(KeyError, match="no lab 'zz9'"):
        catalog.get("zz9")


@pytest.mark.parametrize("body, message", [
    ('id="x1"\nname="x1_a"\nlevel="expert"\ntitle="t"\nstatus="planned"', "level 'expert'"),
    ('id="x1"\nname="oops"\nlevel="basic"\ntitle="t"\nstatus="planned"', "must start with 'x1_'"),
    ('id="x1"\nname="x1_a"\nlevel="basic"\ntitle="t"\nstatus="planned"\nrequires=["q9"]', "unknown lab(s) q9"),
    ('id="x1"\nname="x1_a"\nlevel="basic"\ntitle="t"\nstatus="ready"', "needs exactly the profiles"),
    ('id="x1"\nname="x1_a"\nlevel="basic"\nstatus="planned"', "lacks the field 'title'"),
])
def test_inconsistent_catalog_is_rejected(tmp_path, body, message):
    path = tmp_path / "labs.toml"
    path.write_text("[[lab]]\n" + textwrap.dedent(body) + "\n")
    with pytest.raises(CatalogError) as info:
        Catalog.load(path)
    assert message in str(info.value)


def test_readme_course_map_is_the_catalogs():
    """The README's ladder table is `camp list --markdown`: a catalog change shows there or fails here."""
    from autograder.cli import ladder_markdown
    readme = (repo_root() / "README.md").read_text(encoding="utf-8")
    start, end = "<!-- ladder: camp list --markdown -->\n", "\n<!-- /ladder -->"
    assert start in readme and end in readme, "README.md lost its course-map markers"
    shown = readme.split(start, 1)[1].split(end, 1)[0]
    assert shown == ladder_markdown(Catalog.load()), \
        "README's course map is stale: paste the output of `camp list --markdown` between its markers"
