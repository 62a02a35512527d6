"""What importing camp's grading side costs: jsonschema's optional IRI checker (rfc3987_syntax,
which compiles a Lark grammar on import, ~1.6 s of CPU) stays out of camp's processes, and
nbformat still validates notebooks."""
import subprocess
import sys

PROBE = """
import sys
import autograder.grading.grade, nbformat
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
nbformat.validate(nb)
bad = dict(nb, cells=[{"cell_type": "code"}])
try:
    nbformat.validate(nbformat.from_dict(bad))
    raise SystemExit("an invalid notebook validated")
except nbformat.ValidationError:
    pass
print(sorted(m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in ("rfc3987_syntax", "lark")))
"""


def test_grading_imports_leave_out_the_iri_grammar_and_still_validate_notebooks():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"imported with camp's grading modules: {out.stdout}"


def test_only_jsonschema_would_import_it():
    """The one importer is jsonschema's format module, which treats it as optional: if another
    package starts to need it, this names it."""
    import importlib.metadata as md

    users = sorted(d.metadata["Name"] for d in md.distributions()
                   if any("rfc3987-syntax" in r.replace("_", "-").lower() for r in (d.requires or []))
                   and d.metadata["Name"].lower() != "jsonschema")
    assert users == [], f"packages that require rfc3987-syntax besides jsonschema's extra: {users}"
