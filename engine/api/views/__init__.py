"""API views, one module per resource: thin, they validate and call the engine."""
