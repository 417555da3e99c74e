# Sourced by scripts/gpu_check.sh and scripts/gpu_pipeline.sh: each step on the GPU machine is bounded in
# time and appends what it printed to one markdown results file ($RESULTS); $STEP_NAME prefixes its lines.

section() { printf '\n## %s\n\n' "$1" >> "$RESULTS"; }

# run_step NAME LIMIT CMD...: bounded, timed; its output goes to the results file.
run_step() {
  local name=$1 limit=$2; shift 2
  local started=$SECONDS rc log=/tmp/${STEP_NAME}_step.log
  echo "[$STEP_NAME] $name (at most ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  section "$name"
  { echo "command: \`$*\`  "; echo "exit code: $rc$([ $rc = 124 ] && echo ' (timed out)'), $((SECONDS - started)) s"
    echo; echo '```'; tail -n 60 "$log"; echo '```'; } >> "$RESULTS"
  echo "[$STEP_NAME] $name: exit $rc in $((SECONDS - started)) s"
  return $rc
}
