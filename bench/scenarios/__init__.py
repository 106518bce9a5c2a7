"""One module per scenario of issue 7; each exposes run(ctx) -> dict (its figures, JSON-friendly)."""
