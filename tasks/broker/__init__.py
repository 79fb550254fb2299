"""Messages: Celery's queues and router, publishing stage messages, the outbox that publishes what
the database accepted, acks that survive a lost broker connection, the embedded Redis, broker
purges.
"""
