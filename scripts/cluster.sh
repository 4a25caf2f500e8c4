#!/usr/bin/env bash
# `npm run cluster`: the roles of a cluster as separate processes on one machine, without Docker:
# a gateway (api, topics, webhooks, users), DISPATCHERS dispatchers and a notifier, each its own
# `server.ts` process, over NATS (JetStream) and PostgreSQL that are already running.
#
#   TRANSPORTER=nats://127.0.0.1:4222 DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npm run cluster
#
# The gateway's API is on PORT (3000); the ops endpoints (/health, /metrics) on OPS_PORT (3030)
# for the gateway and the ports after it for the other roles. Each role's log lines are prefixed
# with its name. Ctrl-C (or SIGTERM) stops every role, each draining as it does alone.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${TRANSPORTER:?set TRANSPORTER, e.g. nats://127.0.0.1:4222 (a NATS server started with -js)}"
: "${DATABASE_URL:?set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/postgres}"
export TRANSPORTER DATABASE_URL
export NAMESPACE="${NAMESPACE:-local}"
PORT="${PORT:-3000}"
OPS_PORT="${OPS_PORT:-3030}"
DISPATCHERS="${DISPATCHERS:-2}"
# Links in emails point to the gateway, not to the notifier's own (unused) port.
export PUBLIC_BASE_URL="${PUBLIC_BASE_URL:-http://localhost:$PORT}"

pids=()
stop_all() {
	trap - INT TERM
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait
}
trap stop_all INT TERM

# role name, then the role's variables
start_role() {
	local name=$1
	shift
	# Through process substitution, so that $! is the server process itself, not the prefixer;
	# the prefixer ignores Ctrl-C, so that the roles' shutdown lines still get through.
	env "$@" node --import tsx server.ts > >(trap '' INT TERM; exec sed -u "s/^/[$name] /") 2>&1 &
	pids+=("$!")
}

wait_healthy() {
	local name=$1 port=$2
	for _ in $(seq 1 120); do
		if node -e "fetch('http://127.0.0.1:$port/health').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"; then
			echo "[cluster] $name is up (ops port $port)"
			return 0
		fi
		sleep 0.5
	done
	echo "[cluster] $name did not become healthy on port $port" >&2
	stop_all
	exit 1
}

# The gateway first: in development it generates the shared secrets into DATA_DIR once.
start_role gateway SERVICES=api,topics,webhooks,users NODE_ID="$NAMESPACE-gateway" PORT="$PORT" OPS_PORT="$OPS_PORT"
wait_healthy gateway "$OPS_PORT"
for i in $(seq 1 "$DISPATCHERS"); do
	start_role "dispatcher-$i" SERVICES=dispatcher NODE_ID="$NAMESPACE-dispatcher-$i" PORT=0 OPS_PORT=$((OPS_PORT + i))
done
start_role notifier SERVICES=notifier NODE_ID="$NAMESPACE-notifier" PORT=0 OPS_PORT=$((OPS_PORT + DISPATCHERS + 1))
for i in $(seq 1 "$DISPATCHERS"); do wait_healthy "dispatcher-$i" $((OPS_PORT + i)); done
wait_healthy notifier $((OPS_PORT + DISPATCHERS + 1))
echo "[cluster] all roles are up: API on http://localhost:$PORT/id/v3"
wait
