"""Alert evaluation over the history, alert state and timeline, silences, receivers and the outbox."""
