#!/bin/bash
# Alternating rounds of the two partition spikes (decision 0025), each line
# of their output prefixed with the round and the engine.
# Usage: rounds.sh [rounds] [partitions] [vehicles] [fixes per vehicle]
set -euo pipefail
cd "$(dirname "$0")"
for round in $(seq 1 "${1:-5}"); do
  SPIKE_LAYOUT=streams ./nats-partitions/run.sh "${2:-8}" "${3:-200}" "${4:-500}" | sed "s/^/$round nats-streams: /"
  ./rabbitmq-partitions/run.sh "${2:-8}" "${3:-200}" "${4:-500}" | sed "s/^/$round rabbitmq: /"
  SPIKE_LAYOUT=filtered ./nats-partitions/run.sh "${2:-8}" "${3:-200}" "${4:-500}" | grep '^read' | sed "s/^/$round nats-filtered: /"
done
