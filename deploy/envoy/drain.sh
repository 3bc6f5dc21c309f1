#!/usr/bin/env bash
# Drains an Envoy sidecar before it stops, so the JSON calls in flight through it finish.
# Envoy itself drops every connection at SIGTERM; this runs before that.
#
#   drain.sh SETTLE_S MAX_S                          Kubernetes: the sidecar's preStop hook
#   drain.sh --run SETTLE_S MAX_S -- envoy ARGS...   docker compose: runs Envoy; at SIGTERM
#                                                    drains, then stops it
#
# Asks the admin (127.0.0.1:${ENVOY_ADMIN_PORT:-9901}) for a graceful drain: with
# `--drain-strategy immediate` every response from then on says `Connection: close`, and the
# listeners close after `--drain-time-s`. Waits SETTLE_S (the service's drain, while callers
# are still routed here), then until no request is in flight or MAX_S have passed since the
# start. The image has bash but no curl, so the admin is spoken to over /dev/tcp; an admin
# that does not answer within ADMIN_READ_S a line counts as no admin.
set -u
ADMIN_READ_S=5

admin() {  # METHOD PATH: the admin's answer, headers and all; fails if it stops answering
  local line rc
  { exec 3<>"/dev/tcp/127.0.0.1/${ENVOY_ADMIN_PORT:-9901}"; } 2>/dev/null || return 1
  printf '%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: 0\r\n\r\n' \
    "$1" "$2" >&3
  while true; do
    # 1: the answer's end (a last line without a newline is in $line); > 128: timed out
    IFS= read -r -t "$ADMIN_READ_S" line <&3 || { rc=$?; break; }
    printf '%s\n' "$line"
  done
  exec 3<&-
  ((rc <= 128)) || return 1
  [[ -z $line ]] || printf '%s\n' "$line"
}

in_flight() {  # requests in flight on the sidecar's listeners (the admin's own left out)
  admin GET '/stats?filter=downstream_rq_active$' | {
    n=0
    while read -r name value; do
      case "$name" in
        http.admin.*) ;;
        http.*.downstream_rq_active:) n=$((n + ${value//[!0-9]/})) ;;
      esac
    done
    echo "$n"
  }
}

drain() {  # SETTLE_S MAX_S
  local settle=$1 max=$2 n answer status
  SECONDS=0
  if ! answer=$(admin POST '/drain_listeners?graceful'); then
    echo "drain: no answer from the admin on port ${ENVOY_ADMIN_PORT:-9901}; nothing to drain" >&2
    return 0
  fi
  status=${answer%%$'\r'*} status=${status%%$'\n'*}
  if [[ $status == "HTTP/1.1 200 "* ]]; then
    echo "drain: listeners draining; waiting ${settle}s, then for calls in flight (${max}s at most)" >&2
  else  # still worth waiting for the calls in flight: Envoy drops them at SIGTERM
    echo "drain: the admin refused the drain (${status:-an empty answer}); waiting ${settle}s, then for calls in flight (${max}s at most)" >&2
  fi
  sleep "$settle"
  while ((SECONDS < max)); do
    n=$(in_flight) || break
    ((n > 0)) || break
    echo "drain: $n in flight" >&2
    sleep 1
  done
  echo "drain: done after ${SECONDS}s" >&2
}

if [[ ${1:-} == --run ]]; then
  settle=$2 max=$3
  shift 4  # --run SETTLE_S MAX_S --
  envoy='' stopping=''
  # The trap is set before Envoy starts: a SIGTERM that came first would kill this script
  # and leave Envoy running.
  trap 'stopping=1; drain "$settle" "$max"; [[ -z $envoy ]] || kill -TERM "$envoy"' TERM INT
  "$@" &
  envoy=$!
  [[ -z $stopping ]] || kill -TERM "$envoy"
  # `wait` returns early (> 128) when the trap runs; Envoy exits once the trap has stopped it.
  while wait "$envoy"; status=$?; kill -0 "$envoy" 2>/dev/null; do :; done
  # Envoy may have exited during the trap: bash then holds its status for one more `wait`
  # (127 if the status above was already Envoy's own).
  if ((status > 128)); then
    wait "$envoy" 2>/dev/null
    again=$?
    ((again == 127)) || status=$again
  fi
  exit "$status"
fi

drain "$1" "$2"
