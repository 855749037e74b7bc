#!/bin/bash
# Starts a nats-server (JetStream, MQTT, the partition mapping) on free
# loopback ports in a temporary directory, runs the spike against it, and
# stops it. Usage: run.sh [partitions] [vehicles] [fixes per vehicle]
set -euo pipefail
partitions=${1:-8}
dir=$(mktemp -d)
trap '[ -n "${NATS_TRACE:-}" ] && grep -a "KV_LEASES\|STREAM.CREATE" "$dir/server.log" | tail -6; kill $(cat "$dir/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port); mqtt=$(free_port)
cat > "$dir/nats.conf" <<CONF
listen: 127.0.0.1:$port
server_name: spike
jetstream { store_dir: "$dir/js" }
mqtt { listen: 127.0.0.1:$mqtt }
mappings = {
  "fleet.*.telemetry": "in.{{partition($partitions,1)}}.fleet.{{wildcard(1)}}.telemetry"
  "owntracks.*.*": "in.{{partition($partitions,1,2)}}.owntracks.{{wildcard(1)}}.{{wildcard(2)}}"
}
CONF
nats-server -c "$dir/nats.conf" ${NATS_TRACE:+-DV} > "$dir/server.log" 2>&1 &
echo $! > "$dir/pid"
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$mqtt") 2>/dev/null && break; sleep 0.1; done
cd "$(dirname "$0")"
cargo run --release -q -- "127.0.0.1:$port" "$mqtt" "$partitions" "${2:-200}" "${3:-100}"
