"""nbgrader's own configuration for this course, read by the JupyterLab extensions (formgrader,
validate) and the `nbgrader` command when run from the repository root. `camp` configures
nbgrader itself (autograder/nbgrader_setup.py) and does not read this file."""
from pathlib import Path

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.CourseDirectory.root = str(Path(__file__).resolve().parent)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.db_url = f"sqlite:///{Path(__file__).resolve().parent / 'grading' / 'gradebook.db'}"
