"""Benchmarks: ``./run bench [NAME]``. Each prints figures and a ratio measured in the same run."""
