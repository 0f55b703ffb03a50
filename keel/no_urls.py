"""The URLs of an engine process (engine.process): none. Masters and workers serve no HTTP, and
the checks that Celery's Django fixup runs at a worker's start must not load the web's views."""

urlpatterns: list = []
