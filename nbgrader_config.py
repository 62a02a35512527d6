"""nbgrader's configuration for `make lab`'s JupyterLab (an instructor's, `ROLE=instructor`, and a
student's): Formgrader, the Validate button and release/collect read it from the server's
working folder, the repository root.

The course is this repository (solutions/ released into labs/); submissions, autograded
notebooks, feedback and gradebook.db live in the grading workspace that `camp grade` writes:
./grading, or $CAMP_GRADING_DIR for both. The exchange is ./exchange (or $CAMP_EXCHANGE_DIR).
The settings themselves are in autograder/course/nbgrader_setup.py (`instructor_config`)."""
from pathlib import Path

from autograder.course.nbgrader_setup import instructor_config

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.merge(instructor_config(Path(__file__).resolve().parent))
