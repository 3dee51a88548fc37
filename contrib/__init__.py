"""Integrations around jobq: fence guards for downstream writes (`jobq.contrib.fencing`)."""
