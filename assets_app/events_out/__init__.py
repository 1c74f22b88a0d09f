"""Events out (issue 29): webhooks and freshness, what the service tells the world.

Owns: `webhooks` (endpoints, subscriptions, secrets, the messages owed to an endpoint, written in
the transaction of what they report), `delivery` (the timers process's delivery timer sends them,
signed, with retries, when they are due; never inside the transactions that wrote them),
`freshness` (is each asset's data arriving when its consumers expect it) and `egress` (the SSRF
guard: which addresses may be called).

Writes: `WebhookEndpoint`, `WebhookSubscription`, `WebhookDelivery`, `WebhookAttempt` and
`FreshnessPolicy` (its late / fresh state). It deletes the endpoints, subscriptions and policies an
operator deletes; old messages and attempts are retention's.

May import: the shared packages only (it is the rightmost layer).
"""
