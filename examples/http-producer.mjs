// An HTTP producer with Node's fetch (Node 18 or later, no package needed): what a service in any
// language does to report tasking order status changes without a Moleculer broker.
//   TOKEN=$(npm run -s token -- --sub orders-service --scope events:publish) node examples/http-producer.mjs
// API_URL defaults to http://localhost:3000/id/v3. The answer is 202 with the event_ids once the
// events are stored durably; nothing of a refused list is stored, so it can be fixed and sent again.
import { randomUUID } from "node:crypto";

const api = process.env.API_URL ?? "http://localhost:3000/id/v3";
const token = process.env.TOKEN;
if (!token) {
	console.error("Set TOKEN to a token with the scope events:publish (npm run -s token -- --sub orders-service --scope events:publish)");
	process.exit(64);
}

// Up to 100 events in one request. Each has its own UUID event_id, so that sending the same list
// again (after a 503 or a timeout) delivers nothing twice.
const events = [
	{ event_id: randomUUID(), user_id: "alice", order_id: "o-2", status: "in progress", order_name: "Harbour survey" },
	{ event_id: randomUUID(), user_id: "alice", order_id: "o-2", status: "fulfilled", previous_status: "in progress", order_name: "Harbour survey" },
];

for (let attempt = 1; ; attempt++) {
	const response = await fetch(`${api}/events/tasking.order_status`, {
		method: "POST",
		headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
		body: JSON.stringify(events),
	});
	const answer = await response.json();
	if (response.status === 202) {
		console.log(`stored ${answer.event_ids.join(" ")}`);
		break;
	}
	// Busy (429) or not stored now (503): the same events again, after the wait the service asks for.
	if ((response.status === 429 || response.status === 503) && attempt < 5) {
		const seconds = Number(response.headers.get("retry-after") ?? 1);
		console.error(`${response.status} ${answer.detail}; sending again in ${seconds} s`);
		await new Promise(resolve => setTimeout(resolve, seconds * 1000));
		continue;
	}
	console.error(`refused: ${response.status} ${JSON.stringify(answer)}`);
	process.exit(1);
}
