# Shell helpers the scripts share (the benches, scripts/run, scripts/check-package), sourced
# after `set -euo pipefail`: free ports, waiting for a process to come up, and the CPU a process
# used.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
die() { echo "$(basename "$0"): $*" >&2; exit 1; }
wait_for() { # tries command...: until the command succeeds, 0.1 s apart
  local tries=$1; shift
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
http_ok() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$@")" = 200 ]; }   # curl args...
ticks() { # pids... -> utime+stime summed (clock ticks)
  local t=0 p v
  for p in "$@"; do
    v=$(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$p/stat" 2>/dev/null || echo 0)
    t=$((t + v))
  done
  echo "$t"
}
