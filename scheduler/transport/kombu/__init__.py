"""Broker transports through kombu: Redis (`redis://`), RabbitMQ (`amqp://`) and Amazon SQS (`sqs://`).

One broker queue per jobq queue, named `<prefix>-<queue>` (`jobq-critical`). kombu serves the
queues of a consumer round-robin, so `consume` never uses kombu's consumers: it polls the queues
itself, highest first, without blocking, and waits (in short polls) only once all are empty.
Receipts are opaque tokens that are valid in the transport that issued them.

What each broker does where brokers disagree:

Unacked deliveries return: Redis after `visibility_timeout_s` (kombu's `unacked` restore, which
consume runs); RabbitMQ when the consumer's channel or connection closes, never by timeout; SQS
after `visibility_timeout_s` rounded up to whole seconds.

`nack(delay_s=0)` requeues at once everywhere (Redis: at the back of the list). With a delay:
Redis moves the delivery's restore time; RabbitMQ has no delayed requeue, so this transport holds
the message unacked and requeues it on the first consume after the delay (a process that dies
first hands it back early, never loses it); SQS changes the message's visibility.

`extend(visibility_s)`: Redis moves the restore time; SQS changes the visibility; RabbitMQ has
nothing to extend, because it returns a message only when the connection is lost (the store's
lease catches a stuck task). With AMQP heartbeats on (`amqp://...?heartbeat=60`), consume and
extend send them, so a worker busy with long tasks must extend at least every half interval.

`delivery_count`: Redis exact (a header counted by jobq's kombu channel, kept through restores);
RabbitMQ 1, or 2 for any redelivery (classic queues only flag it); SQS ApproximateReceiveCount.

`depth`: Redis the list length plus this prefix's unacked entries for the queue (a scan of the
unacked hash); RabbitMQ ready messages plus those this transport holds unacked (other connections'
unacked messages are invisible over AMQP); SQS visible + in flight + delayed, approximate.

`queue_depth` (messages waiting for a consumer, and the oldest one's age): Redis LLEN of the
list and, in the same pipeline, the `x-jobq-published-ms` header that jobq's channel stamps on every
message, read from the message next in line (LINDEX -1; messages published before jobq stamped
them have no age); RabbitMQ the declare-ok's `message_count` of a `queue.declare` with the queue's
own arguments (ready messages only; a passive declare would close the channel when the queue does
not exist yet), no age (AMQP cannot peek); SQS `ApproximateNumberOfMessages`, no age (SQS reports
`ApproximateAgeOfOldestMessage` only to CloudWatch, once a minute).

`close` hands back every delivery not yet acked: kombu restores the Redis channel's unacked
messages, RabbitMQ requeues the connection's, and SQS ones are made visible again.

Delivery is at-least-once on every broker, and the broker is not the truth. A message comes back
after a lost connection; it can also leave the broker unprocessed in two narrow cases: a Redis
consumer killed between kombu's pop of the list and its write of the `unacked` entry (two steps),
and, on Redis and SQS, a late ack from a consumer whose delivery had timed out, which names the
message rather than the delivery and so deletes its redelivery. The store's fences make duplicates
harmless and its reaper re-dispatches a run whose message was lost.

Errors: every redis, py-amqp, botocore and kombu exception leaves as `TransportUnavailable`
(retryable: the broker is unreachable, throttling or failing over) or `TransportError` (a
configuration or permission problem). After a lost connection the call reconnects (bounded by
`connect_retries`) and runs again once; an ack whose channel died with the connection is a no-op,
because the broker has already requeued the message.

Liveness: `health_check(max_silence_s)` is False once no consume has come back from the broker
within `max_silence_s` seconds, while the last broker call failed, or after `close`.

Modules: `transport` (`KombuTransport`: polling, receipts, retries and liveness, common to every
broker), `broker` (the `Broker` each broker module implements, and kombu's own errors), and one
module per broker: `redis`, `amqp`, `sqs`.
"""

from __future__ import annotations

from jobq.transport.kombu.transport import KombuTransport

__all__ = ["KombuTransport"]
