"""JupyterHub for a class of LLM Camp: `sudo make hub` starts it with this file (from the repository
root, with .venv/bin first on PATH). Edit it freely: each setting says what it is for.

Who: real local users. PAMAuthenticator checks their own Unix password; the class is two Unix
groups, students ($CAMP_HUB_STUDENTS, default llm-camp-students) and instructors
($CAMP_HUB_INSTRUCTORS, default llm-camp-instructors). Add a student with
`useradd -m -G llm-camp-students NAME && passwd NAME`.
Where: each user's own JupyterLab, started as that user by LocalProcessSpawner (the hub runs as
root); students open on their home, instructors on the course with Formgrader. nbgrader's
exchange is $CAMP_EXCHANGE_DIR (default /srv/nbgrader/exchange). autograder.course.hub has the
details (what is private to instructors, the roles' settings); `make hub` runs its `prepare`
first (the proxy, the exchange, the modes).
"""
import os
import sys
from pathlib import Path

from autograder.course import hub

c = get_config()  # noqa: F821 (provided by JupyterHub when it loads this file)
ROOT = Path(__file__).resolve().parents[2]
students, instructors = hub.group_names()

# Where people connect. Plain HTTP on loopback by default: for a class on a network, listen on
# all interfaces (CAMP_HUB_IP=0.0.0.0) behind TLS (c.JupyterHub.ssl_cert / ssl_key, or a reverse proxy).
ip = os.environ.get("CAMP_HUB_IP", "127.0.0.1")
c.JupyterHub.bind_url = f"http://{ip}:{os.environ.get('CAMP_HUB_PORT', '8000')}"
c.JupyterHub.hub_port = int(os.environ.get("CAMP_HUB_API_PORT", "8081"))   # hub <-> single-user servers
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('CAMP_HUB_PROXY_API_PORT', '8001')}"
# Debian's node-configurable-http-proxy (make hub installs it); started and stopped by the hub
c.ConfigurableHTTPProxy.command = ["configurable-http-proxy"]
hub.proxy_environment()   # NODE_PATH for Debian's proxy under a node that is not Debian's

# The hub's own state, readable by root only (database, cookie secret, proxy pid)
state = hub.state_dir()
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")

# Who may log in: PAM with the machine's users, limited to the class's two groups. Instructors
# are the hub's admins too (they see every server in the hub's Admin page).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False       # no PAM session per login: containers often lack pam_systemd/utmp
c.Authenticator.allowed_groups = {students, instructors}
c.Authenticator.admin_groups = {instructors}

# One JupyterLab per user, run as that user. On a machine with systemd, jupyterhub-systemdspawner
# (PyPI) runs each in its own unit with memory/CPU limits:
#   c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"; c.SystemdSpawner.mem_limit = "4G"
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.pre_spawn_hook = hub.pre_spawn       # home 0700, the role's Jupyter settings and folder
c.Spawner.http_timeout = 120                   # a busy 2-core machine starts a JupyterLab in 5-30 s
c.Spawner.start_timeout = 180
c.JupyterHub.cleanup_servers = True            # stopping the hub stops every user's server
