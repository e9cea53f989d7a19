# Sourced by the recipes' run.sh: `stage NAME COMMAND...` runs the command and appends
# {"stage", "seconds", "finished"} to $RUN/stages.jsonl, so every stage's wall time is on record.
# A failing command's status is returned (and nothing recorded) even where the caller is in a `||` list, where
# bash's `set -e` does not reach into the function.
stage() {
    local name=$1 start status=0
    shift
    start=$(date +%s)
    "$@" || status=$?
    [ "$status" = 0 ] || return "$status"
    printf '{"stage": "%s", "seconds": %d, "finished": "%s"}\n' "$name" $(($(date +%s) - start)) \
        "$(date -u +%FT%TZ)" >> "$RUN/stages.jsonl"
}
