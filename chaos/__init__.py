"""Fault and abuse runs on the real stack (`python -m chaos`, `make chaos`); see docs/reliability.md."""
