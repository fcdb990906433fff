# Sourced by the CPU serving benchmarks: wait until a server on localhost answers /health.
wait_healthy() {  # wait_healthy PORT [PATH: /health, or a server's own ready route]
  for _ in $(seq 600); do curl -sf "localhost:$1${2:-/health}" >/dev/null && return; sleep 1; done
  echo "server on $1 did not start" >&2; return 1
}
