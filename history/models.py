"""Finished-job history and cleanup records (filled in by the jobs and cleanup issues)."""
