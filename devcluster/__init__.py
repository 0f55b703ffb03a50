"""The local cluster behind ``./run``: bootstrap, embedded services, the cluster runner, the
example jobs and the demo."""
