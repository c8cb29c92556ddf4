#!/usr/bin/env bash
# On the GPU machine: work longer than one device call, run detached and collected over several calls.
#   bash benchmarks/device_job.sh start 'CMD'   # runs CMD in a copy of this tree (bash -c; $JOB_OUT is its output
#                                               # folder), then waits as below
#   bash benchmarks/device_job.sh wait          # waits up to WAIT seconds (default 540) for it to end, copies
#                                               # $JOB_OUT into $OUT and prints the tail of its log
# The copy keeps the job apart from the tree a later call lays down. The machine goes back when idle, which ends
# the job: call `wait` again as soon as a call returns. E.g. the final measurement (docs/performance.md):
#   bash benchmarks/device_job.sh start 'CHUNKS=128 ... bash benchmarks/trunk_device.sh $JOB_OUT/speed speed'
set -uo pipefail
cd "$(dirname "$0")/.."
job=/tmp/device-job
case "${1:-}" in
  start)
    [ $# -eq 2 ] || { echo "usage: device_job.sh start 'CMD'" >&2; exit 2; }
    if [ -d "$job" ] && [ ! -f "$job/out/EXIT" ]; then
      echo "a job is running since $(stat -c %y "$job/out/job.log"): wait for it" >&2
      exit 1
    fi
    rm -rf "$job" && mkdir -p "$job/out" "$job/tree"
    tar --exclude=./.git --exclude=./.venv -cf - . | tar -xf - -C "$job/tree"
    (cd "$job/tree" && JOB_OUT="$job/out" setsid nohup bash -c "$2; echo \$? > '$job/out/EXIT'" \
      > "$job/out/job.log" 2>&1 < /dev/null &)
    echo "started: $2"
    ;;
  wait) ;;
  *)
    echo "usage: device_job.sh start 'CMD' | wait" >&2
    exit 2
    ;;
esac
[ -d "$job" ] || { echo "no job on this machine (a fresh machine: start it again)" >&2; exit 1; }
end=$((SECONDS + ${WAIT:-540}))
while [ $SECONDS -lt $end ] && [ ! -f "$job/out/EXIT" ]; do sleep 5; done
[ -n "${OUT:-}" ] && cp -r "$job/out/." "$OUT"/
tail -n "${TAIL:-60}" "$job/out/job.log"
if [ -f "$job/out/EXIT" ]; then
  echo "ended: exit $(cat "$job/out/EXIT")"
else
  echo "running: call 'device_job.sh wait' again now"
fi
