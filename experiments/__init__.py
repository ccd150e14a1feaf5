"""The application's experiment config schemas (run configs, benchmark configs)."""
