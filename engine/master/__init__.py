"""The master process: the active master's loop and the steps it runs."""
