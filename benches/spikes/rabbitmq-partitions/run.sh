#!/bin/bash
# Starts a RabbitMQ node (MQTT and consistent-hash exchange plugins) on
# free loopback ports in a temporary directory, runs the spike against it,
# and stops it. Usage: run.sh [partitions] [vehicles] [fixes per vehicle]
set -euo pipefail
dir=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
amqp=$(free_port); mqtt=$(free_port); dist=$(free_port)
node="spike$$@localhost"
export RABBITMQ_NODENAME=$node RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$amqp RABBITMQ_DIST_PORT=$dist \
  RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log RABBITMQ_CONFIG_FILE=$dir/rabbitmq \
  RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins RABBITMQ_PID_FILE=$dir/pid
chmod 755 "$dir"
echo '[rabbitmq_mqtt,rabbitmq_consistent_hash_exchange].' > "$dir/enabled_plugins"
printf 'mqtt.listeners.tcp.default = 127.0.0.1:%s\nloopback_users = none\n' "$mqtt" > "$dir/rabbitmq.conf"
id rabbitmq >/dev/null 2>&1 && chown -R rabbitmq: "$dir"
trap 'rabbitmqctl -n "$node" stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
rabbitmq-server > "$dir/server.out" 2>&1 &
rabbitmqctl -n "$node" wait "$dir/pid" --timeout 120 > /dev/null
for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$mqtt") 2>/dev/null && break; sleep 0.2; done
cd "$(dirname "$0")"
cargo run --release -q -- "$amqp" "$mqtt" "${1:-8}" "${2:-200}" "${3:-100}"
