"""The operations layer: CLI, HTTP API, webhooks, metrics and retention for every registered durable job."""
