# Sourced by the recipes' run.sh: `stage NAME COMMAND...` runs the command and appends
# {"stage", "seconds", "finished"} to $RUN/stages.jsonl, so every stage's wall time is on record.
stage() {
    local name=$1 start
    shift
    start=$(date +%s)
    "$@"
    printf '{"stage": "%s", "seconds": %d, "finished": "%s"}\n' "$name" $(($(date +%s) - start)) \
        "$(date -u +%FT%TZ)" >> "$RUN/stages.jsonl"
}
