#!/usr/bin/env bash
# An HTTP producer with curl: one tasking order status event, posted with a token that may publish
# events.
#   TOKEN=$(npm run -s token -- --sub orders-service --scope events:publish) bash examples/http-producer.sh
# API_URL defaults to http://localhost:3000/id/v3. Prints the 202 answer ({"event_ids":[…]}) once
# the event is stored durably; exits non-zero with the problem answer otherwise.
set -euo pipefail

api="${API_URL:-http://localhost:3000/id/v3}"
: "${TOKEN:?Set TOKEN to a token with the scope events:publish}"
# A UUID of your own makes a repeat harmless: send the same event_id again after a 503 or a timeout.
event_id="$(uuidgen 2>/dev/null || cat /proc/sys/kernel/random/uuid)"

curl -sS --fail-with-body -X POST "$api/events/tasking.order_status" \
	-H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
	-d "{\"event_id\":\"$event_id\",\"user_id\":\"alice\",\"order_id\":\"o-3\",\"status\":\"failed\",\"order_name\":\"Harbour survey\"}"
echo
