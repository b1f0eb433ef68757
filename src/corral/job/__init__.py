"""The job engine: one job from spec to result (states, supervisor, events, output, summary)."""
