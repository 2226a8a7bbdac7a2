"""The controller: registration, liveness, topics, elections, ISR ownership, durable metadata."""
