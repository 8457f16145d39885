# Shared by the fine-tuning MPI test scripts, sourced after they set mpiexec, wxe, model, the
# `common` finetune options, nsteps (the losses a run logs) and resume_at (the checkpoint a
# stopped run leaves): a temporary folder, pass/fail counting, wxe finetune on N ranks, the
# losses of a run and their comparison, and a copy of a run as if it had stopped.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
# mpi N ARGS...: wxe finetune MODEL COMMON... ARGS on N ranks
mpi() { local n=$1; shift; timeout 300 "$mpiexec" --oversubscribe -n "$n" "$wxe" finetune "$model" "${common[@]}" "$@"; }
losses() { tail -n +2 "$1/training_log.csv" | cut -d, -f2; }
# same_losses A B [exact]: nsteps losses, each of A within rtol 1e-5 of B's (or equal)
same_losses() {
  paste <(losses "$1") <(losses "$2") | awk -v want="$nsteps" -v exact="${3:-}" '{ d = $1 - $2; if (d < 0) d = -d
    m = $2 < 0 ? -$2 : $2; if (exact != "" ? $1 != $2 : d > 1e-5 * m) bad = 1; n++ } END { exit (bad || n != want) }'
}
# resume_copy FROM TO: TO holds FROM's resume_at checkpoint and log, as a run stopped there would
resume_copy() {
  mkdir -p "$2" && cp -r "$1/$resume_at" "$2/" && cp "$1/training_log.csv" "$2/" && echo "$resume_at" >"$2/latest"
}
