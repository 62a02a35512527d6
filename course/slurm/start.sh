#!/bin/sh
# Start a one-node Slurm on this machine (root only): munged, slurmctld and slurmd on localhost,
# with course/slurm/slurm.conf.in rendered into $CAMP_SLURM_DIR (default /tmp/camp-slurm).
# Idempotent: a Slurm already answering there is kept. Prints the line to export, SLURM_CONF=...
# Needs Debian's slurm-wlm and munge (`make slurm` installs them). Used by tests/autograder/slurm
# and benchmarks/grading_slurm.py; a cluster has its own Slurm.
set -eu
STATE=${CAMP_SLURM_DIR:-/tmp/camp-slurm}
CPUS=${CAMP_SLURM_CPUS:-4}
HERE=$(cd "$(dirname "$0")" && pwd)
CONF=$STATE/slurm.conf
[ "$(id -u)" = 0 ] || { echo "course/slurm/start.sh: must run as root (it starts slurmctld, slurmd, munged)" >&2; exit 3; }
for bin in slurmctld slurmd munged sbatch; do
  command -v $bin >/dev/null || [ -x /usr/sbin/$bin ] || { echo "course/slurm/start.sh: $bin is missing (apt-get install slurm-wlm munge)" >&2; exit 4; }
done
export PATH="$PATH:/usr/sbin"
if [ -f "$CONF" ] && SLURM_CONF=$CONF timeout 5 scontrol ping 2>/dev/null | grep -q UP \
   && SLURM_CONF=$CONF sinfo -h -o %T 2>/dev/null | grep -q -E '^(idle|mixed|allocated)'; then
  echo "SLURM_CONF=$CONF"; exit 0
fi
mkdir -p "$STATE/ctld" "$STATE/d"
MEMORY_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
sed -e "s|@STATE@|$STATE|g" -e "s|@CPUS@|$CPUS|g" -e "s|@MEMORY_MB@|$MEMORY_MB|g" \
    -e "s|@CTLD_PORT@|${CAMP_SLURM_PORT:-6817}|g" -e "s|@D_PORT@|$(( ${CAMP_SLURM_PORT:-6817} + 1 ))|g" \
    "$HERE/slurm.conf.in" > "$CONF"
# munged: Debian's key, run as its own user
if ! pgrep -x munged >/dev/null; then
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  runuser -u munge -- munged
fi
[ -f "$STATE/slurmctld.pid" ] && kill "$(cat "$STATE/slurmctld.pid")" 2>/dev/null || true
[ -f "$STATE/slurmd.pid" ] && kill "$(cat "$STATE/slurmd.pid")" 2>/dev/null || true
sleep 0.5
slurmctld -f "$CONF" -i
slurmd -f "$CONF" -N localhost
# ready once the node is idle (a few seconds)
for _ in $(seq 1 40); do
  if SLURM_CONF=$CONF sinfo -h -o %T 2>/dev/null | grep -q -E '^(idle|mixed|allocated)'; then
    echo "SLURM_CONF=$CONF"; exit 0
  fi
  sleep 0.5
done
echo "course/slurm/start.sh: the node did not come up; see $STATE/slurmctld.log and $STATE/slurmd.log" >&2
exit 5
