"""The cluster: active-master election, membership and slots."""
