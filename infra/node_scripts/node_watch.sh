# shellcheck shell=bash
# The watcher (the start task writes it to the node's OS disk and starts it as a systemd unit):
# a root loop over the requests in the node's task folders (AZ_BATCH_TASK_DIR is
# workitems/<job>/job-1/<task>: batch-compute-node-environment-variables.md) that a launcher
# leaves after a failed try (trainer/launch/recheck.py). Root only removes a request (never
# reads it) and answers as the folder's owner (setpriv), so nothing a task user leaves there
# makes root write or read anywhere. The check runs under timeout with its stderr in a file: a
# hung nvidia-smi (a GPU fallen off the bus) holds no pipe open. A node that fails is recorded
# in __KEPT_OUT__ first (if its disk refuses, the answer says so and it stays up), then
# answered; once the launcher took the answer (or __RECORD_SECONDS__ s passed) the node
# restarts. A restart with a task on the node is a recovery for Batch, which runs the task
# again ("Batch will retry Tasks when a recovery operation is triggered on a Node ... when an
# unhealthy Node is rebooted", BatchTask's remarks), and the start task then finds the record.
# shellcheck disable=SC2016  # $1 and $f are the inner sh's, expanded there
# shellcheck disable=SC2015  # a sleep that fails ends the wait for the launcher: meant

set -uo pipefail
shopt -s nullglob
answer() {
  printf '%s\n' "$*" |
    setpriv --reuid="$(stat -c %u "$folder")" --regid="$(stat -c %g "$folder")" \
      --clear-groups sh -c 'f=$(mktemp -p "$1") && cat > "$f" && mv -f "$f" "$1/__VERDICT__"' \
      sh "$folder"
}
while sleep 1; do
  for request in "$AZ_BATCH_NODE_ROOT_DIR"/workitems/*/*/*/__REQUEST__; do
    folder=${request%/*}
    rm -f "$request" || continue
    timeout -k 5 __CHECK_TIMEOUT_SECONDS__ bash __STATE_DIR__/node-check >/dev/null \
      2>__STATE_DIR__/reason
    case $? in
      0) answer ok; continue ;;
      124|137) reason="its checks did not finish in __CHECK_TIMEOUT_SECONDS__ s" ;;
      *) reason=$(cat __STATE_DIR__/reason); reason=${reason//$'\n'/; } ;;
    esac
    if ! { printf '%s since %s\n' "$reason" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        > __KEPT_OUT__.new && mv -f __KEPT_OUT__.new __KEPT_OUT__; }; then
      answer unrecorded "$reason"
      continue
    fi
    answer sick "$reason"
    for _ in $(seq __RECORD_SECONDS__); do [ -e "$folder/__VERDICT__" ] && sleep 1 || break; done
    systemctl reboot
    exit 0
  done
done
