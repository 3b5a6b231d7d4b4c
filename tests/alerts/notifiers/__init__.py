"""Tests for the chat notifiers: payloads against each service's documented format, and the wire."""
