"""An engine member (the worker process): its runtime, the data plane and the Celery handlers of
the commands it receives."""
