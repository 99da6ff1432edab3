#!/usr/bin/env bash
# Measure whether the suite can be trusted (issue 36 item 6): `make test` on fresh clones of this
# checkout's main, again and again, plain and with a CPU hog beside it.
#
#   scripts/soak-tests.sh N            N runs
#   scripts/soak-tests.sh N M          N runs, then M runs with `stress-ng --cpu 2` beside each
#   scripts/soak-tests.sh --stress N   N runs, each with `stress-ng --cpu 2` beside it
#   --dry-run                          print what would run, run nothing
#   --one-clone                        clone once and repeat `make test` in it (no setup per run)
#
# Why fresh clones: what a new user (and CI) runs is setup plus suite on a clean tree, so every
# run clones the committed main (uncommitted changes are not tested) into its own temporary
# directory, times `make test` there (setup included) and removes it.  Why stress-ng: rare
# failures are races against a loaded machine; a hog on two cores makes them show in a few runs.
# Each run prints PASS/FAIL and its duration; the last line sums up.  Logs stay in the results
# directory printed at the start.  A run takes 12+ minutes.
set -euo pipefail

usage() {
  sed -n '5,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

dry_run=0
one_clone=0
stress_all=0
counts=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    --one-clone) one_clone=1 ;;
    --stress) stress_all=1 ;;
    -h | --help) usage ;;
    *)
      [[ "$arg" =~ ^[0-9]+$ ]] || usage
      counts+=("$arg")
      ;;
  esac
done
[ ${#counts[@]} -ge 1 ] && [ ${#counts[@]} -le 2 ] || usage
plain=${counts[0]}
stressed=${counts[1]:-0}
if [ "$stress_all" = 1 ]; then
  [ ${#counts[@]} -eq 1 ] || usage
  stressed=$plain
  plain=0
fi
total=$((plain + stressed))
[ "$total" -gt 0 ] || usage

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
branch=main
git -C "$repo" rev-parse --verify --quiet "refs/heads/$branch" >/dev/null || branch=$(git -C "$repo" rev-parse --abbrev-ref HEAD)
commit=$(git -C "$repo" rev-parse --short "$branch")
results=$(mktemp -d "${TMPDIR:-/tmp}/txmsg-soak.XXXXXX")

echo "soak: $plain plain + $stressed with stress-ng --cpu 2 run(s) of 'make test' on $branch ($commit) of $repo; logs in $results"

if [ "$stressed" -gt 0 ] && ! command -v stress-ng >/dev/null 2>&1; then
  if [ "$dry_run" = 1 ]; then
    echo "[dry-run] apt-get install stress-ng"
  elif [ "$(id -u)" = 0 ]; then
    echo "soak: apt-get install stress-ng"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
  else
    echo "soak: stress-ng is missing (run as root, or: sudo apt-get install stress-ng)" >&2
    exit 1
  fi
fi

hog_pid=""
clone_dir=""
cleanup() {
  if [ -n "$hog_pid" ]; then
    kill "$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
  fi
  if [ -n "$clone_dir" ]; then
    rm -rf "$clone_dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fresh_clone() {
  clone_dir=$(mktemp -d "${TMPDIR:-/tmp}/txmsg-soak-clone.XXXXXX")
  # mktemp makes it 0700; scripts/pg.sh runs PostgreSQL as the postgres user under ./var/pg,
  # which must be able to reach it (initdb failed in every run before this)
  chmod 755 "$clone_dir"
  git clone --quiet --branch "$branch" "$repo" "$clone_dir"
}

# After a run: each core file in the clone (kernel.core_pattern "core" writes it where the crashed
# process stood) becomes a text file beside the run's log with every native thread's stack.
native_stacks() {
  local core n=0
  while IFS= read -r core; do
    n=$((n + 1))
    if command -v gdb >/dev/null 2>&1; then
      gdb -batch -ex "info threads" -ex "thread apply all bt 30" \
        "$clone_dir/.venv/bin/python" "$core" >"${1%.log}-core-$n.txt" 2>&1 || true
      echo "soak: native stacks of $core in ${1%.log}-core-$n.txt"
    else
      cp "$core" "${1%.log}-core-$n" && echo "soak: $core kept as ${1%.log}-core-$n (no gdb)"
    fi
    rm -f "$core"
  done < <(find "$clone_dir" -xdev -type f \( -name core -o -name 'core.[0-9]*' \) 2>/dev/null)
}

passed=0
failed=0
durations=()
if [ "$one_clone" = 1 ] && [ "$dry_run" = 0 ]; then
  fresh_clone
fi
for run in $(seq 1 "$total"); do
  kind=plain
  [ "$run" -gt "$plain" ] && kind=stress
  log="$results/run-$run-$kind.log"
  if [ "$dry_run" = 1 ]; then
    [ "$one_clone" = 1 ] && [ "$run" -gt 1 ] || echo "[dry-run] git clone --branch $branch $repo <tmpdir>"
    [ "$kind" = stress ] && echo "[dry-run] stress-ng --cpu 2 &"
    echo "[dry-run] run $run/$total [$kind]: (cd <tmpdir> && make test) > $log"
    continue
  fi
  [ "$one_clone" = 1 ] || fresh_clone
  # main may move between runs: each run names the commit it tested
  run_commit=$(git -C "$clone_dir" rev-parse --short HEAD)
  if [ "$kind" = stress ]; then
    stress-ng --cpu 2 --quiet &
    hog_pid=$!
  fi
  start=$(date +%s)
  # core files on: a native abort (librocketmq) then leaves the stacks of every thread, which the
  # Python fault handler cannot show (it names the Python frames only)
  if (ulimit -c unlimited 2>/dev/null || true; cd "$clone_dir" && make test) >"$log" 2>&1; then
    result=PASS
    passed=$((passed + 1))
  else
    result=FAIL
    failed=$((failed + 1))
  fi
  seconds=$(($(date +%s) - start))
  durations+=("$seconds")
  if [ -n "$hog_pid" ]; then
    kill "$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
    hog_pid=""
  fi
  native_stacks "$log"
  if [ "$one_clone" = 0 ]; then
    rm -rf "$clone_dir"
    clone_dir=""
  fi
  summary=$(grep -E '^=+ .*(passed|failed|error).* in ' "$log" | tail -1 || true)
  printf 'run %d/%d [%s] %s %d:%02d %s %s(%s)\n' "$run" "$total" "$kind" "$result" \
    $((seconds / 60)) $((seconds % 60)) "$run_commit" "${summary:+$summary }" "$log"
done
if [ "$dry_run" = 1 ]; then
  rmdir "$results"
  exit 0
fi

min=0 max=0 sum=0
for s in "${durations[@]}"; do
  sum=$((sum + s))
  if [ "$min" = 0 ] || [ "$s" -lt "$min" ]; then min=$s; fi
  if [ "$s" -gt "$max" ]; then max=$s; fi
done
avg=$((sum / total))
printf 'soak: %d passed, %d failed of %d run(s) on %s; time min %d:%02d avg %d:%02d max %d:%02d\n' \
  "$passed" "$failed" "$total" "$commit" $((min / 60)) $((min % 60)) $((avg / 60)) $((avg % 60)) \
  $((max / 60)) $((max % 60))
[ "$failed" = 0 ]
