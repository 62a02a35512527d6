"""nbgrader's settings in every JupyterLab `make hub` starts (this folder is first on the user's
JUPYTER_CONFIG_PATH: autograder.course.hub.pre_spawn). The class's exchange ($CAMP_EXCHANGE_DIR,
default /srv/nbgrader/exchange) with `path_includes_course` (a student's copy is
~/llm-camp/<lab>/); an instructor also gets the repository's course settings (Formgrader:
autograder.course.nbgrader_setup.instructor_config). Details: autograder.course.hub."""
from autograder.course.hub import nbgrader_hub_config

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
c.merge(nbgrader_hub_config())
